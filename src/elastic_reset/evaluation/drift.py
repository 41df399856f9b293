"""Drift metrics. Perplexity on held-out human text is the paper's IMDB drift score (§6, following RL4LMs)."""

from __future__ import annotations

import math

import torch

from elastic_reset.lm.scoring import token_nll


@torch.no_grad()
def perplexity(model, tokenizer, texts: list[str], *, max_tokens: int = 128, batch_size: int = 16,
               autocast_dtype: torch.dtype | None = None) -> float:
    """exp(total NLL / total predicted tokens) of a decoder-only LM on ``texts``, each truncated to ``max_tokens``
    and followed by EOS (see :func:`elastic_reset.lm.scoring.token_nll`)."""
    if model.config.is_encoder_decoder:
        raise NotImplementedError("perplexity is defined here for decoder-only models (use BLEU for seq2seq)")
    total_nll, total_tokens = 0.0, 0
    for start in range(0, len(texts), batch_size):  # summed batch by batch in float64: the logged numbers' order
        nll, scored = token_nll(model, tokenizer, texts[start:start + batch_size], max_tokens=max_tokens,
                                autocast_dtype=autocast_dtype)
        total_nll += float(nll.sum())
        total_tokens += int(scored.sum())
    return math.exp(total_nll / max(total_tokens, 1))
