"""The Translation Game's agents (Elastic Reset §4 and Appendix A; Lee et al. 2019), built at CPU scale.

The paper pretrains a FR→EN and an EN→DE Transformer on IWSLT (TED talks), then plays FR→EN→DE on Multi30k (image
captions) with French and German only. ``elastic-reset build translation-agents`` does the same out of domain with
the text that can be had offline (``--corpus tatoeba``, the default): Tatoeba's fr-en and en-de pairs
(``translation-pretrain/``: short everyday sentences, none in Multi30k), early-stopped on Tatoeba's dev pairs as the
paper's on IWSLT's; the whole of Multi30k train is then the game's (``--pretrain-lines N`` adds a stated share of
it to the pretraining; ``--adapt DIR --pretrain-lines N`` instead continues a Tatoeba-only build on that share,
:func:`adapt_agents`). Of the paper's task gain, most (+7.0 of REINFORCE's +9.4 BLEU) is this domain adaptation,
which FROZEN ENGLISH already reaches.

``--corpus multi30k`` is the earlier in-domain set-up: the 29,000 aligned Multi30k *train* lines cut in two disjoint
parts by a seeded shuffle (halves by default), the first for pretraining (all three languages), the second the
game's (FR–DE pairs only, :func:`~elastic_reset.data.translation.game_pairs`: its English is never read); the
agents early-stop on Multi30k val. The data and its split: :mod:`elastic_reset.data.translation`.

Either way: a joint subword vocabulary (``tokenizers`` BPE over the pretraining fr+en+de), the FR→EN *speaker* and
the EN→DE *listener* (small pre-LN encoder–decoders, transformers' M2M100 architecture), and an English LM (a small
GPT-2) on the pretraining English for the KL-to-an-LM baseline (the paper's LSTM LM on IWSLT English, §4). The
PRETRAINED row is measured on all of Multi30k val (1,014 lines) and ``test_2016_flickr`` (1,000).

Text is lowercased before anything sees it (Lee et al. and the paper lowercase Multi30k; the paper tokenizes with
Moses first, A.3). The vocabulary's Metaspace pre-tokenizer keeps the spaces in the tokens, so decoding gives
plain text back and BLEU is sacreBLEU's on detokenized, lowercased text (paper A.1: "detokenized sacreBLEU").
Agents are pretrained with label smoothing 0.1 and AdamW (fairseq's IWSLT recipe, A.2), early-stopped on greedy
validation BLEU.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from elastic_reset.data.translation import load_multi30k, pretrain_part, pretraining_dev, pretraining_text
from elastic_reset.errors import ConfigError, RunFileError
from elastic_reset.io import atomic_write, atomic_write_text, open_regular, save_folder_atomically
from elastic_reset.lm.batching import length_grouped_batches
from elastic_reset.lm.device import resolve_device, rng_state, set_rng_state
from elastic_reset.lm.greedy import greedy_translate
from elastic_reset.lm.scoring import label_smoothed_loss, sequence_nll, token_nll

PAD, EOS, BOS, UNK = "<pad>", "</s>", "<s>", "<unk>"
AGENTS = ("fr-en", "en-de", "en-lm")
"""The three model folders a build writes (speaker, listener, English LM), each with the shared tokenizer."""


# ------------------------------------------------------------------------------------------------------- BLEU
def bleu_score(hypotheses: list[str], references: list[str]):
    """sacreBLEU's corpus BLEU (its defaults: 13a tokenization, ``exp`` smoothing of zero n-gram counts) of
    detokenized text, one reference per hypothesis: the score (0-100) with its brevity penalty and lengths."""
    import sacrebleu

    if len(hypotheses) != len(references):
        raise ValueError(f"bleu: {len(hypotheses)} hypotheses for {len(references)} references")
    return sacrebleu.corpus_bleu(hypotheses, [references])


def bleu(hypotheses: list[str], references: list[str]) -> float:
    """Corpus BLEU, 0-100 (:func:`bleu_score`)."""
    return float(bleu_score(hypotheses, references).score)


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
    """Joint BPE vocabulary size, special tokens included (a larger one slows every step: the output layer dominates;
    see BENCHMARKS.md)."""
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
    """At most this many passes over the pretraining half."""
    patience: int = 2
    """Stop after this many epochs without a better validation score (BLEU; the LM: perplexity)."""
    max_tokens: int = 64
    """Tokens kept per sentence (almost no Multi30k sentence is longer)."""
    seed: int = 0
    """Seeds the weights and the batch order (the train split has its own fixed seed,
    :func:`~elastic_reset.data.translation.split_train`)."""
    corpus: str = "tatoeba"
    """``tatoeba``: pretrain out of domain on ``translation-pretrain/`` and early-stop on its dev pairs (the paper's
    set-up, IWSLT there); ``multi30k``: pretrain on a part of Multi30k train, early-stop on Multi30k val."""
    pretrain_lines: int | None = None
    """Lines of Multi30k train the agents are also (``tatoeba``: default 0) or only (``multi30k``: default half,
    14,500) pretrained on; the game is played on the rest. Recorded in ``build_metrics.json``, where the task reads
    it back."""

    def multi30k_lines(self, n_train: int) -> int:
        """The lines of Multi30k train in the pretraining, this corpus's default resolved."""
        if self.pretrain_lines is not None:
            return self.pretrain_lines
        return 0 if self.corpus == "tatoeba" else n_train // 2


