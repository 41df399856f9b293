"""Tests for sampling (``rl.sampling``: KV-cache sampling) and the teacher-forced re-scoring pass (``lm.scoring``).

Tiny models only (byte-level Llama / GPT-2 decoders, a one-layer T5 and BART built locally): nothing is downloaded.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import elastic_reset.lm.cpu_bf16 as cpu_bf16
from elastic_reset.errors import ConfigError
from elastic_reset.lm.cpu_bf16 import precast_weights
from elastic_reset.lm.lora import add_lora
from elastic_reset.lm.scoring import ResponseOutput, forward_response
from elastic_reset.models import tiny_causal_lm
from elastic_reset.rl.sampling import Rollout, SamplingConfig, sample, sample_from_logits, top_p_set
from helpers import independent_top_p

PAD, BOS, EOS, VOCAB = 0, 1, 2, 259
DECODERS = ["llama", "gpt2"]
SEQ2SEQ = ["t5", "bart"]
ALL = DECODERS + SEQ2SEQ


def make_model(arch: str, seed: int = 0, eos_bias: float | None = None):
    """A tiny model in eval mode (no dropout); ``eos_bias`` adds that much to EOS's logit so responses end early."""
    if arch in DECODERS:
        model = tiny_causal_lm(arch, seed=seed)
    elif arch == "t5":
        from transformers import T5Config, T5ForConditionalGeneration

        torch.manual_seed(seed)
        model = T5ForConditionalGeneration(T5Config(
            vocab_size=VOCAB, d_model=32, d_ff=64, num_layers=1, num_heads=2, d_kv=16,
            decoder_start_token_id=PAD, pad_token_id=PAD, eos_token_id=EOS))
    elif arch == "bart":
        from transformers import BartConfig, BartForConditionalGeneration

        torch.manual_seed(seed)
        model = BartForConditionalGeneration(BartConfig(
            vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128,
            pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS, decoder_start_token_id=EOS,
            forced_eos_token_id=None))
    else:
        raise ValueError(arch)
    if eos_bias is not None:
        head = model.get_output_embeddings()
        bias = torch.zeros(head.out_features)
        bias[EOS] = eos_bias
        head.bias = nn.Parameter(bias)
    return model.eval()


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models gain nothing from threads, and on a shared 2-core machine OpenMP's spin-waiting makes them up
    to 100x slower: run this module single-threaded."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def prompts(arch: str, lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random prompts padded the way each kind of model expects: left for decoders, right for encoders."""
    ids, mask = left_padded(lengths, seed)
    if arch in SEQ2SEQ:
        ids = torch.stack([torch.cat([row[m.bool()], row[~m.bool()]]) for row, m in zip(ids, mask)])
        mask = mask.flip(1)
    return ids, mask


def left_padded(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random byte prompts starting with BOS, left-padded to the longest."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), PAD, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, width - n:] = torch.randint(3, VOCAB, (n,), generator=g)
        ids[i, width - n] = BOS
        mask[i, width - n:] = 1
    return ids, mask


def run(model, ids, mask, seed=0, **config):
    kw = {k: config.pop(k) for k in ("mask_model", "mask_top_p", "min_tokens_to_keep", "autocast_dtype",
                                     "eos_token_id") if k in config}
    kw.setdefault("eos_token_id", EOS)
    config.setdefault("merge_lora", False)  # the unmerged sampler unless a test asks (the class default is True)
    return sample(model, ids, mask, SamplingConfig(**config), pad_token_id=PAD,
                  generator=torch.Generator(ids.device).manual_seed(seed), **kw)


def check_response_layout(r: Rollout) -> None:
    """Mask 1 up to and including EOS, 0 after; pad ids and zero log-probs after; negative log-probs before."""
    for i in range(len(r)):
        n = int(r.response_mask[i].sum())
        assert r.response_mask[i, :n].eq(1).all() and r.response_mask[i, n:].eq(0).all()
        ids = r.response_ids[i, :n].tolist()
        assert EOS not in ids[:-1]
        if n < r.response_ids.shape[1]:
            assert ids[-1] == EOS
        assert r.response_ids[i, n:].eq(PAD).all()
        assert r.logprobs[i, n:].eq(0).all() and (r.logprobs[i, :n] < 0).all()


def recompute_logprobs(model, ids, mask, r: Rollout, temperature=1.0) -> torch.Tensor:
    """Each response token's log-prob from a fresh, cache-free forward over the UNPADDED prefix: independent of
    the sampler's KV cache, position ids and padding masks."""
    out = torch.zeros_like(r.logprobs)
    enc_dec = model.config.is_encoder_decoder
    start = model.config.decoder_start_token_id if enc_dec else None
    with torch.no_grad():
        for i in range(len(r)):
            query = ids[i, mask[i].bool()][None]
            for t in range(int(r.response_mask[i].sum())):
                prefix = r.response_ids[i, :t][None]
                if enc_dec:
                    dec = torch.cat([torch.tensor([[start]]), prefix], 1)
                    logits = model(input_ids=query, decoder_input_ids=dec, use_cache=False).logits[0, -1]
                else:
                    logits = model(input_ids=torch.cat([query, prefix], 1), use_cache=False).logits[0, -1]
                out[i, t] = torch.log_softmax(logits / temperature, -1)[r.response_ids[i, t]]
    return out


# ----------------------------------------------------------------------------------------------------------------
# Shapes, padding, masks
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ALL)
def test_shapes_masks_and_eos_layout(arch):
    model = make_model(arch, eos_bias=4.0)
    ids, mask = prompts(arch, [3, 7, 5, 9, 4, 6])
    r = run(model, ids, mask, max_new_tokens=12)
    assert isinstance(r, Rollout) and len(r) == 6 and r.action_mask is None
    assert r.query_ids is ids and r.query_mask is mask
    tr = r.response_ids.shape[1]
    assert 1 <= tr <= 12
    assert r.response_mask.shape == r.logprobs.shape == (6, tr)
    assert r.response_ids.dtype == torch.long and r.response_mask.dtype == torch.float32
    assert r.logprobs.dtype == torch.float32
    check_response_layout(r)
    lengths = r.response_lengths.tolist()
    assert len(set(lengths)) > 1, "the EOS bias should end responses at different lengths"
    assert max(lengths) == tr  # trimmed to the longest response
    assert not any(t.is_inference() for t in (r.response_ids, r.response_mask, r.logprobs))


