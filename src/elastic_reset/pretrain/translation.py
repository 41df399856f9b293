"""The Translation Game's agents (Elastic Reset §4 and Appendix A; Lee et al. 2019), built at CPU scale.

The paper pretrains a FR→EN and an EN→DE Transformer on IWSLT, then plays FR→EN→DE on Multi30k with French and
German only. IWSLT is not available here, so ``elastic-reset build-translation`` splits the 29,000 aligned
Multi30k *train* lines in two disjoint parts by a seeded shuffle (halves by default; ``--pretrain-lines`` sets the
size of the first):

- the **pretraining half** (all three languages): a joint subword vocabulary (``tokenizers`` BPE over fr+en+de),
  the FR→EN *speaker* and the EN→DE *listener* (small pre-LN encoder–decoders, transformers' M2M100
  architecture), and an English LM (a small GPT-2) for the KL-to-an-LM baseline (the paper's LSTM LM on IWSLT
  English, §4);
- the **game half**: FR–DE pairs only (:func:`game_pairs`). Its English is never read by anything.

Both halves come from the same domain, so, unlike the paper's IWSLT agents, ours start in-domain: the paper's
early gain in FR→EN BLEU from adapting to Multi30k (§4, "all learning models initially improve FR→EN") should not
be expected here. Validation is Multi30k ``val`` (1,014 lines), the final test ``test_2016_flickr`` (1,000).

Text is lowercased before anything sees it (Lee et al. and the paper lowercase Multi30k; the paper tokenizes with
Moses first, A.3). The vocabulary's Metaspace pre-tokenizer keeps the spaces in the tokens, so decoding gives
plain text back and BLEU is sacreBLEU's on detokenized, lowercased text (paper A.1: "detokenized sacreBLEU").
Agents are pretrained with label smoothing 0.1 and AdamW (fairseq's IWSLT recipe, A.2), early-stopped on greedy
val BLEU.
"""

from __future__ import annotations

import gzip
import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from elastic_reset.errors import DataFileError
from elastic_reset.io import save_folder_atomically
from elastic_reset.lm.greedy import greedy_translate
from elastic_reset.lm.scoring import label_smoothed_loss, resolve_device, right_pad, seq2seq_nll

LANGS = ("fr", "en", "de")
SPLITS = {"train": "train", "val": "val", "test": "test_2016_flickr"}
PAD, EOS, BOS, UNK = "<pad>", "</s>", "<s>", "<unk>"
AGENTS = ("fr-en", "en-de", "en-lm")
"""The three model folders a build writes (speaker, listener, English LM), each with the shared tokenizer."""


# ------------------------------------------------------------------------------------------------------- data
def load_multi30k(data_dir: str | Path, split: str) -> dict[str, list[str]]:
    """``{lang: lines}`` of one Multi30k split (``train``, ``val``, ``test``), lowercased, aligned line by line.
    Reads ``<data_dir>/multi30k/<file>.<lang>.gz``."""
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {', '.join(SPLITS)}, got {split!r}")
    out = {}
    for lang in LANGS:
        path = Path(data_dir) / "multi30k" / f"{SPLITS[split]}.{lang}.gz"
        if not path.is_file():
            raise DataFileError(f"{path}: missing (expected Multi30k task 1, raw text, one sentence per line; "
                                "see ../shared/data/README.md)")
        with gzip.open(path, "rt", encoding="utf-8") as f:
            out[lang] = [line.strip().lower() for line in f.read().splitlines()]
    lengths = {lang: len(lines) for lang, lines in out.items()}
    if len(set(lengths.values())) != 1:
        raise DataFileError(f"{Path(data_dir) / 'multi30k'}: the {split} files are not aligned (lines per language: "
                            f"{lengths})")
    for lang, lines in out.items():
        empty = [i for i, t in enumerate(lines) if not t]
        if empty:
            raise DataFileError(f"{Path(data_dir) / 'multi30k' / f'{SPLITS[split]}.{lang}.gz'}:{empty[0] + 1}: "
                                f"empty line ({len(empty)} such)")
    return out


