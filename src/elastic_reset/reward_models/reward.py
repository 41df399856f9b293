"""A trained pairwise reward model as the RL engine's reward: the policy's text is re-tokenized with the reward
model's own tokenizer and scored in batches, as in training (a causal model reads prompt + completion in one pass
and, if it is an Advantage Model, e(x) off the prompt's last token); an Advantage Model reports a(x, y) = r(x, y) −
e(x)."""

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
        from elastic_reset.reward_models.model import load_reward_model

        self.model, self.tokenizer, settings = load_reward_model(path)
        self.max_tokens = max_tokens or settings["config"]["max_tokens"]
        self.batch_size = batch_size

    @torch.no_grad()
    def __call__(self, prompts: list[str], completions: list[str]) -> list[float]:
        if len(prompts) != len(completions):
            raise RewardError(f"reward model: {len(prompts)} prompts for {len(completions)} completions")
        score = self._score_packed if self.model.shares_prompt else self._score_separately
        scores = []
        for start in range(0, len(prompts), self.batch_size):
            scores.extend(score(prompts[start:start + self.batch_size],
                                completions[start:start + self.batch_size]).tolist())
        return scores

    def _score_packed(self, prompts: list[str], completions: list[str]) -> torch.Tensor:
        from elastic_reset.reward_models.packing import encode_shared_prompts, pack

        encoded = encode_shared_prompts(self.tokenizer, prompts, [[y] for y in completions], self.max_tokens)
        rewards, expected = self.model.packed_scores(**pack([x for x, _ in encoded], [ys for _, ys in encoded],
                                                            self.tokenizer.pad_token_id))
        return rewards[:, 0] if expected is None else rewards[:, 0] - expected

    def _score_separately(self, prompts: list[str], completions: list[str]) -> torch.Tensor:
        from elastic_reset.reward_models.packing import truncating_left

        with truncating_left(self.tokenizer):
            def encode(texts):
                return self.tokenizer(texts, return_tensors="pt", padding=True, truncation=True,
                                      max_length=self.max_tokens)
            pair = encode([x + y for x, y in zip(prompts, completions)])
            prompt = encode(prompts) if self.model.is_advantage_model else None
        return self.model.score(pair.input_ids, pair.attention_mask, None if prompt is None else prompt.input_ids,
                                None if prompt is None else prompt.attention_mask)