@pytest.mark.parametrize("arch", DECODERS)
def test_padded_prompt_gives_same_continuation(arch):
    model = make_model(arch)
    ids, mask = prompts(arch, [6])
    padded_ids = torch.cat([torch.full((1, 4), PAD), ids], 1)
    padded_mask = torch.cat([torch.zeros(1, 4, dtype=torch.long), mask], 1)
    plain = run(model, ids, mask, max_new_tokens=10, min_new_tokens=10)
    padded = run(model, padded_ids, padded_mask, max_new_tokens=10, min_new_tokens=10)
    assert torch.equal(plain.response_ids, padded.response_ids)
    torch.testing.assert_close(plain.logprobs, padded.logprobs, atol=1e-5, rtol=0)

    # Same prompt inside a batch with a longer one (so it is left-padded): same log-probs for the same response.
    other, other_mask = left_padded([11], seed=1)
    batch_ids = torch.cat([torch.cat([torch.full((1, 5), PAD), ids], 1), other], 0)
    batch_mask = torch.cat([torch.cat([torch.zeros(1, 5, dtype=torch.long), mask], 1), other_mask], 0)
    responses = torch.cat([plain.response_ids, plain.response_ids], 0)
    batch = Rollout(batch_ids, batch_mask, responses, torch.ones(2, 10), torch.zeros(2, 10))
    out = forward_response(model, batch)
    torch.testing.assert_close(out.logprobs[:1].detach(), plain.logprobs, atol=1e-5, rtol=0)


def test_right_padded_decoder_prompt_is_rejected():
    model = make_model("llama")
    ids, mask = left_padded([3, 5])
    with pytest.raises(ValueError, match="LEFT-padded"):
        run(model, ids.flip(1), mask.flip(1), max_new_tokens=3)
    with pytest.raises(ValueError, match="query_mask"):
        run(model, ids, torch.zeros_like(mask), max_new_tokens=3)


@pytest.mark.parametrize("arch", ALL)
def test_min_equals_max_gives_exactly_that_many_tokens(arch):
    model = make_model(arch, eos_bias=12.0)  # EOS would be sampled almost surely if it were allowed
    ids, mask = prompts(arch, [4, 8, 2])
    r = run(model, ids, mask, max_new_tokens=8, min_new_tokens=8)
    assert r.response_ids.shape == (3, 8)
    assert r.response_mask.eq(1).all()
    assert not r.response_ids.eq(EOS).any()


@pytest.mark.parametrize("arch", ["llama", "t5"])
def test_min_new_tokens_then_eos(arch):
    model = make_model(arch, eos_bias=12.0)
    ids, mask = prompts(arch, [4, 8, 2])
    r = run(model, ids, mask, max_new_tokens=10, min_new_tokens=3)
    assert r.response_ids.shape == (3, 4)
    assert r.response_ids[:, 3].eq(EOS).all() and not r.response_ids[:, :3].eq(EOS).any()
    assert r.response_mask.eq(1).all()
    # The recorded log-probs ignore the EOS suppression: they are the policy's own distribution.
    torch.testing.assert_close(forward_response(model, r).logprobs.detach(), r.logprobs, atol=1e-5, rtol=0)


def test_stop_at_eos_false_keeps_going():
    model = make_model("llama", eos_bias=4.0)
    ids, mask = left_padded([3, 6, 5, 4])
    r = run(model, ids, mask, max_new_tokens=12, stop_at_eos=False)
    assert r.response_ids.shape == (4, 12) and r.response_mask.eq(1).all()
    assert r.response_ids[:, :-1].eq(EOS).any(), "EOS is sampled mid-response and generation continues"
    torch.testing.assert_close(forward_response(model, r).logprobs.detach(), r.logprobs, atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------------------------------------------
# Log-prob agreement: sampler == teacher-forced pass == cache-free recomputation
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ALL)
@pytest.mark.parametrize("temperature,top_k,top_p,eos_bias", [(1.0, 0, 1.0, 3.5), (0.7, 50, 0.9, 3.0)])
def test_sample_logprobs_equal_forward_response(arch, temperature, top_k, top_p, eos_bias):
    model = make_model(arch, eos_bias=eos_bias)
    ids, mask = prompts(arch, [2, 9, 5, 7, 3])
    r = run(model, ids, mask, max_new_tokens=10, temperature=temperature, top_k=top_k, top_p=top_p)
    assert len(set(r.response_lengths.tolist())) > 1
    out = forward_response(model, r, temperature=temperature, return_hidden=True)
    assert isinstance(out, ResponseOutput) and out.logits is None
    torch.testing.assert_close(out.logprobs.detach(), r.logprobs, atol=1e-5, rtol=0)
    hidden_size = model.config.hidden_size if arch in DECODERS else model.config.d_model
    assert out.hidden.shape == (*r.response_ids.shape, hidden_size)
    valid = r.response_mask.bool()
    assert (out.entropy[valid] > 0).all() and out.entropy[~valid].eq(0).all()
    assert not out.entropy.requires_grad

    # The rollout's tensors can enter a graph (no inference tensors) and the gradient flows.
    loss = -(out.logprobs * r.logprobs.exp() * r.response_mask).sum() + out.hidden.pow(2).mean()
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("arch", ALL)
def test_kv_cache_matches_no_cache_recomputation(arch):
    model = make_model(arch, eos_bias=3.0)
    ids, mask = prompts(arch, [2, 6, 4])
    r = run(model, ids, mask, max_new_tokens=8, temperature=0.8)
    expected = recompute_logprobs(model, ids, mask, r, temperature=0.8)
    torch.testing.assert_close(r.logprobs, expected, atol=1e-5, rtol=0)


def test_forward_response_hidden_predicts_each_token():
    """hidden[:, t] is the state that predicts token t: the LM head on it gives that token's logits."""
    model = make_model("llama")
    ids, mask = left_padded([3, 6])
    r = run(model, ids, mask, max_new_tokens=5)
    out = forward_response(model, r, return_hidden=True, return_logits=True)
    torch.testing.assert_close(model.get_output_embeddings()(out.hidden), out.logits, atol=1e-5, rtol=0)
    manual = torch.log_softmax(out.logits, -1).gather(-1, r.response_ids[..., None]).squeeze(-1)
    torch.testing.assert_close(out.logprobs, manual * r.response_mask, atol=1e-6, rtol=0)


def test_bf16_autocast():
    model = make_model("llama", eos_bias=3.0)
    ids, mask = left_padded([3, 7, 5])
    r = run(model, ids, mask, max_new_tokens=8, autocast_dtype=torch.bfloat16)
    assert r.logprobs.dtype == torch.float32
    check_response_layout(r)
    out = forward_response(model, r, autocast_dtype=torch.bfloat16)
    assert out.logprobs.dtype == torch.float32
    torch.testing.assert_close(out.logprobs.detach(), r.logprobs, atol=0.1, rtol=0)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "t5"])
