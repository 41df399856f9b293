"""The learned sentiment reward: P(positive) under a 2-way sequence classifier, loaded from its folder.

The IMDB task's classifier (all-MiniLM-L6-v2 + a 2-way head, fine-tuned on IMDB train labels) is trained by
:mod:`elastic_reset.pretrain.classifier` (``elastic-reset build imdb-classifier``) and cached at
``models.imdb_classifier_path()``; this module only loads it and scores text.

Texts are truncated from the LEFT (their end is kept), at training and at scoring time alike: a reward must see the
generated continuation, which comes last. RL4LMs' ``LearnedBatchedRewardFunction`` does the same
(``truncation_side = "left"``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path

import torch

from elastic_reset.data.imdb import POSITIVE, check_labelled
from elastic_reset.lm.device import native_bf16, resolve_device

__all__ = ["POSITIVE", "SentimentReward", "accuracy"]


def _autocast(device: torch.device, enabled: bool):
    """bf16 autocast where ``enabled`` and the hardware does bf16 natively; else nothing."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if enabled and native_bf16(device) else nullcontext()


def _load_tokenizer(path: str | os.PathLike):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.truncation_side = "left"  # keep the end of the text (the continuation); see the module docstring
    return tokenizer


def _positive_probs(model, tokenizer, texts: Sequence[str], *, batch_size: int, max_length: int,
                    device: torch.device, use_autocast: bool, log_odds: bool = False) -> list[float]:
    """P(positive) for each text, or with ``log_odds`` log P(positive) − log P(negative) (unbounded, where
    P(positive) rounds to 1). Texts are batched in order of length (less padding), results in input order."""
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
            out = logits[:, POSITIVE] - logits[:, 1 - POSITIVE] if log_odds else logits.softmax(-1)[:, POSITIVE]
            for i, p in zip(idx, out.tolist()):
                probs[i] = p
    model.train(was_training)
    return probs


def _accuracy(probs: Sequence[float], labels: Sequence[int]) -> float:
    return sum(int(p >= 0.5) == int(y) for p, y in zip(probs, labels)) / len(labels)


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
                                    "folder with config.json, as `elastic-reset build imdb-classifier` writes)")
        self.batch_size = batch_size
        self.max_length = max_length
        self.device = resolve_device(device, "device")
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

    def log_odds(self, texts: Sequence[str]) -> list[float]:
        """log P(positive) − log P(negative) of each text (the gold-vs-proxy testbed's gold score)."""
        return _positive_probs(self.model, self.tokenizer, list(texts), batch_size=self.batch_size,
                               max_length=self.max_length, device=self.device, use_autocast=self.use_autocast,
                               log_odds=True)

    def __call__(self, prompts: list[str], completions: list[str]) -> list[float]:
        return self.score(self.texts(prompts, completions))

    @staticmethod
    def texts(prompts: list[str], completions: list[str]) -> list[str]:
        """What is scored: each prompt followed by its completion."""
        if len(prompts) != len(completions):
            raise ValueError(f"SentimentReward: {len(prompts)} prompts but {len(completions)} completions")
        return [p + c for p, c in zip(prompts, completions)]


def accuracy(path: str | os.PathLike, texts: Sequence[str], labels: Sequence[int], *, batch_size: int = 64,
             max_length: int = 256) -> float:
    """Accuracy of the classifier at ``path`` (P(positive) >= 0.5 means positive) on labelled texts."""
    check_labelled(texts, labels, "accuracy")
    reward = SentimentReward(path, batch_size=batch_size, max_length=max_length)
    return _accuracy(reward.score(texts), labels)
