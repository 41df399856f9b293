"""A pairwise reward model: a backbone (SmolLM2 with LoRA, all-MiniLM-L6-v2, or a tiny test model) with a scalar
reward head r(x, y) on the pooled last hidden state of prompt + response, and for the Advantage Model a second
head e(x) on the prompt alone, the expected reward of the prompt (Peng et al. 2023, eq. 7)."""

from __future__ import annotations

import torch
from torch import nn

POOLING = ("last", "mean")


class PairwiseRewardModel(nn.Module):
    """Args:
        backbone: a transformers base model (``last_hidden_state`` out), plain or wrapped by peft.
        pooling: ``last`` (the last non-padding token: decoders, as StackLLaMA's LLaMA reward model reads the end
            of the text) or ``mean`` (mean over tokens: how all-MiniLM-L6-v2 was trained to embed sentences).
        advantage: add the expected-reward head e(x) (the Advantage Model).
    """

    def __init__(self, backbone: nn.Module, pooling: str = "last", advantage: bool = False):
        super().__init__()
        if pooling not in POOLING:
            raise ValueError(f"pooling: expected one of {POOLING}, got {pooling!r}")
        self.backbone = backbone
        self.pooling = pooling
        hidden = backbone.config.hidden_size
        self.reward_head = nn.Linear(hidden, 1)
        self.expected_head = nn.Linear(hidden, 1) if advantage else None
        for head in filter(None, (self.reward_head, self.expected_head)):
            nn.init.normal_(head.weight, std=1.0 / (hidden + 1) ** 0.5)
            nn.init.zeros_(head.bias)

    @property
    def is_advantage_model(self) -> bool:
        return self.expected_head is not None

    def _pooled(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state.float()
        mask = attention_mask.to(hidden.dtype)
        if self.pooling == "mean":
            return (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
        # The last position whose mask is 1, whichever side the padding is on.
        positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
        last = (positions * attention_mask).argmax(1)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]

    def reward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """r(x, y) ``[B]`` for tokenized prompt + response."""
        return self.reward_head(self._pooled(input_ids, attention_mask)).squeeze(-1)

    def expected(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """e(x) ``[B]`` for tokenized prompts (the Advantage Model only)."""
        if self.expected_head is None:
            raise RuntimeError("expected(): this is a plain reward model, it has no expected-reward head")
        return self.expected_head(self._pooled(input_ids, attention_mask)).squeeze(-1)

    def score(self, input_ids, attention_mask, prompt_ids=None, prompt_mask=None) -> torch.Tensor:
        """What the model reports for a (prompt, response): r(x, y), or the advantage r(x, y) − e(x)."""
        reward = self.reward(input_ids, attention_mask)
        if self.expected_head is None:
            return reward
        return reward - self.expected(prompt_ids, prompt_mask)

    @property
    def shares_prompt(self) -> bool:
        """A last-token reader is a decoder: its responses can share one pass over their prompt
        (:mod:`~elastic_reset.reward_models.packing`). A mean-pooled encoder reads the prompt in the light of the
        response, so it reads each ``prompt + response`` on its own."""
        return self.pooling == "last"

    def packed_scores(self, packed_ids: torch.Tensor, packed_positions: torch.Tensor, packed_mask: torch.Tensor,
                      packed_ends: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(r(x, y) of every response ``[B, k]``, e(x) ``[B]`` or None) from rows that
        :func:`~elastic_reset.reward_models.packing.pack` built."""
        attention = self.backbone.config._attn_implementation
        if attention == "eager":  # eager attention adds the mask to the scores
            dtype = next(self.backbone.parameters()).dtype
            packed_mask = torch.zeros(packed_mask.shape, dtype=dtype, device=packed_mask.device).masked_fill(
                ~packed_mask, torch.finfo(dtype).min)
        elif attention != "sdpa":
            raise ValueError(f"packed scoring takes a custom attention mask: sdpa or eager attention, not {attention}")
        if self.expected_head is not None and bool((packed_ends[:, 0] < 0).any()):
            raise ValueError("the Advantage Model's e(x) needs at least one prompt token; a prompt is empty")
        hidden = self.backbone(input_ids=packed_ids, attention_mask=packed_mask,
                               position_ids=packed_positions).last_hidden_state.float()
        at = hidden[torch.arange(hidden.shape[0], device=hidden.device)[:, None], packed_ends]  # [B, 1 + k, H]
        rewards = self.reward_head(at[:, 1:]).squeeze(-1)
        expected = None if self.expected_head is None else self.expected_head(at[:, 0]).squeeze(-1)
        return rewards, expected
