"""Perplexity drift (paper §6): exp of the mean token NLL, checked against a plain per-text cross-entropy loop."""

import math

import pytest
import torch
import torch.nn.functional as F

from elastic_reset.evaluation.drift import perplexity
from elastic_reset.models import byte_tokenizer, tiny_causal_lm

TEXTS = ["a short one", "a somewhat longer text, padded less", "x"]


def test_perplexity_is_exp_of_the_mean_token_nll_whatever_the_padding():
    model, tok = tiny_causal_lm("llama", hidden=32, layers=2, seed=0).eval(), byte_tokenizer()
    tok.padding_side = "left"
    total_nll, total_tokens = 0.0, 0
    with torch.no_grad():
        for text in TEXTS:  # one text at a time: no padding, positions 0..T-1
            ids = tok(text + tok.eos_token, return_tensors="pt", add_special_tokens=False).input_ids
            logits = model(input_ids=ids).logits[0, :-1]
            total_nll += float(F.cross_entropy(logits, ids[0, 1:], reduction="sum"))
            total_tokens += ids.shape[1] - 1
    expected = math.exp(total_nll / total_tokens)
    assert perplexity(model, tok, TEXTS, batch_size=3) == pytest.approx(expected, rel=1e-5)
    assert perplexity(model, tok, TEXTS, batch_size=1) == pytest.approx(expected, rel=1e-5)