def test_precast_weights_same_numbers_as_autocast_and_restores(arch):
    model = make_model(arch)
    ids, mask = prompts(arch, [4, 6])
    kw = {"decoder_input_ids": ids[:, :3]} if arch in SEQ2SEQ else {}
    before = dict(model.named_parameters())
    linear = next(m for m in model.modules() if type(m).__name__ in ("Linear", "Conv1D"))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        reference = model(input_ids=ids, attention_mask=mask, **kw).logits
        with precast_weights(model, torch.bfloat16):
            assert linear.weight.dtype == torch.bfloat16
            assert model.get_input_embeddings().weight.dtype == torch.float32  # even when tied to the LM head
            cast = model(input_ids=ids, attention_mask=mask, **kw).logits
    assert torch.equal(reference, cast)
    assert all(p is before[n] for n, p in model.named_parameters())

    with pytest.raises(RuntimeError, match="boom"), precast_weights(model, torch.bfloat16):
        raise RuntimeError("boom")
    assert all(p is before[n] for n, p in model.named_parameters())

    # With grad enabled only frozen tensors are swapped: the trainable ones keep receiving gradients.
    for p in model.parameters():
        p.requires_grad_(False)
    trainable = model.get_output_embeddings().weight.requires_grad_(True)
    with precast_weights(model, torch.bfloat16):
        assert model.get_output_embeddings().weight is trainable
        assert linear.weight.dtype == torch.bfloat16 or linear is model.get_output_embeddings()


def test_sample_from_logits_distribution():
    probs = torch.tensor([0.5, 0.3, 0.2, 0.0, 0.0])
    scores = probs.log().expand(40000, -1)  # log 0 = -inf: never drawn
    draws = sample_from_logits(scores, torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=5).float() / len(draws)
    torch.testing.assert_close(freq, probs, atol=0.01, rtol=0)
    again = sample_from_logits(scores, torch.Generator().manual_seed(0))
    assert torch.equal(draws, again)


def test_sample_from_logits_never_draws_a_masked_token_even_at_u_near_one(monkeypatch):
    scores = torch.tensor([[0.0, 1.0, float("-inf"), float("-inf")], [float("-inf"), 0.0, 0.0, float("-inf")]])
    monkeypatch.setattr(torch, "rand", lambda shape, **kw: torch.ones(shape, dtype=kw.get("dtype")))
    assert sample_from_logits(scores).tolist() == [1, 2]


@pytest.mark.parametrize("autocast_dtype", [None, torch.bfloat16])
def test_peft_lora_model(autocast_dtype):
    peft = pytest.importorskip("peft")
    model = add_lora(make_model("llama", eos_bias=3.0),
                     peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    model.eval()
    ids, mask = left_padded([3, 7, 5])
    r = run(model, ids, mask, max_new_tokens=8, autocast_dtype=autocast_dtype)
    check_response_layout(r)
    out = forward_response(model, r, autocast_dtype=autocast_dtype)
    torch.testing.assert_close(out.logprobs.detach(), r.logprobs, atol=1e-5 if autocast_dtype is None else 0.1,
                               rtol=0)
    out.logprobs.sum().backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if p.requires_grad)


needs_onednn_bf16 = pytest.mark.skipif(
    not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()),
    reason="this CPU has no oneDNN bf16 support: packed_linears is a no-op here")


@needs_onednn_bf16
@pytest.mark.parametrize("arch", ["llama", "t5"])
def test_packed_linears_sample_exactly_what_autocast_samples(arch, monkeypatch):
    peft = pytest.importorskip("peft")
    model = make_model(arch, eos_bias=1.0)
    if arch == "llama":  # a LoRA model whose adapters are not zero: the packed base and the adapters both count
        model = add_lora(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                init_lora_weights=False))
        model.eval()
    ids, mask = prompts(arch, [3, 7, 5])
    packed = run(model, ids, mask, max_new_tokens=10, top_p=0.9, autocast_dtype=torch.bfloat16)
    monkeypatch.setattr(cpu_bf16, "_pack_dtype", lambda model, dtype: None)
    plain = run(model, ids, mask, max_new_tokens=10, top_p=0.9, autocast_dtype=torch.bfloat16)
    assert torch.equal(packed.response_ids, plain.response_ids)
    assert torch.equal(packed.logprobs, plain.logprobs)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
@pytest.mark.parametrize("arch", ["llama", "t5"])
def test_fp32_packed_linears_sample_what_the_plain_model_samples(arch, monkeypatch):
    peft = pytest.importorskip("peft")
    model = make_model(arch, eos_bias=1.0)
    if arch == "llama":
        model = add_lora(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                init_lora_weights=False))
        model.eval()
    ids, mask = prompts(arch, [3, 7, 5])
    with torch.no_grad(), cpu_bf16.packed_linears(model, None, merge_lora=True) as patched:
        assert len(patched) > 0  # fp32 packs too: decoding on an AVX2-only CPU
    packed = run(model, ids, mask, max_new_tokens=10, top_p=0.9)
    monkeypatch.setattr(cpu_bf16, "_pack_dtype", lambda model, dtype: None)
    plain = run(model, ids, mask, max_new_tokens=10, top_p=0.9)
    assert torch.equal(packed.response_ids, plain.response_ids)
    torch.testing.assert_close(packed.logprobs, plain.logprobs, rtol=0, atol=1e-5)  # a different summation order


@needs_onednn_bf16
def test_packed_linears_keep_frozen_packs_until_the_weight_changes():
    model = make_model("llama")
    linear = model.model.layers[0].self_attn.q_proj
    linear.weight.requires_grad_(False)
    x = torch.randn(3, linear.in_features)
    with torch.no_grad():
        with cpu_bf16.packed_linears(model, torch.bfloat16) as patched:
            assert linear in patched and model.lm_head in patched
            first = cpu_bf16._PACKS[linear][2]
            with torch.autocast("cpu", dtype=torch.bfloat16):
                assert torch.equal(linear(x), torch.nn.functional.linear(x, linear.weight))
        assert "forward" not in vars(linear)  # the class's forward is back
        with cpu_bf16.packed_linears(model, torch.bfloat16):
            assert cpu_bf16._PACKS[linear][2] is first  # reused: same tensor, same version
        linear.weight.mul_(2.0)  # an in-place change (a reset, a sync) must be seen
        with cpu_bf16.packed_linears(model, torch.bfloat16):
            assert cpu_bf16._PACKS[linear][2] is not first
            with torch.autocast("cpu", dtype=torch.bfloat16):
                assert torch.equal(linear(x), torch.nn.functional.linear(x, linear.weight))
    assert model.lm_head not in cpu_bf16._PACKS  # trainable: packed per entry, never kept
    cpu_bf16.release_packed_linears(model)
    assert linear not in cpu_bf16._PACKS


