"""Decoding steps at static shapes, replayed as CUDA graphs.

On a GPU a decoding step of a small model is bound by Python and kernel launches, not by the GPU (BENCHMARKS.md,
"On a GPU and on several processes": ~4 ms of GPU work in a 44-48 ms step of SmolLM2). A step over transformers'
``StaticCache`` has the same shapes at every token, so it is captured once as a CUDA graph and then replayed: one
launch per token instead of hundreds. As gpt-fast does it, by hand (``torch.cuda.CUDAGraph``), and, with
``compile``, through ``torch.compile`` first.

- **Shapes.** A prompt is padded (on the left for a decoder-only model, on the right for an encoder) up to a
  multiple of :data:`PROMPT_BUCKET`, so one graph serves every batch of prompts up to that length; the KV cache
  holds the bucket plus ``max_new_tokens`` positions. The cache's own write position is a tensor
  (``StaticLayer.cumulative_length``), positions past it are masked by the causal mask, padding by an attention
  mask buffer. Token ids, positions and masks are copied into static buffers before each replay.
- **Kept across rollouts.** One graph per (model, batch, bucket, capacity, autocast dtype), kept while the model's
  parameters are the same tensors: an optimizer updates them in place, so a replay reads the current weights
  (what autocast still casts is cast inside the graph). Anything that replaces a parameter tensor, turns a LoRA
  adapter on or off, or switches train/eval mode changes :func:`fingerprint`, and the model's graphs are captured
  anew.
- **What a step reads.** Within :func:`static_weights` (the sampler enters it around its static steps) each linear
  layer multiplies by a copy of its weight in the autocast dtype, and, with ``merge_lora``, each plain LoRA layer by
  its merged weight W + s·BA, as the CPU sampler does: no weight casts and no adapter branches among a step's
  kernels. The copies are made on the first rollout and overwritten in place at the start of every later one, so an
  update reaches the graphs without capturing them again.
- **Compiled steps** (``compile``): the step function is compiled by ``torch.compile`` (inductor: the small
  element-wise kernels of norms, rotary embeddings and activations fused, which a graph replays but does not merge)
  before it is captured. The first step of each shape pays the compilation; dynamo's recompile limit is raised for
  these calls, since each shape (batch, bucket, capacity, dtype) is one compilation.
- **Eager parts.** The prefill (for an encoder-decoder model: the encoder and the first decoder step, which fills
  the cross-attention cache) runs eagerly, and so does every step off CUDA: that is how the CPU tests compare the
  static path with the dynamic one (:mod:`elastic_reset.rl.sampling`).
"""

from __future__ import annotations

import contextlib
import weakref

import torch

from elastic_reset.errors import ConfigError
from elastic_reset.lm.cpu_bf16 import precast_weights
from elastic_reset.lm.lora import mergeable_lora, merged_lora_weight
from elastic_reset.lm.scoring import (accepts_logits_to_keep, decoder_start_id, device_of, position_ids_from_mask,
                                     unwrap_model)

__all__ = ["PROMPT_BUCKET", "StaticDecoderStepper", "StaticSeq2SeqStepper", "fingerprint", "static_weights"]

PROMPT_BUCKET = 32
"""Prompt lengths are rounded up to a multiple of this: one captured graph per bucket, not per prompt length."""

# model -> (fingerprint, {shape key: _StepState}); dropped with the model.
_STATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# module -> {(name, dtype): the copy its static steps read (static_weights)}; dropped with the module. Kept per dtype:
# a graph captured over a bf16 copy must still find it after an fp32 rollout in between.
_WEIGHTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def fingerprint(model) -> tuple:
    """What a captured step depends on besides its buffers: the parameter tensors (by address), train/eval mode
    and, with peft, which adapters are on and which layers multiply by a merged weight (:func:`static_weights`)."""
    adapters = tuple((bool(getattr(m, "disable_adapters", False)), tuple(getattr(m, "active_adapters", ())),
                      "forward" in m.__dict__) for m in model.modules() if hasattr(m, "lora_A"))
    return (model.training, tuple(p.data_ptr() for p in model.parameters()), adapters)