def build_translator(config: AgentConfig, tokenizer):
    """A pre-LayerNorm encoder-decoder Transformer (transformers' M2M100 architecture, sinusoidal positions, tied
    embeddings). Pre-LN, not Marian's post-LN: it learns more in the epochs a CPU has (see BENCHMARKS.md)."""
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


def _read_checkpoint(path: Path) -> dict:
    """An agent's checkpoint: tensors and plain data only (``weights_only``), as the RL engine's."""
    with open_regular(path) as f:
        try:
            return torch.load(f, map_location="cpu", weights_only=True)
        except Exception as err:
            raise RunFileError(f"{path}: not a checkpoint this build wrote, or a damaged one "
                               f"({type(err).__name__}); delete it to train this agent from its start") from None


def _optimizer(model, lr: float) -> torch.optim.AdamW:
    """fairseq's IWSLT AdamW (β2 0.98, weight decay 1e-4)."""
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=1e-4)


def _epoch(model, loss_fns, optimizer, schedule) -> float:
    """One pass of optimizer steps over ``loss_fns`` (clipped at norm 1); the mean loss. Leaves ``model`` in eval
    mode."""
    model.train()
    losses = []
    for loss_fn in loss_fns:
        loss = loss_fn()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    model.eval()
    return sum(losses) / len(losses)