@needs_onednn_bf16
def test_merged_lora_sampling_applies_the_adapters_at_bf16_precision():
    peft = pytest.importorskip("peft")
    model = add_lora(make_model("llama"), peft.LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                                                          target_modules=["q_proj", "v_proj"]))
    model.eval()
    ids, mask = prompts("llama", [3, 7, 5])
    lora = model.base_model.model.model.layers[0].self_attn.q_proj
    with torch.no_grad():
        fp32 = model(input_ids=ids, attention_mask=mask).logits
        with model.disable_adapter():
            without = model(input_ids=ids, attention_mask=mask).logits
        with torch.autocast("cpu", dtype=torch.bfloat16):
            with cpu_bf16.packed_linears(model, torch.bfloat16, merge_lora=True) as patched:
                assert lora in patched and lora.lora_A["default"] in patched  # the whole layer is one matmul
                assert "forward" in vars(lora) and "forward" not in vars(lora.lora_A["default"])
                merged = model(input_ids=ids, attention_mask=mask).logits.float()
            unmerged = model(input_ids=ids, attention_mask=mask).logits.float()
    bf16_error = (unmerged - fp32).abs().max()
    assert (merged - fp32).abs().max() <= 2 * bf16_error + 1e-3  # as close to fp32 as the unmerged bf16 forward
    assert (without - fp32).abs().max() > 10 * bf16_error  # and the adapters did count
    lora.lora_dropout["default"] = nn.Dropout(0.5).train()  # dropout in use: not mergeable, left to peft
    with torch.no_grad(), cpu_bf16.packed_linears(model, torch.bfloat16, merge_lora=True) as patched:
        assert lora not in patched and lora.base_layer in patched


@needs_onednn_bf16
def test_merged_lora_with_zero_adapters_samples_exactly_the_base():
    peft = pytest.importorskip("peft")
    model = add_lora(make_model("llama", eos_bias=1.0),
                     peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    model.eval()  # LoRA B starts at zero: W + s·B·A is W, so the initial policy samples are unchanged
    ids, mask = prompts("llama", [3, 7, 5])
    merged = run(model, ids, mask, max_new_tokens=10, autocast_dtype=torch.bfloat16, merge_lora=True)
    plain = run(model, ids, mask, max_new_tokens=10, autocast_dtype=torch.bfloat16)
    assert torch.equal(merged.response_ids, plain.response_ids) and torch.equal(merged.logprobs, plain.logprobs)


@pytest.mark.parametrize("arch", ALL)
def test_kv_cache_is_one_public_transformers_cache_grown_a_position_a_step(arch, monkeypatch):
    from transformers import DynamicCache, EncoderDecoderCache

    model = make_model(arch, eos_bias=1.0)
    ids, mask = prompts(arch, [3, 7, 5])
    seen, forward = [], model.forward

    def spy(*args, **kwargs):
        assert "past_key_values" not in kwargs
        given = kwargs.get("cache")
        out = forward(*args, **kwargs)
        seen.append((given, out.cache, int(out.cache.get_seq_length())))
        return out

    monkeypatch.setattr(model, "forward", spy)
    r = run(model, ids, mask, max_new_tokens=10, min_new_tokens=10)
    assert r.response_ids.shape[1] == 10 and len(seen) == 10  # the prefill and one step per later token
    cache = seen[0][1]
    assert isinstance(cache, EncoderDecoderCache if arch in SEQ2SEQ else DynamicCache)
    assert seen[0][0] is None and all(given is cache and out is cache for given, out, _ in seen[1:])
    first = 1 if arch in SEQ2SEQ else ids.shape[1]  # the decoder start token, or the whole padded prompt
    assert [length for _, _, length in seen] == list(range(first, first + 10))


@pytest.mark.parametrize("arch", ALL)
def test_rollout_uses_no_deprecated_cache_api(arch):
    """No FutureWarning or DeprecationWarning from transformers' cache API (``past_key_values=`` in a forward,
    ``out.past_key_values``): keywords announced for removal would break the sampler on a later transformers."""
    import warnings

    peft = pytest.importorskip("peft")

    def policy():
        model = make_model(arch)
        if arch == "llama":
            lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
            model = add_lora(model, lora).eval()
        return model

    ids, mask = prompts(arch, [3, 7, 5])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = policy()
        run(model, ids, mask, max_new_tokens=4, mask_model=model)
        # The same model under bf16: its frozen weights' fp32 packs must not be reused there.
        run(model, ids, mask, max_new_tokens=4, autocast_dtype=torch.bfloat16)
    deprecations = [str(w.message) for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))
                    and ("cache" in str(w.message) or "past_key_values" in str(w.message))]
    assert deprecations == []


def test_fp32_attention_runs_attention_in_fp32_outside_autocast(monkeypatch):
    model = make_model("llama")
    ids, mask = prompts("llama", [4, 6])
    with torch.no_grad():
        fp32_logits = model(input_ids=ids, attention_mask=mask).logits
    assert cpu_bf16.use_fp32_attention(model, None) is False  # no autocast: nothing to fix
    assert cpu_bf16.use_fp32_attention(model, torch.bfloat16) is True
    assert model.config._attn_implementation == cpu_bf16.FP32_ATTENTION
    seen = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(query, key, value, *args, **kwargs):
        seen.append((query.dtype, key.dtype, value.dtype, torch.is_autocast_enabled("cpu")))
        return real(query, key, value, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(input_ids=ids, attention_mask=mask).logits
    assert len(seen) == model.config.num_hidden_layers
    assert set(seen) == {(torch.float32, torch.float32, torch.float32, False)}
    torch.testing.assert_close(logits.float(), fp32_logits, atol=0.1, rtol=0)  # the linears still run in bf16
    eager = make_model("llama")
    eager.set_attn_implementation("eager")
    assert cpu_bf16.use_fp32_attention(eager, torch.bfloat16) is False  # only "sdpa" is switched


def test_fp32_attention_keeps_t5s_position_bias():
    model = make_model("t5")
    ids, mask = prompts("t5", [4, 6])
    kw = {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": ids[:, :3]}
    with torch.no_grad():
        fp32_logits = model(**kw).logits
        assert cpu_bf16.use_fp32_attention(model, torch.bfloat16) is True
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(**kw).logits
    torch.testing.assert_close(logits.float(), fp32_logits, atol=0.1, rtol=0)


# ----------------------------------------------------------------------------------------------------------------
# Sampling rules: greedy, top-k, top-p, reproducibility
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ALL)
def test_top_k_1_is_greedy(arch):
    model = make_model(arch)
    ids, mask = prompts(arch, [3, 8, 5])
    r = run(model, ids, mask, max_new_tokens=8, min_new_tokens=8, top_k=1)
    greedy = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=8, min_new_tokens=8,
                            pad_token_id=PAD, eos_token_id=EOS)
    assert torch.equal(r.response_ids, greedy[:, -8:])


