"""Sampling: draw responses from a policy with a KV cache, recording what the RL update needs.

:func:`sample` is a hand-written sampling loop (not ``model.generate``): one prefill forward over the prompts, then
one single-token forward per new token against the model's own KV cache (transformers' public ``DynamicCache``,
passed as ``cache=`` and read back from ``out.cache``), under ``torch.inference_mode()`` and, optionally, bf16
autocast. It records what the RL update needs and ``generate`` does not give cheaply: the
log-probability of every sampled token, the response mask (1 up to and including EOS), and, for NLPO, the action
mask of every step. It works for decoder-only models (left-padded prompts; position ids come from the attention
mask, so padding never shifts positions) and for encoder-decoder models (the encoder runs once; the decoder starts
from ``config.decoder_start_token_id`` and caches its own keys and values).
With ``sampling.cuda_graphs`` the same loop runs its forwards over a static KV cache instead, each decoding step
a replayed CUDA graph on a GPU (:mod:`elastic_reset.lm.static_decoding`).

:attr:`Rollout.logprobs` is ``log softmax(logits / T)`` at the sampled token: the policy at temperature T,
**before** any truncation: no repetition penalty, no min-new-tokens EOS suppression, no top-k, top-p or min-p, no
NLPO mask. That is the
distribution :func:`elastic_reset.lm.scoring.forward_response` reproduces teacher-forced, and the one the policy
gradient and the KL penalty are taken on (as in TRL and RL4LMs, whose PPO log-probs ignore the sampling warpers).
NLPO's masked distribution is recovered by ``forward_response(..., action_mask=rollout.action_mask)``.

The sampling itself follows Hugging Face's processors and warpers in their order: repetition penalty → EOS
suppression before ``min_new_tokens`` → NLPO mask → temperature (which commutes with the penalty) → top-k → top-p →
min-p → a draw from the caller's generator
(:func:`sample_from_logits`: inverse-CDF sampling, the distribution of ``torch.multinomial`` at a tenth of its
CPU cost).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence

import torch

from elastic_reset.lm.cpu_bf16 import packed_linears, precast_weights
from elastic_reset.lm.rollout import Rollout
from elastic_reset.lm.scoring import (
    NEG_INF,
    accepts_logits_to_keep,
    autocast,
    check_query,
    decoder_start_id,
    is_encoder_decoder,
    position_ids_from_mask,
)
from elastic_reset.lm.static_decoding import StaticDecoderStepper, StaticSeq2SeqStepper, static_weights
from elastic_reset.rl.config import SamplingConfig

__all__ = ["Rollout", "SamplingConfig", "min_p_filter", "penalize_repetition", "sample", "sample_from_logits",
           "top_k_filter", "top_p_filter", "top_p_set"]


# --------------------------------------------------------------------------------------------------------------
# Logit filters (Hugging Face's warpers, functional)
# --------------------------------------------------------------------------------------------------------------


def top_k_filter(scores: torch.Tensor, top_k: int, min_tokens_to_keep: int = 1) -> torch.Tensor:
    """``scores`` with every logit below the k-th largest set to −inf (Hugging Face's ``TopKLogitsWarper``).
    ``top_k <= 0`` or ``>= V`` returns the input."""
    k = min(max(top_k, min_tokens_to_keep), scores.shape[-1])
    if top_k <= 0 or k >= scores.shape[-1]:
        return scores
    kth = torch.topk(scores, k, dim=-1).values[..., -1:]
    return scores.masked_fill(scores < kth, NEG_INF)


def top_p_set(logits: torch.Tensor, top_p: float, min_tokens_to_keep: int = 1) -> torch.Tensor:
    """Bool mask of the top-p (nucleus) set of ``softmax(logits)``: the most likely tokens whose cumulative
    probability reaches ``top_p``, at least ``min_tokens_to_keep`` of them. Same set as Hugging Face's
    ``TopPLogitsWarper``: a token is kept iff the mass of the strictly more likely tokens is < ``top_p``.

    Computed from ``torch.topk`` of a growing k (256, then x8) rather than a full sort: on a CPU a full sort of a
    large vocabulary costs far more than its top 256, and a nucleus rarely needs more.
    """
    vocab = logits.shape[-1]
    if top_p >= 1.0:
        return torch.ones_like(logits, dtype=torch.bool)
    logits = logits.float()
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)
    k = min(vocab, max(min_tokens_to_keep, 256))
    while True:
        values, index = torch.topk(logits, k, dim=-1)  # descending
        probs = (values - lse).exp()
        inclusive = probs.cumsum(dim=-1)
        # Done when every row's nucleus ends inside the top k: the (k+1)-th token then has mass >= p above it.
        if k == vocab or bool((inclusive[..., -1] >= top_p).all()):
            break
        k = min(vocab, k * 8)
    keep = (inclusive - probs) < top_p
    keep[..., :min_tokens_to_keep] = True
    return torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, index, keep)


def top_p_filter(scores: torch.Tensor, top_p: float, min_tokens_to_keep: int = 1) -> torch.Tensor:
    """``scores`` with the logits outside the top-p set (:func:`top_p_set`) set to −inf. ``top_p >= 1`` is a no-op."""
    if top_p >= 1.0:
        return scores
    return scores.masked_fill(~top_p_set(scores, top_p, min_tokens_to_keep), NEG_INF)


def min_p_filter(scores: torch.Tensor, min_p: float) -> torch.Tensor:
    """``scores`` with the logits of tokens less than ``min_p`` times as likely as the most likely one set to −inf
    (Hugging Face's ``MinPLogitsWarper``, which keeps the top token). ``min_p <= 0`` is a no-op."""
    if min_p <= 0.0:
        return scores
    # p_i < min_p * p_max  <=>  s_i < s_max + log(min_p): no softmax needed
    return scores.masked_fill(scores < scores.amax(dim=-1, keepdim=True) + math.log(min_p), NEG_INF)


def penalize_repetition(scores: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """``scores`` with each ``seen`` token's logit divided by ``penalty`` where positive, multiplied where negative
    (Hugging Face's ``RepetitionPenaltyLogitsProcessor``). ``seen``: ``[B, V]`` bool. Temperature commutes with it."""
    if penalty == 1.0:
        return scores
    return torch.where(seen, torch.where(scores > 0, scores / penalty, scores * penalty), scores)


def sample_from_logits(scores: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """``[B]`` token ids drawn from ``softmax(scores)`` (−inf = never) by inverse-CDF sampling: one uniform per row
    from ``generator``, searched in the cumulative distribution. The same distribution as ``torch.multinomial(probs,
    1)`` and reproducible from the generator, but much faster on a CPU for a large vocabulary. A zero-probability
    token is never drawn: the CDF is flat across it and the search is right-sided; a uniform that rounds up to the
    total picks the last token of positive probability."""
    probs = torch.softmax(scores.float(), dim=-1)
    cdf = probs.cumsum(dim=-1)
    total = cdf[..., -1:].contiguous()
    u = torch.rand(total.shape, generator=generator, dtype=cdf.dtype, device=cdf.device)
    index = torch.searchsorted(cdf, u * total, right=True)
    last_positive = torch.searchsorted(cdf, total, right=False)
    return torch.minimum(index, last_positive).squeeze(-1)


# --------------------------------------------------------------------------------------------------------------
# Model plumbing
# --------------------------------------------------------------------------------------------------------------


class _DecoderStepper:
    """Prefill + single-token steps of a decoder-only model over its own KV cache."""

    def __init__(self, model, query_ids, query_mask, max_new_tokens: int, autocast_dtype):
        self.model, self.query_ids, self.query_mask = model, query_ids, query_mask
        self.autocast_dtype = autocast_dtype
        batch, self.tq = query_ids.shape
        self.padded = not bool(query_mask.bool().all())
        # One preallocated mask: prompt mask, then ones for every generated token (finished rows keep feeding pad
        # tokens with mask 1; nothing valid ever attends to them, since they come after the row's EOS).
        self.attn = torch.ones(batch, self.tq + max_new_tokens, dtype=torch.long, device=query_ids.device)
        self.attn[:, : self.tq] = query_mask
        self.next_pos = query_mask.long().sum(-1, keepdim=True)  # position of the first generated token
        # The model builds transformers' DynamicCache at the prefill; a StaticCache attends over its whole capacity,
        # which rounds differently (sampling.cuda_graphs: log-probs equal to rounding).
        self.cache = None
        self.t = 0

    def prefill(self) -> torch.Tensor:
        extra = {"logits_to_keep": 1} if accepts_logits_to_keep(self.model) else {}
        with autocast(self.model, self.autocast_dtype):
            out = self.model(input_ids=self.query_ids,
                             attention_mask=self.attn[:, : self.tq] if self.padded else None,
                             position_ids=position_ids_from_mask(self.query_mask),
                             cache=self.cache, use_cache=True, **extra)
        self.cache = out.cache
        return out.logits[:, -1]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        with autocast(self.model, self.autocast_dtype):
            out = self.model(input_ids=tokens[:, None],
                             attention_mask=self.attn[:, : self.tq + self.t + 1] if self.padded else None,
                             position_ids=self.next_pos + self.t,
                             cache=self.cache, use_cache=True)
        self.cache = out.cache
        self.t += 1
        return out.logits[:, -1]


class _Seq2SeqStepper:
    """Encoder once, then single-token decoder steps over the decoder's KV cache."""

    def __init__(self, model, query_ids, query_mask, max_new_tokens: int, autocast_dtype):
        self.model, self.query_ids, self.query_mask = model, query_ids, query_mask
        self.autocast_dtype = autocast_dtype
        self.cache = None
        self.encoder_outputs = None

    def prefill(self) -> torch.Tensor:
        start = torch.full((self.query_ids.shape[0],), decoder_start_id(self.model), dtype=torch.long,
                           device=self.query_ids.device)
        with autocast(self.model, self.autocast_dtype):
            self.encoder_outputs = self.model.get_encoder()(input_ids=self.query_ids, attention_mask=self.query_mask,
                                                            return_dict=True)
        return self.step(start)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        with autocast(self.model, self.autocast_dtype):
            out = self.model(encoder_outputs=self.encoder_outputs, attention_mask=self.query_mask,
                             decoder_input_ids=tokens[:, None], cache=self.cache, use_cache=True)
        self.cache = out.cache
        return out.logits[:, -1]


def _stepper(model, query_ids, query_mask, max_new_tokens, autocast_dtype, static: bool, compile: bool):
    if static:
        cls = StaticSeq2SeqStepper if is_encoder_decoder(model) else StaticDecoderStepper
        return cls(model, query_ids, query_mask, max_new_tokens, autocast_dtype, compile)
    cls = _Seq2SeqStepper if is_encoder_decoder(model) else _DecoderStepper
    return cls(model, query_ids, query_mask, max_new_tokens, autocast_dtype)


def _eos_tensor(eos_token_id, device) -> torch.Tensor | None:
    if eos_token_id is None:
        return None
    ids = torch.as_tensor(eos_token_id, dtype=torch.long, device=device).flatten()
    return ids if ids.numel() else None


# --------------------------------------------------------------------------------------------------------------
# Sampling
# --------------------------------------------------------------------------------------------------------------


def sample(model, query_ids: torch.Tensor, query_mask: torch.Tensor, config: SamplingConfig, *,
           pad_token_id: int, eos_token_id: int | Sequence[int] | None,
           generator: torch.Generator | None = None, mask_model=None, mask_top_p: float = 0.9,
           min_tokens_to_keep: int = 1, autocast_dtype: torch.dtype | None = None) -> Rollout:
    """Sample one response per prompt with the model's KV cache; see the module docstring for the distributions.

    Args:
        model: an ``AutoModelForCausalLM`` (prompts LEFT-padded) or ``AutoModelForSeq2SeqLM`` (detected through
            ``model.config.is_encoder_decoder``), plain or wrapped by peft. Its train/eval mode is left as is: call
            ``model.eval()`` first if it has dropout, or the recorded log-probs are noisy.
        query_ids, query_mask: ``[B, Tq]`` prompts and their attention mask, on the model's device.
        config: lengths, temperature, top-k, top-p, EOS handling.
        pad_token_id: fills the responses after EOS.
        eos_token_id: one id or several (any of them ends a response); None: no EOS.
        generator: the random source of the draws: the same seed gives the same samples.
        mask_model: NLPO (Ramamurthy et al., 2022): a model over the same vocabulary (e.g. a delayed copy of the
            policy) run in lockstep with its own KV cache; at each step the policy samples only inside the mask
            model's top-p set (temperature 1, EOS excluded before ``min_new_tokens``), recorded in
            :attr:`Rollout.action_mask`.
        mask_top_p: p of the mask model's top-p set (RL4LMs' ``top_mask``; 0.9 in the paper's NLPO runs).
        min_tokens_to_keep: the mask set keeps at least this many tokens (RL4LMs used 100). The policy's own top-k
            and top-p keep at least one token, as Hugging Face's defaults do.
        autocast_dtype: e.g. ``torch.bfloat16``: forwards run under ``torch.autocast`` on the model's device type;
            the sampling arithmetic and log-probs stay fp32.
    """
    if not isinstance(config, SamplingConfig):
        raise TypeError(f"config: expected a SamplingConfig, got {type(config).__name__}")
    if not 0 < mask_top_p <= 1:
        raise ValueError(f"mask_top_p: must be in (0, 1], got {mask_top_p!r}")
    if min_tokens_to_keep < 1:
        raise ValueError(f"min_tokens_to_keep: must be >= 1, got {min_tokens_to_keep!r}")
    check_query(model, query_ids, query_mask)
    if mask_model is not None and is_encoder_decoder(mask_model) != is_encoder_decoder(model):
        raise ValueError("mask_model: must be of the same kind (decoder-only or encoder-decoder) as the policy")

    device = query_ids.device
    batch, max_new = query_ids.shape[0], config.max_new_tokens
    eos = _eos_tensor(eos_token_id, device)
    temperature = float(config.temperature)

    with contextlib.ExitStack() as stack:
        # Cast the linear weights once for the whole loop (autocast would recast them at every token); on a CPU,
        # pack them for oneDNN too. precast_weights then only sees what packing left (e.g. GPT-2's Conv1D).
        # Static steps replay graphs, which need the same tensors every rollout: copies kept and refreshed in place.
        static = config.cuda_graphs
        models = (model,) if mask_model is None or mask_model is model else (model, mask_model)
        for m in models:
            if static:
                stack.enter_context(static_weights(m, autocast_dtype, merge_lora=config.merge_lora))
                continue
            packed = stack.enter_context(packed_linears(m, autocast_dtype, batch_hint=batch,
                                                        merge_lora=config.merge_lora))
            stack.enter_context(precast_weights(m, autocast_dtype, trainable=True, skip=packed))
        stack.enter_context(torch.inference_mode())
        policy = _stepper(model, query_ids, query_mask, max_new, autocast_dtype, static, config.compile)
        masker = None if mask_model is None else _stepper(mask_model, query_ids, query_mask, max_new,
                                                          autocast_dtype, static, config.compile)
        tokens = torch.full((batch, max_new), pad_token_id, dtype=torch.long, device=device)
        active_mask = torch.zeros(batch, max_new, dtype=torch.bool, device=device)
        logprobs = torch.zeros(batch, max_new, dtype=torch.float32, device=device)
        action_mask = None
        finished = torch.zeros(batch, dtype=torch.bool, device=device)

        logits = policy.prefill()
        mask_logits = masker.prefill() if masker is not None else None
        vocab = logits.shape[-1]
        if masker is not None:
            if mask_logits.shape[-1] != vocab:
                raise ValueError(f"mask_model: vocabulary size {mask_logits.shape[-1]} differs from the "
                                 f"policy's {vocab}")
            action_mask = torch.ones(batch, max_new, vocab, dtype=torch.bool, device=device)

        seen = None  # repetition_penalty: the tokens of each prompt (a decoder-only one) and response so far
        if config.repetition_penalty != 1.0:
            counts = torch.zeros(batch, vocab, dtype=torch.long, device=device)
            if not is_encoder_decoder(model):
                counts.scatter_add_(1, query_ids, query_mask.long())
            seen = counts > 0

        steps = 0
        for t in range(max_new):
            scores = logits.float()
            if temperature != 1.0:
                scores = scores / temperature
            full_logprobs = torch.log_softmax(scores, dim=-1)
            if seen is not None:
                scores = penalize_repetition(scores, seen, config.repetition_penalty)
            suppress_eos = eos is not None and t < config.min_new_tokens
            if suppress_eos:
                scores = scores.index_fill(-1, eos, NEG_INF)
            if masker is not None:
                mask_scores = mask_logits.float()
                if suppress_eos:
                    mask_scores = mask_scores.index_fill(-1, eos, NEG_INF)
                allowed = top_p_set(mask_scores, mask_top_p, min_tokens_to_keep)
                if suppress_eos:
                    allowed.index_fill_(-1, eos, False)
                scores = scores.masked_fill(~allowed, NEG_INF)
            if config.top_k > 0:
                scores = top_k_filter(scores, config.top_k)
            if config.top_p < 1.0:
                scores = top_p_filter(scores, config.top_p)
            if config.min_p > 0.0:
                scores = min_p_filter(scores, config.min_p)
            next_tokens = sample_from_logits(scores, generator)

            active = ~finished
            next_tokens = torch.where(active, next_tokens, pad_token_id)
            tokens[:, t] = next_tokens
            active_mask[:, t] = active
            picked = next_tokens[:, None]
            if seen is not None:
                seen.scatter_(1, picked, True)
            logprobs[:, t] = full_logprobs.gather(-1, picked).squeeze(-1).masked_fill(finished, 0.0)
            if masker is not None:
                action_mask[:, t] = allowed | finished[:, None]
            steps = t + 1
            if config.stop_at_eos and eos is not None:
                finished = finished | (active & torch.isin(next_tokens, eos))
                # Reading `finished` on the host stalls a GPU's launch queue (BENCHMARKS.md): skip it while
                # EOS is suppressed, since nothing can finish then.
                if not suppress_eos and bool(finished.all()):
                    break
            if steps == max_new:
                break
            logits = policy.step(next_tokens)
            if masker is not None:
                mask_logits = masker.step(next_tokens)

    # Leave inference mode: clones are ordinary tensors that autograd may save (inference tensors cannot be).
    return Rollout(
        query_ids=query_ids,
        query_mask=query_mask,
        response_ids=tokens[:, :steps].clone(),
        response_mask=active_mask[:, :steps].float(),
        logprobs=logprobs[:, :steps].clone(),
        action_mask=None if action_mask is None else action_mask[:, :steps].clone(),
    )