def _train(model, batches_of_epoch, score_val, config: AgentConfig, name: str, log, higher_is_better: bool,
           checkpoint: Path | None = None):
    """Epochs of ``batches_of_epoch(epoch) -> iterable of loss closures`` with early stopping on ``score_val``;
    returns (best score, epochs run, seconds) and leaves the best weights in ``model``. With ``checkpoint``, the
    state after every epoch (weights, optimizer, schedule, RNG, early-stopping counters) is written there
    atomically, and a file already there is continued from: the resumed build trains what the uninterrupted one
    would have."""
    device = next(model.parameters()).device
    optimizer = _optimizer(model, config.lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _inverse_sqrt(s + 1, config.warmup))
    state = {"epoch": 0, "best": None, "best_state": None, "stale": 0, "seconds": 0.0, "done": False}
    if checkpoint is not None and checkpoint.exists():
        state = _read_checkpoint(checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        set_rng_state(state["rng"], device)
        log(f"build translation-agents: {name} resumed after epoch {state['epoch']}"
            + (" (finished)" if state["done"] else ""))
    t0 = time.perf_counter() - state["seconds"]
    while not state["done"]:
        epoch = state["epoch"]
        loss = _epoch(model, batches_of_epoch(epoch), optimizer, schedule)
        score = score_val()
        best = state["best"]
        improved = best is None or (score > best if higher_is_better else score < best)
        log(f"build translation-agents: {name} epoch {epoch + 1}: train loss {loss:.3f}, val "
            f"{'BLEU' if higher_is_better else 'perplexity'} {score:.2f}{' (best)' if improved else ''} "
            f"({time.perf_counter() - t0:.0f} s)")
        if improved:
            state.update(best=score, stale=0,
                         best_state={k: v.detach().clone() for k, v in model.state_dict().items()})
        else:
            state["stale"] += 1
        state["epoch"] = epoch + 1
        state["done"] = state["epoch"] >= config.max_epochs or state["stale"] >= config.patience
        state["seconds"] = time.perf_counter() - t0
        if checkpoint is not None:
            state.update(model=model.state_dict(), optimizer=optimizer.state_dict(),
                         schedule=schedule.state_dict(), rng=rng_state(device))
            atomic_write(checkpoint, lambda f: torch.save(state, f))
    model.load_state_dict(state["best_state"])
    model.eval()
    return state["best"], state["epoch"], state["seconds"]


def _smoothed_nll(model, tokenizer, sources, targets, config: AgentConfig) -> torch.Tensor:
    nll, mask, logits = token_nll(model, tokenizer, list(zip(sources, targets)), max_tokens=config.max_tokens,
                                  return_logits=True)
    return label_smoothed_loss(nll, mask, logits, config.label_smoothing)


def _translator_batches(model, tokenizer, sources: list[str], targets: list[str], config: AgentConfig):
    """``batches(epoch)``: the label-smoothed loss closures of one epoch over (source, target) pairs of similar
    length, in a seeded order."""
    lengths = [len(ids) for ids in tokenizer(targets)["input_ids"]]

    def batches(epoch: int):
        for idx in length_grouped_batches(lengths, config.batch_size, config.seed * 1000 + epoch):
            yield lambda idx=idx: _smoothed_nll(model, tokenizer, [sources[i] for i in idx],
                                                [targets[i] for i in idx], config)
    return batches


_LM_SCORING = {"prepend_bos": True}
"""<s> text </s>: the LM is conditioned on <s> alone, as the KL penalty scores a message."""


def _lm_batches(model, tokenizer, texts: list[str], config: AgentConfig):
    """``batches(epoch)``: the English LM's per-token NLL closures of one epoch, as :func:`_translator_batches`."""
    lengths = [len(ids) for ids in tokenizer(texts)["input_ids"]]

    def batches(epoch: int):
        for idx in length_grouped_batches(lengths, config.batch_size, config.seed * 1000 + epoch):
            chunk = [texts[i] for i in idx]

            def loss(chunk=chunk):
                nll, scored = token_nll(model, tokenizer, chunk, max_tokens=config.max_tokens, **_LM_SCORING)
                return nll.sum() / scored.sum()
            yield loss
    return batches


def pretrain_translator(sources: list[str], targets: list[str], val_sources: list[str], val_targets: list[str],
                        tokenizer, config: AgentConfig, name: str, log=print, device: str = "cpu",
                        checkpoint: Path | None = None):
    """A translator trained on (source, target) pairs, early-stopped on greedy val BLEU (``checkpoint``: see
    :func:`_train`). Returns (model, info)."""
    model = build_translator(config, tokenizer).to(device)
    batches = _translator_batches(model, tokenizer, sources, targets, config)

    def val_bleu() -> float:
        return bleu(greedy_translate(model, tokenizer, val_sources), val_targets)

    score, epochs, seconds = _train(model, batches, val_bleu, config, name, log, higher_is_better=True,
                                    checkpoint=checkpoint)
    return model, {"val_bleu": score, "epochs": epochs, "seconds": seconds,
                   "parameters": sum(p.numel() for p in model.parameters())}


def pretrain_english_lm(texts: list[str], val_texts: list[str], tokenizer, config: AgentConfig, log=print,
                        device: str = "cpu", checkpoint: Path | None = None):
    """The English LM of the KL baseline, early-stopped on val perplexity (``checkpoint``: see :func:`_train`).
    Returns (model, info)."""
    model = build_english_lm(config, tokenizer).to(device)
    batches = _lm_batches(model, tokenizer, texts, config)

    @torch.no_grad()
    def val_perplexity() -> float:
        nll, tokens = sequence_nll(model, tokenizer, val_texts, batch_size=256, **_LM_SCORING,
                                   max_tokens=config.max_tokens)
        return math.exp(float(nll.double().sum()) / int(tokens.sum()))

    score, epochs, seconds = _train(model, batches, val_perplexity, config, "en-lm", log, higher_is_better=False,
                                    checkpoint=checkpoint)
    return model, {"val_perplexity": score, "epochs": epochs, "seconds": seconds,
                   "parameters": sum(p.numel() for p in model.parameters())}


def pretrained_scores(speaker, listener, tokenizer, split: dict[str, list[str]]) -> dict[str, float]:
    """The PRETRAINED row of the paper's Table 1 on one split: drift = FR→EN BLEU against the true English, task =
    FR→EN→DE BLEU (the listener translating the speaker's greedy English) against the true German."""
    english = greedy_translate(speaker, tokenizer, split["fr"])
    german = greedy_translate(listener, tokenizer, english)
    return {"drift_bleu": bleu(english, split["en"]), "task_bleu": bleu(german, split["de"]),
            "en_de_bleu": bleu(greedy_translate(listener, tokenizer, split["en"]), split["de"])}


def _held_out_splits(data_dir: str | Path, limit: int | None = None) -> dict[str, dict[str, list[str]]]:
    """Multi30k val and test, where the PRETRAINED row is scored (``limit``: their first lines, for tests)."""
    return {split: {lang: lines[:limit] for lang, lines in load_multi30k(data_dir, split).items()}
            for split in ("val", "test")}


def _pretrained_rows(speaker, listener, tokenizer, splits: dict, log, what: str = "") -> dict[str, dict[str, float]]:
    """:func:`pretrained_scores` on each of ``splits``, logged."""
    rows = {name: pretrained_scores(speaker, listener, tokenizer, split) for name, split in splits.items()}
    log(f"build translation-agents: PRETRAINED{what} " + ", ".join(
        f"{name} task {s['task_bleu']:.1f} / drift {s['drift_bleu']:.1f}" for name, s in rows.items()))
    return rows


def _write_agents(out: Path, models, tokenizer, metrics: dict) -> None:
    """The three agents (as :data:`AGENTS`), each with the shared tokenizer, and ``build_metrics.json``: one folder,
    swapped in whole."""
    def write(tmp: Path) -> None:
        for name, model in zip(AGENTS, models):
            model.to("cpu").save_pretrained(tmp / name)
            tokenizer.save_pretrained(tmp / name)
        (tmp / "build_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")

    save_folder_atomically(out, write)


def _checkpoints_folder(out: Path, settings: dict, resume: bool) -> Path:
    """``<out>.checkpoints/``, where an unfinished build keeps its vocabulary and agents, with the settings it was
    started with (``build.json``): a new build finds none there, a resumed one the same settings."""
    work = out.parent / f"{out.name}.checkpoints"
    record = work / "build.json"
    if work.exists() and not resume:
        raise FileExistsError(f"{work}: an unfinished build is there; continue it with --resume (or delete it)")
    if record.exists():
        # Every setting, as JSON reads it back (tuples become lists), the limit among them.
        then, now = ({**x.get("config", {}), "limit": x.get("limit")}
                     for x in (json.loads(record.read_text()), json.loads(json.dumps(settings))))
        for key, value in now.items():
            if then.get(key) != value:
                raise ConfigError(f"{key}: the unfinished build in {work} was started with {then.get(key)!r}, not "
                                  f"{value!r}; resume it with its own settings, or delete it")
    else:
        work.mkdir(parents=True, exist_ok=True)
        atomic_write_text(record, json.dumps(settings, indent=2) + "\n")
    return work


def _shared_tokenizer(path: Path, texts: list[str], vocab_size: int):
    """The joint vocabulary, trained once and kept at ``path``: a fresh build and a resumed one read the same file."""
    from transformers import PreTrainedTokenizerFast

    if not path.exists():
        tokenizer = train_tokenizer(texts, vocab_size)
        save_folder_atomically(path, tokenizer.save_pretrained)
    return PreTrainedTokenizerFast.from_pretrained(path)


def _pretrain_in_a_process(name: str, data: tuple, tokenizer_path: Path, config: AgentConfig, device: str,
                           checkpoint: Path, threads: int) -> None:
    """One agent of :func:`build_agents`'s side-by-side build, in a process of its own: trained to its finished
    checkpoint, from which the build then reads it."""
    from transformers import PreTrainedTokenizerFast

    torch.set_num_threads(threads)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_path)
    if name == "en-lm":
        pretrain_english_lm(*data, tokenizer, config, print, device, checkpoint)
    else:
        pretrain_translator(*data, tokenizer, config, name, print, device, checkpoint)


