"""Rollouts: sample responses from a policy with a KV cache, and re-score them in one teacher-forced pass.

:func:`sample` is a hand-written sampling loop (not ``model.generate``): one prefill forward over the prompts, then
one single-token forward per new token against the model's own KV cache, under ``torch.inference_mode()`` and,
optionally, bf16 autocast. It records what the RL update needs and ``generate`` does not give cheaply: the
log-probability of every sampled token, the response mask (1 up to and including EOS), and, for NLPO, the action
mask of every step. It works for decoder-only models (left-padded prompts; position ids come from the attention
mask, so padding never shifts positions) and for encoder-decoder models (the encoder runs once; the decoder starts
from ``config.decoder_start_token_id`` and caches its own keys and values).

:func:`forward_response` is the matching teacher-forced forward (with grad, for the PPO / REINFORCE update): for a
model without dropout its ``logprobs`` equal :attr:`Rollout.logprobs` (fp32; bf16 autocast agrees to bf16 noise).

Which distribution the log-probs are under, exactly:

- :attr:`Rollout.logprobs` is ``log softmax(logits / T)`` at the sampled token: the policy at temperature T,
  **before** any truncation: no min-new-tokens EOS suppression, no top-k, no top-p, no NLPO mask. That is the
  distribution :func:`forward_response` reproduces and the one the policy gradient and the KL penalty are taken on
  (as in TRL and RL4LMs, whose PPO log-probs ignore the sampling warpers).
- :attr:`Rollout.masked_logprobs` (NLPO only) is the same with the logits outside the mask model's top-p set
  set to −inf: the masked distribution NLPO optimises (RL4LMs' maskable categorical);
  ``forward_response(..., action_mask=rollout.action_mask)`` reproduces it.

The sampling itself follows Hugging Face's processors and warpers in their order: EOS suppression before
``min_new_tokens`` → NLPO mask → temperature → top-k → top-p → a draw from the caller's generator
(:func:`sample_from_logits`: inverse-CDF sampling, the distribution of ``torch.multinomial`` at a tenth of its
CPU cost).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from elastic_reset.rl.cpu_bf16 import packed_linears

__all__ = [
    "ResponseOutput",
    "autocast",
    "Rollout",
    "SamplingConfig",
    "forward_response",
    "position_ids_from_mask",
    "precast_weights",
    "sample",
    "sample_from_logits",
    "top_k_filter",
    "top_p_filter",
    "token_logprobs",
    "top_p_set",
]

NEG_INF = float("-inf")


# --------------------------------------------------------------------------------------------------------------
# Configuration and results
# --------------------------------------------------------------------------------------------------------------


@dataclass
class SamplingConfig:
    """How :func:`sample` draws responses. Impossible values raise ``ValueError`` naming the field."""

    max_new_tokens: int = 48
    """The most tokens generated per response (the response tensor is as long as the longest response)."""
    min_new_tokens: int = 0
    """EOS gets logit −inf for sampling before this many tokens. ``min == max`` gives exactly that many tokens, the
    paper's IMDB setup (exactly 48). The recorded log-probs ignore this suppression (see the module docstring)."""
    temperature: float = 1.0
    """Logits are divided by this before sampling; the recorded log-probs are at this temperature too."""
    top_k: int = 0
    """Sample only among the k most likely tokens (ties at the k-th logit kept, as in Hugging Face). 0 = off."""
    top_p: float = 1.0
    """Nucleus sampling: only the smallest set of most likely tokens whose probability reaches ``top_p``
    (Hugging Face's ``TopPLogitsWarper``, at least one token kept). 1.0 = off."""
    stop_at_eos: bool = True
    """A response that emitted EOS is finished: later positions hold ``pad_token_id`` with mask 0. False: EOS is an
    ordinary token and every response is ``max_new_tokens`` long."""
    merge_lora: bool = False
    """With bf16 autocast on a CPU (where :func:`~elastic_reset.rl.cpu_bf16.packed_linears` applies): sample with
    each plain peft LoRA layer's weights merged, W + s·BA rounded to bf16 once per call. Faster; the samples then
    differ from the unmerged forward's at bf16 rounding level, and so do :attr:`Rollout.logprobs`."""

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"SamplingConfig.{name}: {why}, got {getattr(self, name)!r}")

        for name in ("max_new_tokens", "min_new_tokens", "top_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise bad(name, "expected an int")
        if self.max_new_tokens < 1:
            raise bad("max_new_tokens", "must be >= 1")
        if self.min_new_tokens < 0:
            raise bad("min_new_tokens", "must be >= 0")
        if self.min_new_tokens > self.max_new_tokens:
            raise bad("min_new_tokens", f"must be <= max_new_tokens ({self.max_new_tokens})")
        if not isinstance(self.temperature, (int, float)) or isinstance(self.temperature, bool) \
                or not self.temperature > 0 or self.temperature == float("inf"):
            raise bad("temperature", "must be a finite number > 0")
        if self.top_k < 0:
            raise bad("top_k", "must be >= 0 (0 = off)")
        if not isinstance(self.top_p, (int, float)) or isinstance(self.top_p, bool) or not 0 < self.top_p <= 1:
            raise bad("top_p", "must be in (0, 1] (1 = off)")
        for name in ("stop_at_eos", "merge_lora"):
            if not isinstance(getattr(self, name), bool):
                raise bad(name, "expected a bool")


@dataclass
class Rollout:
    """A batch of prompts and the responses sampled for them, with what the RL update needs. Row i of every tensor
    belongs to prompt i. Built outside inference mode, so every tensor can enter an autograd graph."""

    query_ids: torch.Tensor
    """``[B, Tq]`` long: the prompts, LEFT-padded for decoder-only models; for encoder-decoder models the encoder
    input as given."""
    query_mask: torch.Tensor
    """``[B, Tq]`` long: 1 for prompt tokens, 0 for padding."""
    response_ids: torch.Tensor
    """``[B, Tr]`` long: the sampled tokens, right-padded with ``pad_token_id`` after EOS. Tr is the longest
    response (at most ``max_new_tokens``)."""
    response_mask: torch.Tensor
    """``[B, Tr]`` float: 1 for generated tokens up to and INCLUDING the EOS, 0 after it."""
    logprobs: torch.Tensor
    """``[B, Tr]`` float32: log-prob of each sampled token under the policy at temperature T, BEFORE EOS
    suppression, top-k, top-p and the NLPO mask (the distribution :func:`forward_response` computes); 0 at padding."""
    action_mask: torch.Tensor | None = None
    """``[B, Tr, V]`` bool, only when a mask model was used (NLPO): True for the tokens the policy was allowed to
    sample at that position. All True at padding positions (no restriction where nothing was sampled)."""
    masked_logprobs: torch.Tensor | None = None
    """``[B, Tr]`` float32, only with a mask model: the sampled token's log-prob under the masked distribution
    (logits outside ``action_mask`` at −inf, temperature T), what NLPO's PPO ratio uses; 0 at padding."""

    def _map(self, fn) -> Rollout:
        return Rollout(**{f.name: None if getattr(self, f.name) is None else fn(getattr(self, f.name))
                          for f in fields(self)})

    def to(self, device: torch.device | str) -> Rollout:
        """A copy with every tensor on ``device``."""
        return self._map(lambda t: t.to(device))

    def __len__(self) -> int:
        return self.query_ids.shape[0]

    def select(self, indices: torch.Tensor | Sequence[int] | slice) -> Rollout:
        """The rollout restricted to the given rows (a minibatch), in the given order."""
        if not isinstance(indices, slice) and not torch.is_tensor(indices):
            indices = torch.as_tensor(list(indices), dtype=torch.long)
        if torch.is_tensor(indices):
            indices = indices.to(self.query_ids.device)
        return self._map(lambda t: t[indices])

    @property
    def response_lengths(self) -> torch.Tensor:
        """``[B]`` long: the number of generated tokens in each response (EOS included)."""
        return self.response_mask.sum(-1).long()


@dataclass
class ResponseOutput:
    """What :func:`forward_response` returns, one entry per response token."""

    logprobs: torch.Tensor
    """``[B, Tr]`` float32, with grad: log-prob of each response token at temperature T (under the masked
    distribution if an action mask was given); 0 at padding."""
    entropy: torch.Tensor
    """``[B, Tr]`` float32: entropy of the same distribution at each position; 0 at padding. Without grad unless
    ``entropy_grad=True`` (for an entropy bonus)."""
    hidden: torch.Tensor | None = None
    """``[B, Tr, H]``: the last hidden state at the position that PREDICTS each response token, so a value head on
    it gives V(s_t) for the state before token t. Only with ``return_hidden=True``."""
    logits: torch.Tensor | None = None
    """``[B, Tr, V]`` float32 logits (divided by T, masked if an action mask was given). Only with
    ``return_logits=True``: at B=16, Tr=48 and a 49k vocabulary that is 150 MB."""


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

    Computed from ``torch.topk`` of a growing k (256, then x8) rather than a full sort: on CPU sorting a 49k
    vocabulary for 16 rows takes ~60 ms, the top 256 ~3 ms, and a nucleus rarely needs more.
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


def sample_from_logits(scores: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """``[B]`` token ids drawn from ``softmax(scores)`` (−inf = never) by inverse-CDF sampling: one uniform per row
    from ``generator``, searched in the cumulative distribution. The same distribution as ``torch.multinomial(probs,
    1)`` and reproducible from the generator, but ~10x faster on CPU for a 49k vocabulary (~1.5 ms instead of 16 ms
    per 16-row step). A zero-probability token is never drawn: the CDF is flat across it and the search is
    right-sided; a uniform that rounds up to the total picks the last token of positive probability."""
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


def position_ids_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position ids that ignore padding: ``cumsum(mask) − 1`` (padding positions get 1, as Hugging Face does)."""
    mask = mask.long()
    return (mask.cumsum(-1) - 1).masked_fill_(mask == 0, 1)


def _unwrap(model):
    get_base = getattr(model, "get_base_model", None)  # peft's PeftModel
    return get_base() if callable(get_base) else model


def _is_encoder_decoder(model) -> bool:
    return bool(getattr(model.config, "is_encoder_decoder", False))


_KEEP_CACHE: dict[type, bool] = {}


def _accepts_logits_to_keep(model) -> bool:
    cls = type(_unwrap(model))
    if cls not in _KEEP_CACHE:
        try:
            _KEEP_CACHE[cls] = "logits_to_keep" in inspect.signature(_unwrap(model).forward).parameters
        except (TypeError, ValueError):
            _KEEP_CACHE[cls] = False
    return _KEEP_CACHE[cls]


def _device_of(model) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def _linear_types() -> tuple[type, ...]:
    types: tuple[type, ...] = (torch.nn.Linear,)
    try:  # GPT-2 style models use transformers' Conv1D (an addmm, which autocast casts like a linear)
        from transformers.pytorch_utils import Conv1D

        types += (Conv1D,)
    except ImportError:  # pragma: no cover
        pass
    return types


@contextlib.contextmanager
def precast_weights(model, dtype: torch.dtype | None, *, trainable: bool | None = None, skip=frozenset()):
    """Within the block, the weights and biases of the model's linear layers (``nn.Linear``, transformers'
    ``Conv1D``) are ``dtype`` copies; the original parameters are put back on exit, even after an error.

    Why: ``torch.autocast`` casts each fp32 weight to bf16 on every forward; it caches the cast only for weights
    that require grad and only outside ``inference_mode``, so a sampling loop (or any frozen LoRA base) recasts the
    whole model once per generated token: on CPU that was a third of a SmolLM2 decoding step. Casting once here
    gives the same numbers under autocast to the same dtype (the linears compute in ``dtype`` either way; embeddings,
    norms and the residual stream keep their own dtype, since only linear layers are touched, even when the LM head
    is tied to the embedding).

    ``trainable``: also swap tensors that require grad. The default, None, swaps them only if grad is disabled on
    entry; with grad, only frozen tensors (``requires_grad=False``, e.g. a LoRA base) may be swapped, or gradients
    would not reach the trainable parameters. ``skip``: modules left alone. ``dtype=None`` is a no-op. Not for models
    sharded by FSDP/DeepSpeed.
    """
    if dtype is None:
        yield model
        return
    swap_trainable = (not torch.is_grad_enabled()) if trainable is None else trainable
    casts: dict[int, torch.Tensor] = {}
    swapped: list[tuple[torch.nn.Module, str, torch.Tensor]] = []
    try:
        with torch.no_grad():
            for module in model.modules():
                if not isinstance(module, _linear_types()) or module in skip:
                    continue
                for name in ("weight", "bias"):
                    param = module._parameters.get(name)
                    if param is None or not param.is_floating_point() or param.dtype == dtype:
                        continue
                    if param.requires_grad and not swap_trainable:
                        continue
                    cast = casts.get(id(param))
                    if cast is None:
                        cast = casts[id(param)] = torch.nn.Parameter(param.detach().to(dtype), requires_grad=False)
                    module._parameters[name] = cast
                    swapped.append((module, name, param))
        yield model
    finally:
        for module, name, param in reversed(swapped):
            module._parameters[name] = param


def autocast(model, dtype: torch.dtype | None):
    """``torch.autocast`` to ``dtype`` on the model's device type; a no-op context for ``dtype=None``."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(_device_of(model).type, dtype=dtype)


def _decoder_start_id(model) -> int:
    start = getattr(model.config, "decoder_start_token_id", None)
    if start is None:
        start = getattr(getattr(model, "generation_config", None), "decoder_start_token_id", None)
    if start is None:
        raise ValueError("encoder-decoder model has no decoder_start_token_id in its config or generation_config")
    return int(start)


def _check_query(model, query_ids: torch.Tensor, query_mask: torch.Tensor) -> None:
    if query_ids.ndim != 2 or query_mask.shape != query_ids.shape:
        raise ValueError(f"query_ids and query_mask: expected two [B, Tq] tensors, got shapes "
                         f"{tuple(query_ids.shape)} and {tuple(query_mask.shape)}")
    if query_ids.shape[1] == 0 or bool((query_mask.sum(-1) == 0).any()):
        raise ValueError("query_mask: every prompt needs at least one token (start decoder-only prompts with BOS)")
    if not _is_encoder_decoder(model) and not bool(query_mask[:, -1].bool().all()):
        raise ValueError("query_ids: decoder-only prompts must be LEFT-padded (the last column of query_mask is 0)")


def _preallocated_cache(model, capacity: int):
    """A ``DynamicCache`` whose layers write into buffers of ``capacity`` positions allocated at the prefill, so a
    decoding step copies one position in instead of concatenating the whole cache (the concatenations were ~4 % of
    a SmolLM2 rollout). None, so that the model builds its own cache, where a layer is not a plain full-attention
    ``DynamicLayer`` (sliding windows, other cache types) or transformers lacks the API."""
    try:
        from transformers.cache_utils import DynamicCache, DynamicLayer
    except ImportError:  # pragma: no cover
        return None

    class PreallocatedLayer(DynamicLayer):
        def lazy_initialization(self, key_states, value_states):
            super().lazy_initialization(key_states, value_states)
            shape = lambda t: (*t.shape[:2], capacity, t.shape[-1])  # noqa: E731
            self._key_buffer = key_states.new_empty(shape(key_states))
            self._value_buffer = value_states.new_empty(shape(value_states))
            self._length = 0

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            start, end = self._length, self._length + key_states.shape[-2]
            if end > capacity:
                raise RuntimeError(f"KV cache: {end} positions exceed the {capacity} allocated")
            self._key_buffer[:, :, start:end] = key_states
            self._value_buffer[:, :, start:end] = value_states
            self._length = end
            self.keys, self.values = self._key_buffer[:, :, :end], self._value_buffer[:, :, :end]
            return self.keys, self.values

    try:
        cache = DynamicCache(config=_unwrap(model).config)
    except (TypeError, ValueError, AttributeError):  # pragma: no cover - an older or unusual config
        return None
    if not cache.layers or any(type(layer) is not DynamicLayer for layer in cache.layers):
        return None
    cache.layers = [PreallocatedLayer() for _ in cache.layers]
    return cache


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
        self.cache = _preallocated_cache(model, self.tq + max_new_tokens)
        self.t = 0

    def prefill(self) -> torch.Tensor:
        extra = {"logits_to_keep": 1} if _accepts_logits_to_keep(self.model) else {}
        with autocast(self.model, self.autocast_dtype):
            out = self.model(input_ids=self.query_ids,
                             attention_mask=self.attn[:, : self.tq] if self.padded else None,
                             position_ids=position_ids_from_mask(self.query_mask),
                             past_key_values=self.cache, use_cache=True, **extra)
        self.cache = out.past_key_values
        return out.logits[:, -1]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        with autocast(self.model, self.autocast_dtype):
            out = self.model(input_ids=tokens[:, None],
                             attention_mask=self.attn[:, : self.tq + self.t + 1] if self.padded else None,
                             position_ids=self.next_pos + self.t,
                             past_key_values=self.cache, use_cache=True)
        self.cache = out.past_key_values
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
        start = torch.full((self.query_ids.shape[0],), _decoder_start_id(self.model), dtype=torch.long,
                           device=self.query_ids.device)
        with autocast(self.model, self.autocast_dtype):
            self.encoder_outputs = self.model.get_encoder()(input_ids=self.query_ids, attention_mask=self.query_mask,
                                                            return_dict=True)
        return self.step(start)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        with autocast(self.model, self.autocast_dtype):
            out = self.model(encoder_outputs=self.encoder_outputs, attention_mask=self.query_mask,
                             decoder_input_ids=tokens[:, None], past_key_values=self.cache, use_cache=True)
        self.cache = out.past_key_values
        return out.logits[:, -1]


def _stepper(model, query_ids, query_mask, max_new_tokens, autocast_dtype):
    cls = _Seq2SeqStepper if _is_encoder_decoder(model) else _DecoderStepper
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
    _check_query(model, query_ids, query_mask)
    if mask_model is not None and _is_encoder_decoder(mask_model) != _is_encoder_decoder(model):
        raise ValueError("mask_model: must be of the same kind (decoder-only or encoder-decoder) as the policy")

    device = query_ids.device
    batch, max_new = query_ids.shape[0], config.max_new_tokens
    eos = _eos_tensor(eos_token_id, device)
    temperature = float(config.temperature)

    with contextlib.ExitStack() as stack:
        # Cast the linear weights once for the whole loop (autocast would recast them at every token); on a CPU,
        # pack them for oneDNN too. precast_weights then only sees what packing left (e.g. GPT-2's Conv1D).
        for m in (model,) if mask_model is None or mask_model is model else (model, mask_model):
            packed = stack.enter_context(packed_linears(m, autocast_dtype, batch_hint=batch,
                                                        merge_lora=config.merge_lora))
            stack.enter_context(precast_weights(m, autocast_dtype, trainable=True, skip=packed))
        stack.enter_context(torch.inference_mode())
        policy = _stepper(model, query_ids, query_mask, max_new, autocast_dtype)
        masker = None if mask_model is None else _stepper(mask_model, query_ids, query_mask, max_new,
                                                          autocast_dtype)
        tokens = torch.full((batch, max_new), pad_token_id, dtype=torch.long, device=device)
        active_mask = torch.zeros(batch, max_new, dtype=torch.bool, device=device)
        logprobs = torch.zeros(batch, max_new, dtype=torch.float32, device=device)
        masked_logprobs = action_mask = None
        finished = torch.zeros(batch, dtype=torch.bool, device=device)

        logits = policy.prefill()
        mask_logits = masker.prefill() if masker is not None else None
        vocab = logits.shape[-1]
        if masker is not None:
            if mask_logits.shape[-1] != vocab:
                raise ValueError(f"mask_model: vocabulary size {mask_logits.shape[-1]} differs from the "
                                 f"policy's {vocab}")
            masked_logprobs = torch.zeros(batch, max_new, dtype=torch.float32, device=device)
            action_mask = torch.ones(batch, max_new, vocab, dtype=torch.bool, device=device)

        steps = 0
        for t in range(max_new):
            scores = logits.float()
            if temperature != 1.0:
                scores = scores / temperature
            full_logprobs = torch.log_softmax(scores, dim=-1)
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
                step_masked_logprobs = torch.log_softmax(scores, dim=-1)
            if config.top_k > 0:
                scores = top_k_filter(scores, config.top_k)
            if config.top_p < 1.0:
                scores = top_p_filter(scores, config.top_p)
            next_tokens = sample_from_logits(scores, generator)

            active = ~finished
            next_tokens = torch.where(active, next_tokens, pad_token_id)
            tokens[:, t] = next_tokens
            active_mask[:, t] = active
            picked = next_tokens[:, None]
            logprobs[:, t] = full_logprobs.gather(-1, picked).squeeze(-1).masked_fill(finished, 0.0)
            if masker is not None:
                masked_logprobs[:, t] = step_masked_logprobs.gather(-1, picked).squeeze(-1).masked_fill(finished, 0.0)
                action_mask[:, t] = allowed | finished[:, None]
            steps = t + 1
            if config.stop_at_eos and eos is not None:
                finished = finished | (active & torch.isin(next_tokens, eos))
                if bool(finished.all()):
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
        masked_logprobs=None if masked_logprobs is None else masked_logprobs[:, :steps].clone(),
    )