@contextlib.contextmanager
def static_weights(model, dtype: torch.dtype | None, *, merge_lora: bool):
    """Within the block, the model's linear layers (``nn.Linear``, transformers' ``Conv1D``) compute with ``dtype``
    copies of their weights and biases (None: the parameters' own dtype), and with ``merge_lora`` every
    :func:`~elastic_reset.lm.lora.mergeable_lora` layer with its merged weight W + s·BA; the model is put back on
    exit, even after an error. :func:`~elastic_reset.lm.cpu_bf16.precast_weights`, but with the copies kept with each
    module and refreshed in place on every entry: the same tensors every rollout, which a captured graph needs,
    holding the current values. Under autocast to ``dtype`` a linear layer computes the same either way (its
    inputs are cast to ``dtype``)."""
    merged = [m for m in model.modules() if mergeable_lora(m)] if merge_lora else []
    try:
        for module in merged:
            bias = module.base_layer.bias
            module.forward = _linear_forward(_kept(module, "merged", merged_lora_weight(module), dtype),
                                             None if bias is None else _kept(module, "bias", bias, dtype))
        # The rest, as precast_weights swaps them (a parameter already in dtype, e.g. the trainer's run-long copy of
        # a frozen weight, is left as it is).
        inside_merged = {m for module in merged for m in module.modules()}
        with precast_weights(model, dtype, trainable=True, skip=inside_merged,
                             copy=lambda module, name, param: _kept(module, name, param, dtype)):
            yield model
    finally:
        for module in merged:
            module.__dict__.pop("forward", None)


def _kept(module, name: str, value: torch.Tensor, dtype: torch.dtype | None) -> torch.nn.Parameter:
    """The module's kept copy ``name`` of ``value`` in ``dtype``, overwritten in place; made anew when missing or of
    another shape or device (then the parameters moved or were replaced: :func:`fingerprint` changed too)."""
    dtype = dtype or value.dtype
    held = _WEIGHTS.setdefault(module, {})
    kept = held.get((name, dtype))
    with torch.inference_mode(False), torch.no_grad():  # a kept copy must be writable outside inference mode
        if kept is None or kept.shape != value.shape or kept.device != value.device:
            kept = held[name, dtype] = torch.nn.Parameter(value.detach().to(dtype, copy=True), requires_grad=False)
        else:
            kept.copy_(value)
    return kept


def _linear_forward(weight: torch.Tensor, bias: torch.Tensor | None):
    def forward(x, *args, **kwargs):  # shadows the LoRA layer's own; hooks still run
        return torch.nn.functional.linear(x, weight, bias)

    return forward


