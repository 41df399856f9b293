"""A Hugging Face sequence-classification reward model as a reward, the way TRL's ``GRPOTrainer`` uses one
(``reward_funcs="org/reward-model"``): the model's single logit for prompt + completion.

As TRL does: a text prompt and its completion are scored as one string, a conversational prompt (a list of
messages) with its completion as ``prompt + [assistant turn]`` rendered by the reward model's own chat template;
tokenized without added special tokens (the template carries them), padded on the right, with the EOS token as
padding where the tokenizer has none.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from elastic_reset.lm.device import resolve_device


class SequenceScoreReward:
    """``reward(prompts, completions, **columns) -> [logit]``, one float per completion.

    Args:
        name: a model folder, or a Hub name (online users).
        batch_size: completions per forward.
        device: where the model runs (default: the accelerator if there is one, else the CPU).
        chat_template_kwargs: more variables for the reward model's chat template (TRL's ``chat_template_kwargs``).
    """

    def __init__(self, name: str | os.PathLike, batch_size: int = 16, device: str | torch.device | None = None,
                 chat_template_kwargs: dict[str, Any] | None = None):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(name)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "right"
        self.device = resolve_device(device, "device")
        self.model = AutoModelForSequenceClassification.from_pretrained(name).to(self.device).eval()
        if self.model.config.num_labels != 1:
            raise ValueError(f"{name}: a reward model has one output (num_labels=1); this one has "
                             f"{self.model.config.num_labels}")
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.batch_size = batch_size
        self.chat_template_kwargs = dict(chat_template_kwargs or {})

    def texts(self, prompts: list[Any], completions: list[Any]) -> list[str]:
        """What is scored: each prompt and its completion as one text."""
        if len(prompts) != len(completions):
            raise ValueError(f"reward model: {len(prompts)} prompts for {len(completions)} completions")
        if prompts and isinstance(prompts[0], list):
            return [self.tokenizer.apply_chat_template(p + c, tokenize=False, **self.chat_template_kwargs)
                    for p, c in zip(prompts, completions)]
        return [p + c for p, c in zip(prompts, completions)]

    @torch.inference_mode()
    def __call__(self, prompts: list[Any], completions: list[Any], **columns: Any) -> list[float]:
        texts = self.texts(prompts, completions)
        scores: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            batch = self.tokenizer(texts[start:start + self.batch_size], return_tensors="pt", padding=True,
                                   add_special_tokens=False).to(self.device)
            scores.extend(self.model(**batch).logits[:, 0].float().tolist())
        return scores
