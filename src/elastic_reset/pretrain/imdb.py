"""A small policy pretrained on the task's own text, for the IMDB experiment (Elastic Reset §6).

The paper's IMDB policy is GPT-2 further trained on IMDB reviews (``lvwerra/gpt2-imdb``): a model that already
writes reviews, so that RL only has to steer their sentiment. Nothing of that size can be downloaded or trained
here, so ``elastic-reset build imdb-policy`` builds the same thing at CPU scale: a byte-level BPE vocabulary
(``tokenizers``) and a small GPT-2 trained from scratch, by next-token prediction, on the IMDB *train* reviews only
(validation prompts and the perplexity reference texts come from the test split, never seen here). The result is
a plain Hugging Face folder, cached outside git (``models.imdb_policy_path()``), that ``model.name: imdb-gpt2``
loads. The reviews it reads: :func:`elastic_reset.data.imdb.policy_texts`.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from elastic_reset.data.imdb import policy_texts
from elastic_reset.io import save_folder_atomically
from elastic_reset.lm.device import resolve_device
from elastic_reset.lm.scoring import sequence_nll

EOS = "<|endoftext|>"


@dataclass
class PretrainConfig:
    vocab_size: int = 8192
    """BPE vocabulary size, special token included."""
    n_layer: int = 4
    """Transformer blocks."""
    n_embd: int = 256
    """Width (4 heads of 64)."""
    context: int = 128
    """Tokens per training sequence (and the model's context length is twice that, for prompt + completion)."""
    batch_size: int = 16
    """Sequences per optimizer step (twice as many made a sequence slower to train on a CPU; see BENCHMARKS.md)."""
    steps: int = 1200
    """Optimizer steps (1200 × 16 × 128 = 2.5M tokens, about a third of the train reviews; see BENCHMARKS.md)."""
    lr: float = 2e-3
    """Peak AdamW learning rate (cosine decay to 10 % after a 5 % warm-up)."""
    seed: int = 0
    """Seeds the shuffle and the initial weights."""


def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE vocabulary learnt on ``texts`` (GPT-2's scheme), wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS, bos_token=EOS,
                                   padding_side="left")


def token_stream(tokenizer, texts: list[str]) -> torch.Tensor:
    """All texts as one stream of ids, each followed by EOS (GPT-2's pretraining layout)."""
    ids: list[int] = []
    for start in range(0, len(texts), 1000):
        for row in tokenizer(texts[start:start + 1000])["input_ids"]:
            ids.extend(row)
            ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


def pretrain_policy(texts: list[str], held_out: list[str], out: str | Path, config: PretrainConfig,
                    log=print, device: str | torch.device | None = None) -> dict:
    """Train the tokenizer and the model on ``texts``, measure perplexity on ``held_out``, write ``out``.
    ``device``: where the model trains (None or ``auto``: CUDA when present, as the classifier's build); the weights
    start the same on any device."""
    from transformers import GPT2Config, GPT2LMHeadModel, get_cosine_schedule_with_warmup

    out = Path(out)
    device = resolve_device(device, "--device")
    random.Random(config.seed).shuffle(texts := list(texts))
    t0 = time.perf_counter()
    tokenizer = train_tokenizer(texts, config.vocab_size)
    stream = token_stream(tokenizer, texts)
    held = token_stream(tokenizer, held_out)
    log(f"build imdb-policy: vocabulary of {len(tokenizer)} tokens; {stream.numel():,} training tokens "
        f"({time.perf_counter() - t0:.0f} s)")

    torch.manual_seed(config.seed)
    model = GPT2LMHeadModel(GPT2Config(
        vocab_size=len(tokenizer), n_positions=2 * config.context, n_embd=config.n_embd, n_layer=config.n_layer,
        n_head=config.n_embd // 64, bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.95), weight_decay=0.1)
    schedule = get_cosine_schedule_with_warmup(optimizer, max(1, config.steps // 20), config.steps,
                                               num_cycles=0.45)  # ends at ~10 % of the peak
    windows = stream[: stream.numel() // config.context * config.context].view(-1, config.context)
    order = torch.randperm(len(windows), generator=torch.Generator().manual_seed(config.seed))
    model.train()
    t0 = time.perf_counter()
    for step in range(config.steps):
        idx = order[(step * config.batch_size + torch.arange(config.batch_size)) % len(windows)]
        batch = windows[idx].to(device)
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if (step + 1) % 100 == 0 or step + 1 == config.steps:
            log(f"build imdb-policy: step {step + 1}/{config.steps}, loss {loss.item():.3f} "
                f"({time.perf_counter() - t0:.0f} s)")
    model.eval()
    held_ppl = stream_perplexity(model, held, config.context)
    metrics = {"held_out_perplexity": held_ppl, "train_tokens_seen": config.steps * config.batch_size *
               config.context, "train_tokens": int(stream.numel()), "parameters": sum(p.numel() for p in
               model.parameters()), "train_seconds": time.perf_counter() - t0, "device": str(device),
               "config": asdict(config)}
    log(f"build imdb-policy: held-out perplexity {held_ppl:.1f} per BPE token on {held.numel():,} test-review tokens")

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "pretrain_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")

    save_folder_atomically(out, write)
    return metrics


@torch.no_grad()
def stream_perplexity(model, ids: torch.Tensor, context: int, batch_size: int = 64,
                      autocast_dtype: torch.dtype | None = None) -> float:
    """Perplexity of a token stream cut into windows of ``context`` tokens, each scored on its own."""
    windows = ids[: ids.numel() // context * context].view(-1, context)
    nll, tokens = sequence_nll(model, None, windows, batch_size=batch_size, autocast_dtype=autocast_dtype)
    return math.exp(float(nll.double().sum()) / int(tokens.sum()))


def build_imdb_policy(data_dir: str | None, out: str | Path | None = None, *, steps: int | None = None,
                      force: bool = False, device: str | None = None, log=print) -> tuple[Path, dict]:
    """``elastic-reset build imdb-policy``: :func:`pretrain_policy` on every train review, perplexity on test
    reviews the IMDB task never uses, into ``out`` (default: where ``model.name: imdb-gpt2`` looks). Returns
    (out, metrics)."""
    from elastic_reset.models import imdb_policy_path

    out = Path(out) if out else imdb_policy_path(required=False)
    if (out / "config.json").exists() and not force:
        raise FileExistsError(f"{out}: a policy is already there (pass --force to rebuild it)")
    config = PretrainConfig() if steps is None else replace(PretrainConfig(), steps=steps)
    train, held_out = policy_texts(data_dir)
    return out, pretrain_policy(train, held_out, out, config, log=log, device=device)
