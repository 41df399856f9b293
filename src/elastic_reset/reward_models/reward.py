"""A trained pairwise reward model as the RL engine's reward: the policy's text is re-tokenized with the reward
model's own tokenizer and scored in batches; an Advantage Model reports a(x, y) = r(x, y) − e(x)."""

from __future__ import annotations

from pathlib import Path

import torch

from elastic_reset.errors import RewardError


class PreferenceModelReward:
    """``reward(prompts, completions)``: one score per completion, from a folder ``reward-model train`` wrote.

    Args:
        path: the reward model's folder.
        batch_size: (prompt, completion) pairs per forward.
        max_tokens: tokens kept per prompt + completion (the end is kept, as in training).
    """

    def __init__(self, path: str | Path, batch_size: int = 16, max_tokens: int | None = None):
        from elastic_reset.reward_models.build import load_reward_model

        self.model, self.tokenizer, settings = load_reward_model(path)
        self.max_tokens = max_tokens or settings["config"]["max_tokens"]
        self.batch_size = batch_size

    def _encode(self, texts: list[str]):
        from elastic_reset.reward_models.train import truncating_left

        with truncating_left(self.tokenizer):
            return self.tokenizer(texts, return_tensors="pt", padding=True, truncation=True,
                                  max_length=self.max_tokens)

    @torch.no_grad()
    def __call__(self, prompts: list[str], completions: list[str]) -> list[float]:
        if len(prompts) != len(completions):
            raise RewardError(f"reward model: {len(prompts)} prompts for {len(completions)} completions")
        scores = []
        for start in range(0, len(prompts), self.batch_size):
            xs, ys = prompts[start:start + self.batch_size], completions[start:start + self.batch_size]
            pair = self._encode([x + y for x, y in zip(xs, ys)])
            prompt = self._encode(xs) if self.model.is_advantage_model else None
            scores.extend(self.model.score(pair.input_ids, pair.attention_mask,
                                           None if prompt is None else prompt.input_ids,
                                           None if prompt is None else prompt.attention_mask).tolist())
        return scores