def build_agents(data_dir: str | Path, out: str | Path, config: AgentConfig, *, limit: int | None = None,
                 log=print, device: str = "cpu", resume: bool = False, jobs: int = 1) -> dict:
    """Everything ``elastic-reset build translation-agents`` writes into ``out`` (atomically, as one folder):
    ``fr-en/``, ``en-de/``, ``en-lm/`` (each a Hugging Face folder with the shared tokenizer) and
    ``build_metrics.json``. ``limit`` caps the pretraining pairs and the dev, val and test lines (for tests).
    ``device``: where to train (``auto``: CUDA when present); the folder holds the weights the same way either
    way. Until the build finishes, the vocabulary and each agent's state after every epoch are kept in
    ``<out>.checkpoints/``; ``resume`` continues from there (the same settings required), else a folder left there
    is refused. ``jobs`` > 1 trains the three side by side, each in a process of its own (seeded alike, they are the
    agents trained in turn), the torch threads shared among them."""
    if jobs < 1:
        raise ConfigError(f"--jobs: expected a number of processes of at least 1, got {jobs}")
    device = resolve_device(device, "--device")
    out = Path(out)
    work = _checkpoints_folder(out, {"config": asdict(config), "limit": limit}, resume)
    t_start = time.perf_counter()
    train = load_multi30k(data_dir, "train")
    multi30k_lines = config.multi30k_lines(len(train["fr"]))
    text = pretraining_text(data_dir, config.corpus, train, multi30k_lines)
    text["dev"] = pretraining_dev(data_dir, config.corpus)
    held_out = _held_out_splits(data_dir, limit)
    if limit is not None:
        cut = lambda x: tuple(side[:limit] for side in x) if isinstance(x, tuple) else x[:limit]  # noqa: E731
        text = {k: ({d: cut(v) for d, v in x.items()} if k == "dev" else cut(x)) for k, x in text.items()}
    (fr, en), (en2, de) = text["fr-en"], text["en-de"]
    tokenizer = _shared_tokenizer(work / "tokenizer", fr + en + en2 + de, config.vocab_size)
    log(f"build translation-agents: joint vocabulary of {len(tokenizer)} tokens on {config.corpus} "
        f"({len(fr):,} fr-en and {len(en2):,} en-de pairs, {multi30k_lines:,} of them "
        "Multi30k lines)")
    dev = text["dev"]
    set_up = time.perf_counter() - t_start
    parts = {"fr-en": (fr, en, *dev["fr-en"]), "en-de": (en2, de, *dev["en-de"]), "en-lm": (text["en"], dev["en"])}
    side_by_side = None
    if jobs > 1:
        # Each process leaves its agent finished in its checkpoint; the calls below then read, not train, them.
        from concurrent.futures import ProcessPoolExecutor

        t_side = time.perf_counter()
        workers = min(jobs, len(parts))
        threads = max(1, torch.get_num_threads() // workers)
        with ProcessPoolExecutor(workers, mp_context=torch.multiprocessing.get_context("spawn")) as pool:
            for done in [pool.submit(_pretrain_in_a_process, name, data, work / "tokenizer", config, str(device),
                                     work / f"{name}.pt", threads) for name, data in parts.items()]:
                done.result()
        side_by_side = time.perf_counter() - t_side
    speaker, speaker_info = pretrain_translator(*parts["fr-en"], tokenizer, config, "fr-en", log, device,
                                                checkpoint=work / "fr-en.pt")
    listener, listener_info = pretrain_translator(*parts["en-de"], tokenizer, config, "en-de", log, device,
                                                  checkpoint=work / "en-de.pt")
    lm, lm_info = pretrain_english_lm(*parts["en-lm"], tokenizer, config, log, device, checkpoint=work / "en-lm.pt")
    t_scoring = time.perf_counter()
    pretrained = _pretrained_rows(speaker, listener, tokenizer, held_out, log)
    agents = {"fr-en": speaker_info, "en-de": listener_info, "en-lm": lm_info}
    metrics = {
        "agents": agents, "pretrained": pretrained,
        "corpus": config.corpus, "pretrain_pairs": {"fr-en": len(fr), "en-de": len(en2), "en": len(text["en"])},
        "split": {"seed": 0, "pretrain_lines": multi30k_lines},
        # A resumed build: each agent's training over every process, plus this process's set-up and scoring; side
        # by side: the wall time of the three.
        "build_seconds": set_up + (side_by_side if side_by_side is not None
                                   else sum(info["seconds"] for info in agents.values()))
        + time.perf_counter() - t_scoring,
        "config": asdict(config), "torch_threads": torch.get_num_threads(), "device": str(device), "jobs": jobs,
    }
    _write_agents(out, (speaker, listener, lm), tokenizer, metrics)
    shutil.rmtree(work)
    return metrics


@dataclass
class AdaptConfig:
    """Continued pretraining of agents built on Tatoeba alone on a stated share of Multi30k train (their
    PRETRAINED row is a quarter of the paper's). Minutes, where a rebuild with the share mixed into the Tatoeba pairs
    takes over an hour, and the share is not drowned by 165k Tatoeba pairs."""

    lines: int
    """Lines of Multi30k train adapted on: the pretraining part of the seeded split, as ``--pretrain-lines``; the
    game is played on the rest."""
    epochs: int = 3
    """Passes over the share. No early stopping: Multi30k val scores the game, and Tatoeba's dev the other domain."""
    lr: float = 3e-4
    """Constant AdamW learning rate: about where the pretraining's schedule ended (2e-3 · √(200 / ~10k steps))."""


def adapt_agents(data_dir: str | Path, source: str | Path, out: str | Path, adapt: AdaptConfig, *,
                 limit: int | None = None, log=print, device: str = "cpu") -> dict:
    """The agents in ``source`` (a Tatoeba-only build) trained further on ``adapt.lines`` lines of Multi30k train,
    written to ``out`` as :func:`build_agents` writes (``build_metrics.json`` records the share, so the game
    plays on the other lines, and the scores before). ``limit`` caps the val and test lines (for tests)."""
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, PreTrainedTokenizerFast

    device = resolve_device(device, "--device")
    source, out = Path(source), Path(out)
    built = json.loads((source / "build_metrics.json").read_text())
    if built.get("corpus") != "tatoeba" or built.get("split", {}).get("pretrain_lines") != 0:
        raise ConfigError(f"--adapt: {source} holds agents built on {built.get('corpus', 'multi30k')} with "
                          f"{built.get('split', {}).get('pretrain_lines')} Multi30k lines; expected a build on "
                          "tatoeba alone (--pretrain-lines 0)")
    config = AgentConfig(**built["config"])
    t0 = time.perf_counter()
    train = load_multi30k(data_dir, "train")
    share = pretrain_part(train, pretrain_lines=adapt.lines)
    held_out = _held_out_splits(data_dir, limit)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(source / "fr-en")
    speaker, listener = (AutoModelForSeq2SeqLM.from_pretrained(source / name).to(device) for name in AGENTS[:2])
    lm = AutoModelForCausalLM.from_pretrained(source / "en-lm").to(device)
    torch.manual_seed(config.seed)
    losses = {}
    for name, model, batches in (
            ("fr-en", speaker, _translator_batches(speaker, tokenizer, share["fr"], share["en"], config)),
            ("en-de", listener, _translator_batches(listener, tokenizer, share["en"], share["de"], config)),
            ("en-lm", lm, _lm_batches(lm, tokenizer, share["en"], config))):
        optimizer = _optimizer(model, adapt.lr)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        losses[name] = [_epoch(model, batches(epoch), optimizer, schedule) for epoch in range(adapt.epochs)]
        log(f"build translation-agents: {name} adapted on {adapt.lines:,} Multi30k lines, {adapt.epochs} epochs: "
            f"train loss {' → '.join(f'{x:.3f}' for x in losses[name])}")
    pretrained = _pretrained_rows(speaker, listener, tokenizer, held_out, log, " after adapting")
    seconds = time.perf_counter() - t0
    metrics = {**built, "pretrained": pretrained, "split": {"seed": 0, "pretrain_lines": adapt.lines},
               "adapted": {"from": str(source), **asdict(adapt), "train_loss": losses, "seconds": seconds,
                           "pretrained_before": built["pretrained"]},
               "build_seconds": built["build_seconds"] + seconds}
    _write_agents(out, (speaker, listener, lm), tokenizer, metrics)
    return metrics


def build_translation_agents(data_dir: str | Path, out: str | Path | None = None, *, max_epochs: int | None = None,
                             pretrain_lines: int | None = None, label_smoothing: float | None = None,
                             corpus: str = "tatoeba", device: str = "auto", force: bool = False,
                             resume: bool = False, adapt: str | Path | None = None, jobs: int = 1,
                             log=print) -> tuple[Path, dict]:
    """``elastic-reset build translation-agents``: :func:`build_agents` with :class:`AgentConfig`'s defaults but for
    the settings given, into ``out`` (default: where the ``translation_game`` task looks); ``resume`` continues an
    interrupted build. With ``adapt``, a Tatoeba-only build's folder: :func:`adapt_agents` on ``pretrain_lines``
    lines for ``max_epochs`` epochs (:class:`AdaptConfig`'s default: 3). Returns (out, metrics)."""
    from elastic_reset.models import translation_agents_path

    out = Path(out) if out else translation_agents_path(required=False)
    if out.exists() and not force:
        raise FileExistsError(f"{out}: Translation Game agents are already there (pass --force to rebuild them)")
    if adapt is not None:
        if Path(adapt).resolve() == out.resolve():
            raise ConfigError(f"--out: {out} is the folder being adapted; write the adapted agents elsewhere")
        if not pretrain_lines:
            raise ConfigError("--pretrain-lines: --adapt needs the Multi30k lines to adapt on (a number above 0)")
        if resume or label_smoothing is not None or corpus != "tatoeba" or jobs != 1:
            raise ConfigError("--adapt: takes --pretrain-lines, --max-epochs, --device, --out and --force only")
        settings = AdaptConfig(pretrain_lines, **({} if max_epochs is None else {"epochs": max_epochs}))
        return out, adapt_agents(data_dir, adapt, out, settings, log=log, device=device)
    config = AgentConfig(pretrain_lines=pretrain_lines, corpus=corpus)
    if max_epochs is not None:
        config = replace(config, max_epochs=max_epochs)
    if label_smoothing is not None:
        config = replace(config, label_smoothing=label_smoothing)
    return out, build_agents(data_dir, out, config, log=log, device=device, resume=resume, jobs=jobs)