def split_train(n_lines: int, seed: int = 0, pretrain_lines: int | None = None) -> tuple[list[int], list[int]]:
    """Line indices of the pretraining part and the game part of Multi30k train: a seeded shuffle cut after
    ``pretrain_lines`` (default: half)."""
    cut = n_lines // 2 if pretrain_lines is None else pretrain_lines
    if not 0 < cut < n_lines:
        raise ValueError(f"pretrain_lines: expected 1 to {n_lines - 1}, got {pretrain_lines}")
    order = list(range(n_lines))
    random.Random(f"multi30k-split-{seed}").shuffle(order)
    return sorted(order[:cut]), sorted(order[cut:])


def pretrain_part(train: dict[str, list[str]], seed: int = 0, pretrain_lines: int | None = None
                  ) -> dict[str, list[str]]:
    """The pretraining part, all three languages."""
    idx, _ = split_train(len(train["fr"]), seed, pretrain_lines)
    return {lang: [lines[i] for i in idx] for lang, lines in train.items()}


def game_pairs(train: dict[str, list[str]], seed: int = 0, pretrain_lines: int | None = None
               ) -> list[tuple[str, str]]:
    """The game part as (French, German) pairs; the English of these lines is dropped here."""
    _, idx = split_train(len(train["fr"]), seed, pretrain_lines)
    return [(train["fr"][i], train["de"][i]) for i in idx]


def bleu(hypotheses: list[str], references: list[str]) -> float:
    """Corpus BLEU (sacreBLEU's defaults: 13a tokenization, ``exp`` smoothing of zero n-gram counts) of detokenized
    text, one reference per hypothesis; 0-100."""
    import sacrebleu

    if len(hypotheses) != len(references):
        raise ValueError(f"bleu: {len(hypotheses)} hypotheses for {len(references)} references")
    return float(sacrebleu.corpus_bleu(hypotheses, [references]).score)


