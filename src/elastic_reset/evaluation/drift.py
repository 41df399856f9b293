"""Drift metrics. Perplexity on held-out human text is the paper's IMDB drift score (§6, following RL4LMs)."""

from __future__ import annotations

import math

import torch

from elastic_reset.lm.scoring import autocast, position_ids_from_mask, token_logprobs


def token_nll(model, tokenizer, texts: list[str], *, max_tokens: int = 128,
              autocast_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token NLL ``[B, T-1]`` of a decoder-only LM on ``texts`` and the mask of the scored tokens.

    Each text is truncated to ``max_tokens`` and gets an EOS, so the model is also scored on ending it. A token is
    scored when it and its predecessor are real (with left padding, the first token has no context). Keeps the
    graph: the multitask loss trains through it; :func:`perplexity` calls it under ``no_grad``.
    """
    device = next(model.parameters()).device
    enc = tokenizer([t + tokenizer.eos_token for t in texts], return_tensors="pt", padding=True, truncation=True,
                    max_length=max_tokens, add_special_tokens=False).to(device)
    mask = enc.attention_mask
    with autocast(model, autocast_dtype):
        logits = model(input_ids=enc.input_ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    nll = -token_logprobs(logits[:, :-1].float(), enc.input_ids[:, 1:])
    scored = (mask[:, 1:] * mask[:, :-1]).float()
    return nll * scored, scored


@torch.no_grad()
def perplexity(model, tokenizer, texts: list[str], *, max_tokens: int = 128, batch_size: int = 16,
               autocast_dtype: torch.dtype | None = None) -> float:
    """exp(total NLL / total predicted tokens) of a decoder-only LM on ``texts`` (see :func:`token_nll`)."""
    if model.config.is_encoder_decoder:
        raise NotImplementedError("perplexity is defined here for decoder-only models (use BLEU for seq2seq)")
    total_nll, total_tokens = 0.0, 0
    for start in range(0, len(texts), batch_size):
        nll, scored = token_nll(model, tokenizer, texts[start:start + batch_size], max_tokens=max_tokens,
                                autocast_dtype=autocast_dtype)
        total_nll += float(nll.sum())
        total_tokens += int(scored.sum())
    return math.exp(total_nll / max(total_tokens, 1))