class MarkovLM(nn.Module):
    """A 'language model' whose next-token logits are a fixed table row chosen by the last input token, so the
    test knows every step's distribution exactly. Speaks the Hugging Face call convention the sampler uses."""

    def __init__(self, vocab: int = 50, seed: int = 0, scale: float = 3.0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.table = nn.Parameter(torch.randn(vocab, vocab, generator=g) * scale, requires_grad=False)
        self.config = SimpleNamespace(is_encoder_decoder=False)

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None, use_cache=None, **kwargs):
        return SimpleNamespace(logits=self.table[input_ids], cache=None)

    def step_logits(self, ids, mask, r: Rollout) -> torch.Tensor:
        """[B, Tr, V]: the logits each response token was sampled from."""
        prev = torch.cat([ids[:, -1:], r.response_ids[:, :-1]], 1)
        return self.table[prev]


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_top_p_never_samples_outside_the_set(temperature):
    lm = MarkovLM()
    ids = torch.randint(0, 50, (64, 3), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    r = run(lm, ids, mask, max_new_tokens=16, top_p=0.6, temperature=temperature, eos_token_id=None)
    assert r.response_ids.shape == (64, 16)
    allowed = independent_top_p(lm.step_logits(ids, mask, r) / temperature, 0.6)
    assert torch.equal(allowed, top_p_set(lm.step_logits(ids, mask, r) / temperature, 0.6))
    assert allowed.gather(-1, r.response_ids[..., None]).all()
    assert (allowed.sum(-1) > 1).float().mean() > 0.5, "the sets should usually hold several tokens"
    # Without top-p the same model does sample outside those sets: the check above is not vacuous.
    free = run(lm, ids, mask, max_new_tokens=16, temperature=temperature, eos_token_id=None)
    free_allowed = independent_top_p(lm.step_logits(ids, mask, free) / temperature, 0.6)
    assert not free_allowed.gather(-1, free.response_ids[..., None]).all()


def test_top_k_never_samples_outside_the_k_best():
    lm = MarkovLM(seed=2)
    ids = torch.randint(0, 50, (64, 2), generator=torch.Generator().manual_seed(3))
    r = run(lm, ids, torch.ones_like(ids), max_new_tokens=16, top_k=3, eos_token_id=None)
    logits = lm.step_logits(ids, None, r)
    rank = (logits > logits.gather(-1, r.response_ids[..., None])).sum(-1)  # tokens strictly better than the pick
    assert (rank < 3).all() and (rank > 0).any()


def test_min_p_keeps_what_hugging_faces_warper_keeps_and_the_sampler_never_leaves_it():
    from transformers import MinPLogitsWarper

    from elastic_reset.rl.sampling import min_p_filter

    scores = torch.randn(32, 50, generator=torch.Generator().manual_seed(0)) * 3
    for min_p in (0.05, 0.3):
        hf = MinPLogitsWarper(min_p)(None, scores.clone())
        assert torch.equal(min_p_filter(scores, min_p) > -math.inf, hf > -math.inf)
    assert torch.equal(min_p_filter(scores, 0.0), scores)

    lm = MarkovLM(seed=4)
    ids = torch.randint(0, 50, (64, 2), generator=torch.Generator().manual_seed(5))
    r = run(lm, ids, torch.ones_like(ids), max_new_tokens=16, min_p=0.2, temperature=0.8, eos_token_id=None)
    logits = lm.step_logits(ids, None, r) / 0.8
    allowed = MinPLogitsWarper(0.2)(None, logits.reshape(-1, 50).clone()).reshape(logits.shape) > -math.inf
    assert allowed.gather(-1, r.response_ids[..., None]).all()
    assert (allowed.sum(-1) > 1).float().mean() > 0.5, "the sets should usually hold several tokens"
    free = run(lm, ids, torch.ones_like(ids), max_new_tokens=16, temperature=0.8, eos_token_id=None)
    free_logits = lm.step_logits(ids, None, free) / 0.8
    free_allowed = MinPLogitsWarper(0.2)(None, free_logits.reshape(-1, 50).clone()).reshape(free_logits.shape)
    assert not (free_allowed > -math.inf).gather(-1, free.response_ids[..., None]).all()


def test_repetition_penalty_is_hugging_faces_and_the_sampler_repeats_less_of_prompt_and_response():
    from transformers import RepetitionPenaltyLogitsProcessor

    from elastic_reset.rl.sampling import penalize_repetition

    g = torch.Generator().manual_seed(0)
    scores, ids = torch.randn(8, 50, generator=g) * 3, torch.randint(0, 50, (8, 12), generator=g)
    seen = torch.zeros(8, 50, dtype=torch.bool).scatter_(1, ids, True)
    assert torch.allclose(penalize_repetition(scores, seen, 1.7), RepetitionPenaltyLogitsProcessor(1.7)(ids, scores))

    lm = MarkovLM(seed=6, scale=1.0)
    ids = torch.randint(0, 50, (128, 6), generator=torch.Generator().manual_seed(7))

    def repeats(r: Rollout) -> tuple[float, float]:
        """Of the response tokens: the share already in the prompt, and the share earlier in the response."""
        out = r.response_ids
        in_prompt = (out[..., None] == ids[:, None, :]).any(-1).float().mean()
        earlier = torch.stack([(out[:, t:t + 1] == out[:, :t]).any(-1) for t in range(1, out.shape[1])], 1)
        return float(in_prompt), float(earlier.float().mean())

    free = repeats(run(lm, ids, torch.ones_like(ids), max_new_tokens=12, eos_token_id=None))
    penalized = repeats(run(lm, ids, torch.ones_like(ids), max_new_tokens=12, eos_token_id=None,
                            repetition_penalty=20.0))
    assert free[0] > 0.05 and free[1] > 0.05, "without the penalty this model repeats itself"
    assert penalized[0] < free[0] / 2 and penalized[1] < free[1] / 2


def test_min_tokens_to_keep_in_top_p_set():
    logits = torch.tensor([[10.0, 0.0, 0.0, -1.0, -2.0]])
    assert top_p_set(logits, 0.5).tolist() == [[True, False, False, False, False]]
    assert top_p_set(logits, 0.5, min_tokens_to_keep=3).sum() == 3


def test_same_seed_same_samples_other_seed_differs():
    model = make_model("gpt2", eos_bias=2.0)
    ids, mask = left_padded([3, 7, 5, 4])
    a = run(model, ids, mask, seed=7, max_new_tokens=10)
    b = run(model, ids, mask, seed=7, max_new_tokens=10)
    c = run(model, ids, mask, seed=8, max_new_tokens=10)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logprobs, b.logprobs)
    assert not torch.equal(a.response_ids, c.response_ids)


