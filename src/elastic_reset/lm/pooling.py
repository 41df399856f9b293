"""One vector per sequence from an encoder's hidden states."""

from __future__ import annotations

import torch


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B, H]``: the mean of ``hidden`` ``[B, T, H]`` over the positions whose mask is 1 (how sentence encoders
    such as all-MiniLM-L6-v2 are meant to be read)."""
    mask = attention_mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