# --------------------------------------------------------------------------------------------------------------
# Teacher-forced re-scoring
# --------------------------------------------------------------------------------------------------------------


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)`` at ``token_ids``, position by position: ``[..., V]`` and ``[...]`` give ``[...]``.

    One fused cross-entropy, forward and backward: on CPU at 16 x 32 x 49k it took 51 + 96 ms where logsumexp −
    gather took 197 + 187 ms."""
    nll = torch.nn.functional.cross_entropy(logits.flatten(0, -2), token_ids.flatten(), reduction="none")
    return -nll.view_as(token_ids)


def forward_response(model, rollout_or_query_ids: Rollout | torch.Tensor, query_mask: torch.Tensor | None = None,
                     response_ids: torch.Tensor | None = None, response_mask: torch.Tensor | None = None, *,
                     temperature: float = 1.0, autocast_dtype: torch.dtype | None = None,
                     return_hidden: bool = False, action_mask: torch.Tensor | None = None,
                     return_logits: bool = False, entropy_grad: bool = False,
                     compute_entropy: bool = True) -> ResponseOutput:
    """One teacher-forced forward over prompt + response, with grad: per response token its log-prob, the entropy
    of the distribution it was drawn from, and optionally the hidden state that predicts it.

    Call as ``forward_response(model, rollout)`` or ``forward_response(model, query_ids, query_mask, response_ids,
    response_mask)``. The action mask is never taken from the rollout implicitly: pass
    ``action_mask=rollout.action_mask`` for NLPO's masked distribution.

    Decoder-only: the input is the left-padded prompt followed by the response minus its last token (nothing is
    predicted from the last one), the attention mask is ``cat(query_mask, response_mask)`` (EOS included, padding
    after it masked), positions come from its cumsum, and the logits are those at positions Tq−1 … Tq+Tr−2.
    Encoder-decoder: the encoder reads the prompt and the decoder ``[decoder_start] + response[:, :-1]``.

    Args:
        temperature: the sampling temperature: logits are divided by it, so the log-probs match :func:`sample`'s.
        autocast_dtype: run the forward under ``torch.autocast`` (e.g. bf16); the log-probs are fp32 either way.
        return_hidden: also return the last hidden state at each predicting position (for a value head).
        action_mask: ``[B, Tr, V]`` bool; logits outside it are −inf before the log-softmax (NLPO). Positions whose
            mask is all False are left unrestricted rather than producing NaN.
        return_logits: also return the ``[B, Tr, V]`` fp32 logits (large).
        entropy_grad: compute the entropy with grad (for an entropy bonus); by default it is detached, which saves
            a vocabulary-sized backward.
        compute_entropy: False skips the entropy (``entropy`` is then None): two vocabulary-sized passes saved
            for forwards that only need log-probs (the KL reference, PPO's old log-probs).
    """
    if isinstance(rollout_or_query_ids, Rollout):
        if query_mask is not None or response_ids is not None or response_mask is not None:
            raise TypeError("forward_response: pass either a Rollout or the four tensors, not both")
        r = rollout_or_query_ids
        query_ids, query_mask, response_ids, response_mask = r.query_ids, r.query_mask, r.response_ids, r.response_mask
    else:
        query_ids = rollout_or_query_ids
        if query_mask is None or response_ids is None or response_mask is None:
            raise TypeError("forward_response: query_mask, response_ids and response_mask are required with tensors")
    if not temperature > 0:
        raise ValueError(f"temperature: must be > 0, got {temperature!r}")
    _check_query(model, query_ids, query_mask)
    batch, tq = query_ids.shape
    tr = response_ids.shape[1]
    if response_ids.shape[0] != batch or response_mask.shape != response_ids.shape or tr == 0:
        raise ValueError(f"response_ids/response_mask: expected [B={batch}, Tr>0], got {tuple(response_ids.shape)} "
                         f"and {tuple(response_mask.shape)}")

    with autocast(model, autocast_dtype):
        if _is_encoder_decoder(model):
            start = torch.full((batch, 1), _decoder_start_id(model), dtype=torch.long, device=response_ids.device)
            out = model(input_ids=query_ids, attention_mask=query_mask,
                        decoder_input_ids=torch.cat([start, response_ids[:, :-1]], dim=1),
                        output_hidden_states=return_hidden, use_cache=False)
            logits = out.logits
            hidden = out.decoder_hidden_states[-1] if return_hidden else None
        else:
            input_ids = torch.cat([query_ids, response_ids[:, :-1]], dim=1)
            attn = torch.cat([query_mask.long(), response_mask[:, :-1].long()], dim=1)
            extra = {"logits_to_keep": tr} if _accepts_logits_to_keep(model) else {}
            out = model(input_ids=input_ids, attention_mask=attn, position_ids=position_ids_from_mask(attn),
                        output_hidden_states=return_hidden, use_cache=False, **extra)
            logits = out.logits[:, -tr:]
            hidden = out.hidden_states[-1][:, tq - 1:] if return_hidden else None

    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    if action_mask is not None:
        if action_mask.shape != logits.shape:
            raise ValueError(f"action_mask: expected shape {tuple(logits.shape)}, got {tuple(action_mask.shape)}")
        allowed = action_mask.bool()
        allowed = allowed | ~allowed.any(-1, keepdim=True)
        logits = logits.masked_fill(~allowed, NEG_INF)
    valid = response_mask.bool()
    logprobs = token_logprobs(logits, response_ids)

    entropy = None
    if compute_entropy:
        # H = lse − Σ p·z with p = exp(z − lse), the normaliser recovered from the log-prob: lse = z_token − log p.
        # The dot product runs as a batched matmul. Every vocabulary-sized tensor is another 100 MB at 16 x 32 x 49k
        # (on this CPU, freshly allocated memory of that size costs ~70 ms in page faults), so the detached
        # default computes p in place, and only the entropy bonus (entropy_grad) pays for a differentiable one.
        with contextlib.nullcontext() if entropy_grad else torch.no_grad():
            z = logits if entropy_grad else logits.detach()
            lse = z.gather(-1, response_ids[..., None]).squeeze(-1) - (logprobs if entropy_grad else logprobs.detach())
            probs = torch.exp(z - lse[..., None]) if entropy_grad else (z - lse[..., None]).exp_()
            finite = z if action_mask is None else z.masked_fill(probs == 0, 0.0)  # −inf · 0 would be NaN
            expected = (probs.unsqueeze(-2) @ finite.unsqueeze(-1)).squeeze(-1).squeeze(-1)
            entropy = torch.where(valid, lse - expected, 0.0)
    logprobs = torch.where(valid, logprobs, 0.0)

    return ResponseOutput(logprobs=logprobs, entropy=entropy, hidden=hidden,
                          logits=logits if return_logits else None)