# ----------------------------------------------------------------------------------------------------------------
# NLPO: masked sampling from a mask model
# ----------------------------------------------------------------------------------------------------------------


def mask_sets(mask_model, ids, mask, r: Rollout, top_p: float, min_keep: int) -> torch.Tensor:
    """[B, Tr, V]: the mask model's top-p set at every step, recomputed without cache on unpadded prefixes."""
    sets = torch.ones(*r.response_ids.shape, VOCAB, dtype=torch.bool)
    with torch.no_grad():
        for i in range(len(r)):
            query = ids[i, mask[i].bool()][None]
            n = int(r.response_mask[i].sum())
            if mask_model.config.is_encoder_decoder:
                start = torch.tensor([[mask_model.config.decoder_start_token_id]])
                logits = mask_model(input_ids=query, decoder_input_ids=torch.cat(
                    [start, r.response_ids[i, : n - 1][None]], 1)).logits[0]
            else:
                seq = torch.cat([query, r.response_ids[i, : n - 1][None]], 1)
                logits = mask_model(input_ids=seq).logits[0, query.shape[1] - 1:]
            sets[i, :n] = independent_top_p(logits, top_p, min_keep)
    return sets


def peaked(model, seed: int):
    """Give a tiny random model a peaked next-token distribution (a random bias on the LM head)."""
    head = model.get_output_embeddings()
    head.bias = nn.Parameter(torch.randn(head.out_features, generator=torch.Generator().manual_seed(seed)) * 3)
    return model


@pytest.mark.parametrize("arch", ["llama", "t5"])
def test_nlpo_samples_inside_the_mask_models_top_p_set(arch):
    policy = make_model(arch, seed=0, eos_bias=3.0)
    mask_model = peaked(make_model(arch, seed=1), seed=5)
    ids, mask = prompts(arch, [3, 8, 5, 6])
    r = run(policy, ids, mask, max_new_tokens=10, mask_model=mask_model, mask_top_p=0.8, min_tokens_to_keep=2)
    assert r.action_mask.shape == (*r.response_ids.shape, VOCAB) and r.action_mask.dtype == torch.bool
    valid = r.response_mask.bool()
    expected = mask_sets(mask_model, ids, mask, r, 0.8, 2)
    assert torch.equal(r.action_mask[valid], expected[valid])
    assert r.action_mask.gather(-1, r.response_ids[..., None]).squeeze(-1)[valid].all()
    assert r.action_mask[~valid].all()  # padding positions are unrestricted
    sizes = r.action_mask[valid].sum(-1).float()
    assert sizes.min() >= 2 and sizes.mean() < VOCAB / 4, "the mask should actually restrict the policy"

    # Unmasked log-probs match the plain teacher-forced pass; masked ones match it with the action mask.
    torch.testing.assert_close(forward_response(policy, r).logprobs.detach(), r.logprobs, atol=1e-5, rtol=0)
    masked = forward_response(policy, r, action_mask=r.action_mask)
    logits = forward_response(policy, r, return_logits=True).logits.detach()
    expected = torch.log_softmax(logits.masked_fill(~r.action_mask, float("-inf")), -1)
    expected = expected.gather(-1, r.response_ids[..., None]).squeeze(-1)
    torch.testing.assert_close(masked.logprobs.detach()[valid], expected[valid], atol=1e-5, rtol=0)
    assert (masked.logprobs[valid] >= r.logprobs[valid] - 1e-6).all()
    assert torch.isfinite(masked.entropy).all()


@pytest.mark.parametrize("arch", ["llama", "bart"])
def test_nlpo_through_static_steps_masks_and_samples_as_the_dynamic_cache(arch):
    policy = make_model(arch, seed=0, eos_bias=3.0)
    mask_model = peaked(make_model(arch, seed=1), seed=5)
    ids, mask = prompts(arch, [3, 8, 5, 6])
    settings = dict(max_new_tokens=10, mask_model=mask_model, mask_top_p=0.8, min_tokens_to_keep=2)
    dynamic, static = run(policy, ids, mask, **settings), run(policy, ids, mask, cuda_graphs=True, **settings)
    assert torch.equal(static.response_ids, dynamic.response_ids)
    assert torch.equal(static.action_mask, dynamic.action_mask)


def test_nlpo_min_tokens_to_keep():
    policy = make_model("llama", seed=0)
    mask_model = make_model("llama", seed=1)
    ids, mask = left_padded([3, 5])
    r = run(policy, ids, mask, max_new_tokens=6, min_new_tokens=6, mask_model=mask_model, mask_top_p=1e-6,
            min_tokens_to_keep=7)
    assert r.action_mask.sum(-1).eq(7).all()
    assert r.action_mask.gather(-1, r.response_ids[..., None]).all()


# ----------------------------------------------------------------------------------------------------------------
# Rollout container and config validation
# ----------------------------------------------------------------------------------------------------------------


def test_rollout_select_to_len():
    policy, mask_model = make_model("llama", seed=0), make_model("llama", seed=1)
    ids, mask = left_padded([3, 8, 5])
    r = run(policy, ids, mask, max_new_tokens=4, mask_model=mask_model)
    sub = r.select([2, 0])
    assert len(sub) == 2
    assert torch.equal(sub.query_ids, ids[[2, 0]]) and torch.equal(sub.response_ids, r.response_ids[[2, 0]])
    assert torch.equal(sub.action_mask, r.action_mask[[2, 0]])
    assert torch.equal(r.select(torch.tensor([1])).logprobs, r.logprobs[1:2])
    assert len(r.select(slice(0, 2))) == 2
    moved = r.to("cpu")
    assert len(moved) == 3 and torch.equal(moved.action_mask, r.action_mask)


@pytest.mark.parametrize("field,value", [
    ("max_new_tokens", 0), ("min_new_tokens", -1), ("temperature", 0.0), ("temperature", -1.0),
    ("top_p", 0.0), ("top_p", 1.5), ("top_k", -1),
])
def test_bad_config_raises_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingConfig(**{field: value})


def test_min_above_max_raises():
    with pytest.raises(ValueError, match="min_new_tokens"):
        SamplingConfig(max_new_tokens=4, min_new_tokens=5)


