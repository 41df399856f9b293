"""Drift metrics. Perplexity on held-out human text is the paper's IMDB drift score (§6, following RL4LMs)."""

from __future__ import annotations

import math

import torch

from elastic_reset.rl.policy import autocast


@torch.no_grad()
def perplexity(model, tokenizer, texts: list[str], *, max_tokens: int = 128, batch_size: int = 16,
               autocast_dtype: torch.dtype | None = None) -> float:
    """exp(total NLL / total predicted tokens) of a decoder-only LM on ``texts`` (each truncated to
    ``max_tokens``; an EOS is appended so the model is also scored on ending the text)."""
    if model.config.is_encoder_decoder:
        raise NotImplementedError("perplexity is defined here for decoder-only models (use BLEU for seq2seq)")
    device = next(model.parameters()).device
    total_nll, total_tokens = 0.0, 0
    for start in range(0, len(texts), batch_size):
        chunk = [t + tokenizer.eos_token for t in texts[start:start + batch_size]]
        enc = tokenizer(chunk, return_tensors="pt", padding=True, truncation=True, max_length=max_tokens,
                        add_special_tokens=False).to(device)
        mask = enc.attention_mask
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        with autocast(autocast_dtype, device):
            logits = model(input_ids=enc.input_ids, attention_mask=mask, position_ids=position_ids).logits
        logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
        target = enc.input_ids[:, 1:]
        nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        target_mask = (mask[:, 1:] * mask[:, :-1]).float()
        total_nll += float((nll * target_mask).sum())
        total_tokens += int(target_mask.sum())
    return math.exp(total_nll / max(total_tokens, 1))