# ---------------------------------------------------------------------------------------------- vocabulary
def train_tokenizer(texts: list[str], vocab_size: int):
    """A joint BPE vocabulary over ``texts`` with sentencepiece-style Metaspace tokens, wrapped for transformers.
    Encoding appends ``</s>`` (the encoder input and the labels of a seq2seq model both end with it)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD, EOS, BOS, UNK]))
    tok.post_processor = processors.TemplateProcessing(single=f"$A {EOS}", pair=f"$A {EOS} $B {EOS}",
                                                       special_tokens=[(EOS, tok.token_to_id(EOS))])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS, bos_token=BOS,
                                   unk_token=UNK, padding_side="right", model_max_length=128)


# ------------------------------------------------------------------------------------------------- models
@dataclass
class AgentConfig:
    """Sizes and pretraining of the Translation Game's models (paper A.2 uses fairseq's 6-layer ``iwslt-de-en``
    Transformer; this is that shape shrunk for 2 CPU cores)."""

    vocab_size: int = 4000
    """Joint BPE vocabulary size, special tokens included (8000 made a training step 1.8x as slow: the output
    layer dominated)."""
    d_model: int = 256
    """Width of every model."""
    layers: int = 2
    """Encoder layers and decoder layers of each translator; the English LM has ``2 × layers`` decoder layers."""
    heads: int = 4
    """Attention heads."""
    ffn: int = 512
    """Feed-forward width."""
    dropout: float = 0.1
    """Dropout while pretraining (the RL engine runs the models in eval mode: no dropout)."""
    label_smoothing: float = 0.1
    """Label smoothing of the pretraining cross-entropy (fairseq's IWSLT recipe)."""
    batch_size: int = 64
    """Sentence pairs per optimizer step."""
    lr: float = 2e-3
    """Peak AdamW learning rate (linear warm-up over ``warmup`` steps, then inverse square root decay)."""
    warmup: int = 200
    """Warm-up steps."""
    max_epochs: int = 10
    """At most this many passes over the pretraining half (one pass of a translator: ~100 s on 2 AVX2 cores, 227
    steps of 64 pairs, compute-bound at ~80 GFLOP/s)."""
    patience: int = 2
    """Stop after this many epochs without a better validation score (BLEU; the LM: perplexity)."""
    max_tokens: int = 64
    """Tokens kept per sentence (Multi30k sentences average ~17 tokens; almost none are longer)."""
    seed: int = 0
    """Seeds the weights and the batch order (the train split has its own fixed seed, :func:`split_train`)."""
    pretrain_lines: int | None = None
    """Lines of Multi30k train the agents are pretrained on (default: half, 14,500); the game is played on the
    rest. Recorded in ``build_metrics.json``, where the task reads it back."""


def build_translator(config: AgentConfig, tokenizer):
    """A pre-LayerNorm encoder-decoder Transformer (transformers' M2M100 architecture, sinusoidal positions, tied
    embeddings). Pre-LN, not Marian's post-LN: measured over one epoch of the pretraining half, val NLL 4.26 at lr
    2e-3 against 5.47 for Marian at 1e-3 (and Marian did worse at 1.5e-3), so it learns in the epochs a CPU has."""
    from transformers import M2M100Config, M2M100ForConditionalGeneration

    torch.manual_seed(config.seed)
    return M2M100ForConditionalGeneration(M2M100Config(
        vocab_size=len(tokenizer), d_model=config.d_model, encoder_layers=config.layers,
        decoder_layers=config.layers, encoder_attention_heads=config.heads, decoder_attention_heads=config.heads,
        encoder_ffn_dim=config.ffn, decoder_ffn_dim=config.ffn, max_position_embeddings=2 * config.max_tokens,
        dropout=config.dropout, attention_dropout=0.0, activation_dropout=0.0, encoder_layerdrop=0.0,
        decoder_layerdrop=0.0, scale_embedding=True, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id, decoder_start_token_id=tokenizer.bos_token_id,
        forced_eos_token_id=None))


def build_english_lm(config: AgentConfig, tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(config.seed)
    return GPT2LMHeadModel(GPT2Config(
        vocab_size=len(tokenizer), n_positions=2 * config.max_tokens, n_embd=config.d_model,
        n_layer=2 * config.layers, n_head=config.heads, n_inner=config.ffn, resid_pdrop=config.dropout,
        embd_pdrop=config.dropout, attn_pdrop=0.0, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id))


def _inverse_sqrt(step: int, warmup: int) -> float:
    step = max(step, 1)
    return min(step / warmup, math.sqrt(warmup / step))


def length_batches(lengths: list[int], batch_size: int, seed: int) -> list[list[int]]:
    """Batches of indices of similar length, in a seeded random order (less padding: each step is cheaper, and a
    translator's step is compute-bound on 2 cores). Shuffled, sorted by length within windows of 50 batches, cut."""
    order = list(range(len(lengths)))
    rng = random.Random(seed)
    rng.shuffle(order)
    window = 50 * batch_size
    batches = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start:start + window], key=lambda i: lengths[i])
        batches.extend(chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size))
    rng.shuffle(batches)
    return batches