@pytest.mark.parametrize("masked", [False, True])
def test_forward_response_entropy_is_the_categorical_entropy_and_its_gradient(masked):
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 11, requires_grad=True)
    allowed = torch.rand(2, 3, 11) > 0.4 if masked else None
    if masked:
        allowed[..., 0] = True

    class Fixed(torch.nn.Module):  # a "model" whose logits are the leaf above, whatever the input
        config = type("C", (), {"is_encoder_decoder": False})()

        def forward(self, input_ids, **kwargs):
            pad = torch.zeros(input_ids.shape[0], input_ids.shape[1] - logits.shape[1], logits.shape[2])
            return type("O", (), {"logits": torch.cat([pad, logits], dim=1), "hidden_states": None})()

    query = torch.ones(2, 2, dtype=torch.long)
    response = torch.randint(0, 11, (2, 3))
    if masked:
        response = torch.where(allowed.gather(-1, response[..., None]).squeeze(-1), response, 0)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    batch = Rollout(query, query, response, mask, torch.zeros_like(mask))
    out = forward_response(Fixed(), batch, action_mask=allowed, entropy_grad=True)
    ref_logits = logits if allowed is None else logits.masked_fill(~allowed, float("-inf"))
    expected = torch.distributions.Categorical(logits=ref_logits).entropy() * mask
    assert torch.allclose(out.entropy, expected, atol=1e-6)
    grad, = torch.autograd.grad(out.entropy.sum(), logits, retain_graph=True)
    expected_grad, = torch.autograd.grad(expected.sum(), logits)
    assert torch.allclose(grad, expected_grad, atol=1e-6)


# ----------------------------------------------------------------- static steps: CUDA graphs on a GPU
@pytest.mark.parametrize("arch", ALL)
@pytest.mark.parametrize("autocast_dtype", [None, torch.bfloat16])
def test_static_steps_sample_what_the_dynamic_cache_samples(arch, autocast_dtype):
    from elastic_reset.lm import static_decoding

    model = make_model(arch, eos_bias=2.0)
    settings = dict(max_new_tokens=10, min_new_tokens=1, autocast_dtype=autocast_dtype)
    atol = 1e-5 if autocast_dtype is None else 0.05  # bf16: attention over the whole (masked) cache rounds otherwise
    for lengths in ([3, 7, 5], [12, 2, 40]):  # the second is past the first prompt bucket (32 tokens)
        ids, mask = prompts(arch, lengths)
        dynamic = run(model, ids, mask, **settings)
        static = run(model, ids, mask, cuda_graphs=True, **settings)
        assert torch.equal(static.response_ids, dynamic.response_ids)
        torch.testing.assert_close(static.logprobs, dynamic.logprobs, atol=atol, rtol=0)
    ids, mask = prompts(arch, [9, 4, 6])  # the first bucket again: its cache is reused, after other prompts
    assert len(static_decoding._STATES[model][1]) == 2
    torch.testing.assert_close(run(model, ids, mask, cuda_graphs=True, **settings).logprobs,
                               run(model, ids, mask, **settings).logprobs, atol=atol, rtol=0)


def test_static_steps_are_made_anew_when_the_parameters_or_adapters_change_not_when_updated_in_place():
    from elastic_reset.lm import static_decoding

    peft = pytest.importorskip("peft")
    model = add_lora(make_model("llama"), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    model.eval()
    ids, mask = left_padded([3, 7, 5])
    run(model, ids, mask, max_new_tokens=6, cuda_graphs=True)
    held = static_decoding._STATES[model]
    with torch.no_grad():  # an optimizer step: in place, so a captured graph reads the new weights
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p))
    static = run(model, ids, mask, max_new_tokens=6, cuda_graphs=True)
    assert static_decoding._STATES[model] is held
    assert torch.equal(static.response_ids, run(model, ids, mask, max_new_tokens=6).response_ids)
    with model.disable_adapter():  # the adapters off (the KL reference's view of the model)
        run(model, ids, mask, max_new_tokens=6, cuda_graphs=True)
    assert static_decoding._STATES[model][0] != held[0]
    held = static_decoding._STATES[model]
    run(model, ids, mask, max_new_tokens=6, cuda_graphs=True)  # adapters back on: another fingerprint again
    assert static_decoding._STATES[model][0] != held[0]
    held = static_decoding._STATES[model]
    layer = model.base_model.model.model.layers[0].mlp.up_proj
    layer.weight = nn.Parameter(layer.weight.detach().clone(), requires_grad=False)  # a new tensor
    run(model, ids, mask, max_new_tokens=6, cuda_graphs=True)
    assert static_decoding._STATES[model][0] != held[0]


@pytest.mark.parametrize("device, autocast_dtype", [
    ("cpu", None), ("cpu", torch.bfloat16),
    pytest.param("cuda", None, marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                            reason="needs a CUDA device")])])
def test_static_steps_multiply_by_kept_merged_lora_weights_refreshed_in_place(device, autocast_dtype):
    from elastic_reset.lm import static_decoding

    peft = pytest.importorskip("peft")
    model = add_lora(make_model("llama", eos_bias=2.0), peft.LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                                                                        target_modules=["q_proj", "v_proj"]))
    model.eval().to(device)
    ids, mask = (t.to(device) for t in left_padded([3, 7, 5]))
    settings = dict(max_new_tokens=10, min_new_tokens=1, autocast_dtype=autocast_dtype, merge_lora=True)
    lora = model.base_model.model.model.layers[0].self_attn.q_proj
    head = model.base_model.model.lm_head.weight
    adapter_calls = []
    lora.lora_A["default"].register_forward_hook(lambda *_: adapter_calls.append(1))
    atol = 0.05 if autocast_dtype is not None else 1e-5 if device == "cpu" else 1e-4

    def check():  # the dynamic sampler merges on a CPU as well (packed_linears); on a GPU it runs the adapters
        static = run(model, ids, mask, cuda_graphs=True, **settings)
        calls = len(adapter_calls)  # the static steps' own, before the dynamic sampler's
        dynamic = run(model, ids, mask, **settings)
        del adapter_calls[calls:]
        assert torch.equal(static.response_ids, dynamic.response_ids)
        torch.testing.assert_close(static.logprobs, dynamic.logprobs, atol=atol, rtol=0)

    check()
    assert not adapter_calls  # one matmul by W + s·BA per layer, no adapter branch
    kept = dict(static_decoding._WEIGHTS[lora])
    held = static_decoding._STATES[model]
    assert "forward" not in vars(lora) and model.base_model.model.lm_head.weight is head  # the model put back
    if autocast_dtype is not None:
        head_copy = static_decoding._WEIGHTS[model.base_model.model.lm_head]["weight", autocast_dtype]
        assert head_copy.dtype == autocast_dtype
    with torch.no_grad():  # an optimizer step on the adapters, in place
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p))
    check()  # the kept merged weights hold the new adapters...
    assert all(static_decoding._WEIGHTS[lora][name] is tensor for name, tensor in kept.items())
    assert static_decoding._STATES[model] is held  # ...in the same tensors: a captured graph stays valid
    run(model, ids, mask, cuda_graphs=True, **{**settings, "merge_lora": False})
    assert adapter_calls and static_decoding._STATES[model][0] != held[0]  # unmerged: other steps, not these
    other = None if autocast_dtype is not None else torch.bfloat16  # a rollout in the other precision between
    run(model, ids, mask, cuda_graphs=True, **{**settings, "autocast_dtype": other})
    assert all(static_decoding._WEIGHTS[lora][key] is tensor for key, tensor in kept.items())  # what graphs read