def _autocast(model, dtype: torch.dtype | None):
    """Autocast without its cast cache, which a captured graph must not hold (PyTorch's CUDA graph notes)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_of(model).type, dtype=dtype, cache_enabled=False)


def _bucket(length: int) -> int:
    return -(-length // PROMPT_BUCKET) * PROMPT_BUCKET


def _layers(cache) -> list:
    caches = (cache.self_attention_cache, cache.cross_attention_cache) if hasattr(cache, "cross_attention_cache") \
        else (cache,)
    return [layer for c in caches for layer in c.layers]


class _StepState:
    """The static cache, the input buffers and, on CUDA, the captured graph of one decoding step."""

    def __init__(self, cache, buffers: dict[str, torch.Tensor], capture: bool, compile: bool):
        self.cache, self.buffers, self.capture, self.compile = cache, buffers, capture, compile
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None

    def run(self, step, model, autocast_dtype) -> torch.Tensor:
        """``step(model, self, autocast_dtype)`` (reading only :attr:`buffers` and the cache; returns the last
        position's logits), compiled first with :attr:`compile`: captured on its first call on CUDA and replayed after,
        run as it is elsewhere. Returns a copy the next step does not overwrite. The model is an argument, not held:
        the states are kept in a dictionary weakly keyed by it."""
        if self.compile:
            step = _compiled(step)
        forward = lambda: step(model, self, autocast_dtype)  # noqa: E731
        if not self.capture:
            return forward().clone()
        if self.graph is None:
            # Warm up on a side stream first (lazy allocations, library handles), as torch.cuda.graphs asks. The
            # warm-up is a real step: put the cache's write positions back, so the replay below is the step's only one.
            positions = [layer.cumulative_length.clone() for layer in _layers(self.cache)]
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                forward()
                for layer, position in zip(_layers(self.cache), positions):
                    layer.cumulative_length.copy_(position)
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.logits = forward()
        self.graph.replay()
        return self.logits.clone()


_COMPILED: dict = {}
RECOMPILE_LIMIT = 64
"""Dynamo's recompile limit within compiled steps (its default, 8, is for one function of changing inputs; here every
shape of step a process decodes is one compilation of the same function)."""


def _compiled(step):
    """``step`` through ``torch.compile`` (one graph, static shapes), compiled on a call under a raised recompile
    limit."""
    if step not in _COMPILED:
        fn = torch.compile(step, fullgraph=True, dynamic=False)

        def call(*args):
            # cache_size_limit: recompile_limit's older name, which every torch since 2.6 accepts
            with torch._dynamo.config.patch(cache_size_limit=RECOMPILE_LIMIT):
                return fn(*args)

        _COMPILED[step] = call
    return _COMPILED[step]


def _state(model, key: tuple, make) -> _StepState:
    """The model's step state for ``key``, made by ``make()`` when missing; all its states are dropped (and so
    captured anew) when its :func:`fingerprint` changed since they were made."""
    now = fingerprint(model)
    held = _STATES.get(model)
    if held is None or held[0] != now:
        held = _STATES[model] = (now, {})
    if key not in held[1]:
        held[1][key] = make()
    return held[1][key]


class _StaticStepper:
    """What both kinds of static stepper share: the prompt's bucket, and the step state of this shape (made by the
    subclass's ``_make``, with ``capacity`` KV-cache slots), kept with the model."""

    kind: str

    def __init__(self, model, query_ids, query_mask, max_new_tokens: int, autocast_dtype, compile: bool = False):
        base = unwrap_model(model)
        if not getattr(base, "_can_compile_fullgraph", False):  # transformers' mark of a static-cache model
            raise ConfigError(f"sampling.cuda_graphs: {type(base).__name__} cannot decode over a static KV cache "
                              "(transformers does not mark it as one that can); set sampling.cuda_graphs=false")
        self.model, self.query_ids, self.query_mask = model, query_ids, query_mask
        self.autocast_dtype, self.compile = autocast_dtype, compile
        self.batch, self.tq = query_ids.shape
        self.bucket = _bucket(self.tq)
        capacity = self._capacity(max_new_tokens)
        self.state = _state(model, (self.kind, self.batch, self.bucket, capacity, autocast_dtype, compile),
                            lambda: self._make(capacity))

    def _buffer(self, *shape: int, fill: int = 0) -> torch.Tensor:
        return torch.full(shape, fill, dtype=torch.long, device=self.query_ids.device)

    def _capacity(self, max_new_tokens: int) -> int:
        raise NotImplementedError

    def _make(self, capacity: int) -> _StepState:
        raise NotImplementedError


class StaticDecoderStepper(_StaticStepper):
    """Prefill + single-token steps of a decoder-only model over a ``StaticCache``; the same interface as the
    sampler's dynamic stepper (``prefill()``, then ``step(tokens)``, each returning ``[B, V]`` logits)."""

    kind = "decoder"

    def __init__(self, model, query_ids, query_mask, max_new_tokens: int, autocast_dtype, compile: bool = False):
        super().__init__(model, query_ids, query_mask, max_new_tokens, autocast_dtype, compile)
        self.next_pos = query_mask.long().sum(-1, keepdim=True)  # position of the first generated token
        self.t = 0

    def _capacity(self, max_new_tokens: int) -> int:
        return self.bucket + max_new_tokens

    def _make(self, capacity: int) -> _StepState:
        from transformers import StaticCache

        buffers = {"tokens": self._buffer(self.batch, 1), "positions": self._buffer(self.batch, 1),
                   "attn": self._buffer(self.batch, capacity, fill=1)}
        return _StepState(StaticCache(config=self.model.config, max_cache_len=capacity), buffers,
                          capture=self.query_ids.device.type == "cuda", compile=self.compile)

    def prefill(self) -> torch.Tensor:
        state = self.state
        state.cache.reset()
        # The prompt fills the cache's first tq slots; the generated tokens follow. Slots past the current token are
        # left out by the causal mask, so every slot after the prompt is marked valid here once.
        state.buffers["attn"][:, : self.tq].copy_(self.query_mask)
        state.buffers["attn"][:, self.tq:].fill_(1)
        extra = {"logits_to_keep": 1} if accepts_logits_to_keep(self.model) else {}
        return _decoder_forward(self.model, state, self.autocast_dtype, input_ids=self.query_ids,
                                position_ids=position_ids_from_mask(self.query_mask), **extra).clone()

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        buffers = self.state.buffers
        buffers["tokens"].copy_(tokens[:, None])
        torch.add(self.next_pos, self.t, out=buffers["positions"])
        self.t += 1
        return self.state.run(decoder_step, self.model, self.autocast_dtype)