def _train(model, batches_of_epoch, score_val, config: AgentConfig, name: str, log, higher_is_better: bool):
    """Epochs of ``batches_of_epoch(epoch) -> iterable of loss closures`` with early stopping on ``score_val``;
    returns (best score, epochs run) and leaves the best weights in ``model``."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.98), weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _inverse_sqrt(s + 1, config.warmup))
    best, best_state, stale, t0 = None, None, 0, time.perf_counter()
    for epoch in range(config.max_epochs):
        model.train()
        losses = []
        for loss_fn in batches_of_epoch(epoch):
            loss = loss_fn()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
        model.eval()
        score = score_val()
        improved = best is None or (score > best if higher_is_better else score < best)
        log(f"build-translation: {name} epoch {epoch + 1}: train loss {sum(losses) / len(losses):.3f}, val "
            f"{'BLEU' if higher_is_better else 'perplexity'} {score:.2f}{' (best)' if improved else ''} "
            f"({time.perf_counter() - t0:.0f} s)")
        if improved:
            best, stale = score, 0
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        else:
            stale += 1
            if stale >= config.patience:
                break
    model.load_state_dict(best_state)
    model.eval()
    return best, epoch + 1


def _smoothed_nll(model, tokenizer, sources, targets, config: AgentConfig) -> torch.Tensor:
    nll, mask, logits = seq2seq_nll(model, tokenizer, sources, targets, max_tokens=config.max_tokens,
                                    return_logits=True)
    return label_smoothed_loss(nll, mask, logits, config.label_smoothing)


def pretrain_translator(sources: list[str], targets: list[str], val_sources: list[str], val_targets: list[str],
                        tokenizer, config: AgentConfig, name: str, log=print, device: str = "cpu"):
    """A translator trained on (source, target) pairs, early-stopped on greedy val BLEU. Returns (model, info)."""
    model = build_translator(config, tokenizer).to(device)
    lengths = [len(ids) for ids in tokenizer(targets)["input_ids"]]

    def batches(epoch: int):
        for idx in length_batches(lengths, config.batch_size, config.seed * 1000 + epoch):
            yield lambda idx=idx: _smoothed_nll(model, tokenizer, [sources[i] for i in idx],
                                                [targets[i] for i in idx], config)

    def val_bleu() -> float:
        return bleu(greedy_translate(model, tokenizer, val_sources), val_targets)

    t0 = time.perf_counter()
    score, epochs = _train(model, batches, val_bleu, config, name, log, higher_is_better=True)
    return model, {"val_bleu": score, "epochs": epochs, "seconds": time.perf_counter() - t0,
                   "parameters": sum(p.numel() for p in model.parameters())}


def lm_nll(model, tokenizer, texts: list[str], max_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token NLL ``[B, T]`` of the English LM on ``<s> text </s>`` and the mask of scored tokens: the same
    conditioning (on ``<s>`` alone) as the KL penalty's scoring of a message."""
    ids = [[tokenizer.bos_token_id] + row[:max_tokens] for row in tokenizer(texts)["input_ids"]]  # row ends in </s>
    batch, mask = (t.to(model.device) for t in right_pad(ids, tokenizer.pad_token_id))
    logits = model(input_ids=batch, attention_mask=mask).logits[:, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch[:, 1:], reduction="none")
    scored = mask[:, 1:].float()
    return nll * scored, scored


def pretrain_english_lm(texts: list[str], val_texts: list[str], tokenizer, config: AgentConfig, log=print,
                        device: str = "cpu"):
    """The English LM of the KL baseline, early-stopped on val perplexity. Returns (model, info)."""
    model = build_english_lm(config, tokenizer).to(device)
    lengths = [len(ids) for ids in tokenizer(texts)["input_ids"]]

    def batches(epoch: int):
        for idx in length_batches(lengths, config.batch_size, config.seed * 1000 + epoch):
            chunk = [texts[i] for i in idx]

            def loss(chunk=chunk):
                nll, scored = lm_nll(model, tokenizer, chunk, config.max_tokens)
                return nll.sum() / scored.sum()
            yield loss

    @torch.no_grad()
    def val_perplexity() -> float:
        total, count = 0.0, 0.0
        for start in range(0, len(val_texts), 256):
            nll, scored = lm_nll(model, tokenizer, val_texts[start:start + 256], config.max_tokens)
            total, count = total + float(nll.sum()), count + float(scored.sum())
        return math.exp(total / count)

    t0 = time.perf_counter()
    score, epochs = _train(model, batches, val_perplexity, config, "en-lm", log, higher_is_better=False)
    return model, {"val_perplexity": score, "epochs": epochs, "seconds": time.perf_counter() - t0,
                   "parameters": sum(p.numel() for p in model.parameters())}