def test_static_steps_refuse_a_model_transformers_does_not_run_over_a_static_cache():
    from transformers import MambaConfig, MambaForCausalLM

    model = MambaForCausalLM(MambaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1)).eval()  # no attention
    ids, mask = left_padded([3, 5])
    with pytest.raises(ConfigError, match="sampling.cuda_graphs: MambaForCausalLM cannot decode over a static KV"):
        run(model, ids, mask, max_new_tokens=4, cuda_graphs=True)
    assert run(model, ids, mask, max_new_tokens=4).response_ids.shape == (2, 4)  # the default path decodes it


@pytest.mark.parametrize("arch", ALL)
def test_a_static_step_has_no_host_sync(arch):
    """A CUDA graph cannot hold a host sync (a tensor read in an `if`); dynamo's full-graph trace refuses one too,
    which is how a CPU can check that a static step is capturable."""
    from elastic_reset.lm.static_decoding import (StaticDecoderStepper, StaticSeq2SeqStepper, decoder_step,
                                                  seq2seq_step)

    model = make_model(arch)
    ids, mask = prompts(arch, [3, 7, 5])
    with torch.inference_mode():
        stepper = (StaticSeq2SeqStepper if arch in SEQ2SEQ else StaticDecoderStepper)(model, ids, mask, 8, None)
        stepper.prefill()
        stepper.step(torch.tensor([5, 6, 7]))
        torch._dynamo.reset()
        step = seq2seq_step if arch in SEQ2SEQ else decoder_step
        torch.compile(step, backend="eager", fullgraph=True)(model, stepper.state, None)


def test_compiled_static_steps_sample_what_uncompiled_ones_do_compiled_once_and_reading_updated_weights(monkeypatch):
    """sampling.compile: inductor's step (here its CPU code) samples the very tokens of the uncompiled static step,
    both multiplying by the kept merged LoRA weights; a later rollout of the same shape, after an in-place update of
    every weight, compiles nothing new and reads the new weights (the kept copies refreshed in place)."""
    from torch._dynamo.utils import counters

    from elastic_reset.lm import static_decoding

    peft = pytest.importorskip("peft")
    model = add_lora(make_model("llama", eos_bias=2.0), peft.LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                                                                        target_modules=["q_proj", "v_proj"])).eval()
    ids, mask = prompts("llama", [3, 7, 5])
    settings = dict(max_new_tokens=8, min_new_tokens=1, cuda_graphs=True, merge_lora=True)
    torch._dynamo.reset()
    before = counters["stats"]["unique_graphs"]
    compiled, plain = run(model, ids, mask, compile=True, **settings), run(model, ids, mask, **settings)
    assert torch.equal(compiled.response_ids, plain.response_ids)
    torch.testing.assert_close(compiled.logprobs, plain.logprobs, atol=1e-5, rtol=0)
    graphs = counters["stats"]["unique_graphs"]
    assert graphs == before + 1  # one compilation for every step of the rollout
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)  # in place, as an optimizer step
    compiled, plain = run(model, ids, mask, compile=True, **settings), run(model, ids, mask, **settings)
    assert counters["stats"]["unique_graphs"] == graphs
    assert torch.equal(compiled.response_ids, plain.response_ids)
    torch.testing.assert_close(compiled.logprobs, plain.logprobs, atol=1e-5, rtol=0)
    # Each shape of step is one more compilation of the same function, under the module's own recompile limit.
    monkeypatch.setattr(static_decoding, "RECOMPILE_LIMIT", 1)
    with pytest.raises(torch._dynamo.exc.FailOnRecompileLimitHit):
        run(model, *prompts("llama", [3, 7]), compile=True, **settings)


def test_compile_needs_cuda_graphs():
    with pytest.raises(ConfigError, match="sampling.compile: needs sampling.cuda_graphs: true"):
        SamplingConfig(compile=True)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (a GPU machine)")
@pytest.mark.parametrize("arch", ALL)
@pytest.mark.parametrize("autocast_dtype", [None, torch.bfloat16])
def test_cuda_graph_steps_sample_what_eager_steps_sample_and_follow_in_place_updates(arch, autocast_dtype):
    from elastic_reset.lm import static_decoding

    model = make_model(arch, eos_bias=2.0).cuda()
    for lengths in ([3, 7, 5], [12, 2, 40], [9, 4, 6]):
        ids, mask = (t.cuda() for t in prompts(arch, lengths))
        graphs = run(model, ids, mask, max_new_tokens=10, min_new_tokens=1, cuda_graphs=True,
                     autocast_dtype=autocast_dtype)
        dynamic = run(model, ids, mask, max_new_tokens=10, min_new_tokens=1, autocast_dtype=autocast_dtype)
        assert torch.equal(graphs.response_ids, dynamic.response_ids)
        torch.testing.assert_close(graphs.logprobs, dynamic.logprobs, atol=1e-4 if autocast_dtype is None else 0.05,
                                   rtol=0)
    assert all(state.graph is not None for state in static_decoding._STATES[model][1].values())
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)  # in place, as an optimizer step: the captured graphs must read the new weights
    ids, mask = (t.cuda() for t in prompts(arch, [3, 7, 5]))
    torch.testing.assert_close(run(model, ids, mask, max_new_tokens=10, cuda_graphs=True).logprobs,
                               run(model, ids, mask, max_new_tokens=10).logprobs, atol=1e-4, rtol=0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (a GPU machine)")
def test_compiled_cuda_graph_steps_sample_what_eager_steps_sample_and_follow_in_place_updates():
    """sampling.compile on a GPU: inductor's kernels (triton) captured in the graphs."""
    model = make_model("llama", eos_bias=2.0).cuda()
    settings = dict(max_new_tokens=10, min_new_tokens=1, autocast_dtype=torch.bfloat16)
    ids, mask = (t.cuda() for t in prompts("llama", [3, 7, 5]))
    for _ in range(2):
        graphs = run(model, ids, mask, cuda_graphs=True, compile=True, **settings)
        dynamic = run(model, ids, mask, **settings)
        assert torch.equal(graphs.response_ids, dynamic.response_ids)
        torch.testing.assert_close(graphs.logprobs, dynamic.logprobs, atol=0.05, rtol=0)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1.5)  # the second round reads the updated weights through the same graphs
