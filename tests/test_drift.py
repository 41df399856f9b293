"""Perplexity drift (paper §6): exp of the mean token NLL, checked against a plain per-text cross-entropy loop; and
the one token-NLL helper it is built on (``lm.scoring.token_nll`` / ``sequence_nll``)."""

import math

import pytest
import torch
import torch.nn.functional as F

from elastic_reset.evaluation import drift
from elastic_reset.evaluation.drift import perplexity
from elastic_reset.lm.scoring import seq2seq_nll, sequence_nll, token_nll
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



# ------------------------------------------------------------------------------- the one token-NLL helper
def test_sequence_nll_sums_token_nll_per_text_and_perplexity_is_built_on_it():
    model, tok = tiny_causal_lm("llama", hidden=32, layers=2, seed=0).eval(), byte_tokenizer()
    tok.padding_side = "left"
    assert drift.token_nll is token_nll  # the RL engine's import still finds it
    with torch.no_grad():
        nll, tokens = sequence_nll(model, tok, TEXTS, batch_size=2, max_tokens=6)
        for i, text in enumerate(TEXTS):  # each text alone: the same sum and count
            one, scored = token_nll(model, tok, [text], max_tokens=6)
            assert float(nll[i]) == pytest.approx(float(one.sum()), rel=1e-6)
            assert int(tokens[i]) == int(scored.sum()) == min(len(text) + 1, 6) - 1  # + EOS, truncated, first
        assert tokens.dtype == torch.long and nll.shape == tokens.shape == (3,)
        assert perplexity(model, tok, TEXTS, batch_size=2, max_tokens=6) == pytest.approx(
            math.exp(float(nll.sum()) / int(tokens.sum())), rel=1e-6)
        # Token ids are scored as given; BOS first also scores the first token.
        ids = [tok(t + tok.eos_token, add_special_tokens=False).input_ids for t in TEXTS]
        by_ids, by_ids_tokens = sequence_nll(model, tok, ids, batch_size=None)
        by_text, by_text_tokens = sequence_nll(model, tok, TEXTS, batch_size=None)
        torch.testing.assert_close(by_ids, by_text)
        assert torch.equal(by_ids_tokens, by_text_tokens)
        _, with_bos = sequence_nll(model, tok, TEXTS, prepend_bos=True)
        assert torch.equal(with_bos, by_text_tokens + 1)
        empty_nll, empty_tokens = sequence_nll(model, tok, [])
        assert empty_nll.shape == empty_tokens.shape == (0,)


def test_sequence_nll_keeps_the_graph_for_the_losses_that_train_through_it():
    model, tok = tiny_causal_lm("llama", hidden=32, layers=2, seed=0), byte_tokenizer()
    tok.padding_side = "left"
    nll, tokens = sequence_nll(model, tok, TEXTS, batch_size=2)
    (nll.sum() / tokens.sum()).backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_encoder_decoder_pairs_score_the_target_given_the_source():
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    model = T5ForConditionalGeneration(T5Config(vocab_size=259, d_model=16, d_kv=8, d_ff=32, num_layers=1,
                                                num_heads=2, pad_token_id=0, eos_token_id=2,
                                                decoder_start_token_id=0)).eval()
    tok = byte_tokenizer()
    tok.padding_side = "right"
    sources, targets = ["le chat", "un homme fait du vélo"], ["the cat", "a man rides a bike"]
    with torch.no_grad():
        nll, mask = token_nll(model, tok, list(zip(sources, targets)), max_tokens=16)
        apart, apart_mask = seq2seq_nll(model, tok, sources, targets, max_tokens=16)
        assert torch.equal(nll, apart) and torch.equal(mask, apart_mask)
        sums, counts = sequence_nll(model, tok, list(zip(sources, targets)), batch_size=1, max_tokens=16)
        torch.testing.assert_close(sums, nll.sum(-1))
        assert counts.tolist() == mask.sum(-1).long().tolist()
    with pytest.raises(ValueError, match="pairs"):
        token_nll(model, tok, sources)