def pretrained_scores(speaker, listener, tokenizer, split: dict[str, list[str]]) -> dict[str, float]:
    """The PRETRAINED row of the paper's Table 1 on one split: drift = FR→EN BLEU against the true English, task =
    FR→EN→DE BLEU (the listener translating the speaker's greedy English) against the true German."""
    english = greedy_translate(speaker, tokenizer, split["fr"])
    german = greedy_translate(listener, tokenizer, english)
    return {"drift_bleu": bleu(english, split["en"]), "task_bleu": bleu(german, split["de"]),
            "en_de_bleu": bleu(greedy_translate(listener, tokenizer, split["en"]), split["de"])}


def build_agents(data_dir: str | Path, out: str | Path, config: AgentConfig, *, limit: int | None = None,
                 log=print, device: str = "cpu") -> dict:
    """Everything ``elastic-reset build-translation`` writes into ``out`` (atomically, as one folder):
    ``fr-en/``, ``en-de/``, ``en-lm/`` (each a Hugging Face folder with the shared tokenizer) and
    ``build_metrics.json``. ``limit`` caps the pretraining pairs and validation lines (for tests). ``device``:
    where to train (``auto``: CUDA when present); the folder holds the weights the same way either way."""
    device = resolve_device(device, "--device")
    t_start = time.perf_counter()
    part = pretrain_part(load_multi30k(data_dir, "train"), pretrain_lines=config.pretrain_lines)
    val, test = load_multi30k(data_dir, "val"), load_multi30k(data_dir, "test")
    if limit is not None:
        part = {lang: lines[:limit] for lang, lines in part.items()}
        val = {lang: lines[:limit] for lang, lines in val.items()}
        test = {lang: lines[:limit] for lang, lines in test.items()}
    tokenizer = train_tokenizer(part["fr"] + part["en"] + part["de"], config.vocab_size)
    log(f"build-translation: joint vocabulary of {len(tokenizer)} tokens on {len(part['fr']):,} pretraining lines "
        f"x 3 languages")
    speaker, speaker_info = pretrain_translator(part["fr"], part["en"], val["fr"], val["en"], tokenizer, config,
                                                "fr-en", log, device)
    listener, listener_info = pretrain_translator(part["en"], part["de"], val["en"], val["de"], tokenizer, config,
                                                  "en-de", log, device)
    lm, lm_info = pretrain_english_lm(part["en"], val["en"], tokenizer, config, log, device)
    metrics = {
        "agents": {"fr-en": speaker_info, "en-de": listener_info, "en-lm": lm_info},
        "pretrained": {"val": pretrained_scores(speaker, listener, tokenizer, val),
                       "test": pretrained_scores(speaker, listener, tokenizer, test)},
        "pretrain_lines": len(part["fr"]), "split": {"seed": 0, "pretrain_lines": config.pretrain_lines},
        "build_seconds": time.perf_counter() - t_start, "config": asdict(config),
        "torch_threads": torch.get_num_threads(), "device": str(device),
    }
    log("build-translation: PRETRAINED " + ", ".join(f"{split} task {s['task_bleu']:.1f} / drift {s['drift_bleu']:.1f}"
                                                     for split, s in metrics["pretrained"].items()))

    def write(tmp: Path) -> None:
        for name, model in zip(AGENTS, (speaker, listener, lm)):
            model.to("cpu").save_pretrained(tmp / name)
            tokenizer.save_pretrained(tmp / name)
        (tmp / "build_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")

    save_folder_atomically(Path(out), write)
    return metrics
