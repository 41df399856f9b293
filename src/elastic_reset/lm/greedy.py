"""Greedy decoding of an encoder-decoder model, for evaluation (BLEU) rather than RL: Hugging Face's ``generate``,
no sampling, no beam (the Translation Game's agents are evaluated on greedy messages, as the engine's ``eval.greedy``
samples them)."""

from __future__ import annotations

import torch


@torch.no_grad()
def greedy_translate(model, tokenizer, sources: list[str], *, batch_size: int = 128, max_tokens: int = 64,
                     max_new_tokens: int = 40) -> list[str]:
    """The model's greedy output text for each of ``sources`` (inputs truncated to ``max_tokens``)."""
    was_training = model.training
    model.eval()
    out = []
    try:
        for start in range(0, len(sources), batch_size):
            enc = tokenizer(sources[start:start + batch_size], return_tensors="pt", padding=True, truncation=True,
                            max_length=max_tokens).to(model.device)
            ids = model.generate(**enc, do_sample=False, num_beams=1, max_new_tokens=max_new_tokens)
            out.extend(t.strip() for t in tokenizer.batch_decode(ids, skip_special_tokens=True))
    finally:
        model.train(was_training)
    return out