class StaticSeq2SeqStepper(_StaticStepper):
    """The encoder once, then single-token decoder steps over static self- and cross-attention caches; the encoder's
    output is padded to the prompt bucket (padding masked), so a graph serves every prompt length up to it."""

    kind = "seq2seq"

    def _capacity(self, max_new_tokens: int) -> int:
        return max_new_tokens + 1  # the decoder start token, then one slot per generated token

    def _make(self, capacity: int) -> _StepState:
        from transformers import EncoderDecoderCache, StaticCache

        cache = EncoderDecoderCache(StaticCache(config=self.model.config, max_cache_len=capacity),
                                    StaticCache(config=self.model.config, max_cache_len=self.bucket))
        buffers = {"tokens": self._buffer(self.batch, 1), "encoder_mask": self._buffer(self.batch, self.bucket),
                   "decoder_mask": self._buffer(self.batch, capacity, fill=1)}
        return _StepState(cache, buffers, capture=self.query_ids.device.type == "cuda", compile=self.compile)

    def prefill(self) -> torch.Tensor:
        state, buffers = self.state, self.state.buffers
        state.cache.reset()  # also marks the cross-attention cache as not yet filled
        with _autocast(self.model, self.autocast_dtype):
            hidden = self.model.get_encoder()(input_ids=self.query_ids, attention_mask=self.query_mask,
                                              return_dict=True).last_hidden_state
        encoder = buffers.get("encoder")
        if encoder is None or encoder.dtype != hidden.dtype:
            encoder = buffers["encoder"] = hidden.new_zeros(hidden.shape[0], buffers["encoder_mask"].shape[1],
                                                            hidden.shape[2])
            state.graph = None  # a graph captured over the old buffer would read freed memory
        encoder[:, self.tq:].zero_()
        encoder[:, : self.tq].copy_(hidden)
        buffers["encoder_mask"][:, self.tq:].zero_()
        buffers["encoder_mask"][:, : self.tq].copy_(self.query_mask)
        start = torch.full((self.query_ids.shape[0], 1), decoder_start_id(self.model), dtype=torch.long,
                           device=self.query_ids.device)
        # eager: this step fills the cross-attention cache
        return _seq2seq_forward(self.model, state, self.autocast_dtype, start).clone()

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        buffers = self.state.buffers
        buffers["tokens"].copy_(tokens[:, None])
        return self.state.run(seq2seq_step, self.model, self.autocast_dtype)


# The forwards of both kinds of model over a step state. Functions of the model and the state, not methods of a
# stepper (one per rollout): a step compiled once serves every rollout of its shape.
def _decoder_forward(model, state: _StepState, autocast_dtype, **inputs) -> torch.Tensor:
    with _autocast(model, autocast_dtype):
        out = model(attention_mask=state.buffers["attn"], cache=state.cache, use_cache=True, **inputs)
    return out.logits[:, -1]


def decoder_step(model, state: _StepState, autocast_dtype) -> torch.Tensor:
    """One decoding step of a decoder-only model: the token and position in ``state.buffers``."""
    buffers = state.buffers
    return _decoder_forward(model, state, autocast_dtype, input_ids=buffers["tokens"],
                            position_ids=buffers["positions"])


def _seq2seq_forward(model, state: _StepState, autocast_dtype, tokens: torch.Tensor) -> torch.Tensor:
    from transformers.modeling_outputs import BaseModelOutput

    buffers = state.buffers
    with _autocast(model, autocast_dtype):
        out = model(encoder_outputs=BaseModelOutput(last_hidden_state=buffers["encoder"]),
                    attention_mask=buffers["encoder_mask"], decoder_input_ids=tokens,
                    decoder_attention_mask=buffers["decoder_mask"], cache=state.cache, use_cache=True)
    return out.logits[:, -1]


def seq2seq_step(model, state: _StepState, autocast_dtype) -> torch.Tensor:
    """One decoding step of an encoder-decoder model: the token in ``state.buffers``."""
    return _seq2seq_forward(model, state, autocast_dtype, state.buffers["tokens"])
