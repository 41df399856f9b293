"""Making decoding and bf16 autocast fast on a CPU: two measured choices, both off a CPU.

- :func:`packed_linears`: decoding streams every weight matrix once per token; a weight reordered once into
  oneDNN's blocked layout multiplies faster than one reordered inside every matmul. In bf16 (CPUs with AVX-512
  BF16) the results are bit-identical; in fp32 (any CPU with oneDNN, e.g. AVX2 only) they agree to rounding.
- :func:`use_fp32_attention`: under autocast, ``scaled_dot_product_attention`` runs in bf16, and on a CPU the
  bf16 kernels are the slow ones for teacher-forced passes (decoding is the same either way; see BENCHMARKS.md).
  Attention is then computed in fp32 (more precise too; the linear layers stay bf16). On a GPU, where bf16
  attention is the fast one, nothing changes.
"""

from __future__ import annotations

import contextlib
import weakref

import torch

from elastic_reset.lm.lora import mergeable_lora, merged_lora_weight

__all__ = ["FP32_ATTENTION", "linear_types", "packed_linears", "precast_weights", "release_packed_linears",
           "use_fp32_attention"]

# module -> (weakref to the weight it was packed from, that weight's version counter, packed weight, packed bias)
_PACKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _pack_dtype(model, dtype: torch.dtype | None) -> torch.dtype | None:
    """The dtype to pack weights in for a model computing in ``dtype`` (None: fp32, no autocast): bf16 where
    oneDNN has bf16 kernels, fp32 without autocast; None (no packing) off the CPU or otherwise."""
    if not (_on_cpu(model) and torch.backends.mkldnn.is_available()):
        return None
    if dtype is None:
        return torch.float32
    if dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return torch.bfloat16
    return None


def _on_cpu(model) -> bool:
    return all(p.device.type == "cpu" for p in model.parameters())


def _version(tensor: torch.Tensor) -> int | None:
    try:
        return tensor._version
    except RuntimeError:  # an inference tensor keeps no version counter: never reuse a pack made from it
        return None


def _pack(module: torch.nn.Linear, dtype: torch.dtype, batch_hint: int):
    weight, bias = module.weight, module.bias
    cached = _PACKS.get(module)
    if cached is not None and cached[0]() is weight and cached[1] == _version(weight) and cached[1] is not None \
            and cached[2].dtype == dtype:  # a pack of another dtype (an fp32 rollout before a bf16 one) is no use
        return cached[2], cached[3]
    with torch.no_grad():
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(dtype).contiguous(), batch_hint)
        packed_bias = None if bias is None else bias.detach().to(dtype)
    if not weight.requires_grad:  # frozen (a LoRA base, a reference copy): worth keeping for the next rollout
        _PACKS[module] = (weakref.ref(weight), _version(weight), packed, packed_bias)
    return packed, packed_bias


@contextlib.contextmanager
def packed_linears(model, dtype: torch.dtype | None, batch_hint: int = 16, *, merge_lora: bool = False):
    """Within the block (no grad), every ``nn.Linear`` of the model computes with its weight reordered once into
    oneDNN's blocked layout, instead of reordering it inside every matmul. Yields the set of modules patched; an
    empty set, and no change, off the CPU, without oneDNN, or for a bf16 ``dtype`` without oneDNN bf16 kernels.
    ``dtype`` is the autocast dtype: bf16 packs bf16 weights, None (fp32) packs fp32 ones.

    Why: a decoding step multiplies 16 rows by every weight matrix, so it streams the weights from memory, and a
    pre-packed weight streams faster than one the matmul reorders each time (bf16 and fp32 alike; see
    BENCHMARKS.md). In bf16 the results are bit-identical to the matmul autocast would run (same oneDNN kernel
    family, same bf16 inputs, fp32 accumulation); in fp32 equal to ``F.linear`` up to rounding (a different
    summation order).

    Packs of frozen weights (``requires_grad=False``: a LoRA base, a reference copy) are kept, keyed weakly by
    module, and reused while the weight is the same tensor with the same version counter (an in-place change
    repacks); they cost one more bf16 copy of those weights in memory until the model is freed or
    :func:`release_packed_linears` is called. Trainable weights are packed anew on every entry.
    """
    dtype = _pack_dtype(model, dtype)
    if dtype is None:
        yield set()
        return
    patched: set[torch.nn.Module] = set()
    inside_merged: set[torch.nn.Module] = set()
    try:
        for module in model.modules():
            if module in inside_merged:
                continue
            if merge_lora and mergeable_lora(module):
                packed, packed_bias = _pack_merged_lora(module, dtype, batch_hint)
                inside_merged.update(module.modules())
            elif type(module) is torch.nn.Linear:  # exactly nn.Linear: peft's LoRA wrappers keep theirs inside
                packed, packed_bias = _pack(module, dtype, batch_hint)
            else:
                continue
            module.forward = _packed_forward(packed, packed_bias, dtype)  # shadows the class's; hooks still run
            patched.add(module)
        yield patched | inside_merged
    finally:
        for module in patched:
            del module.forward


def _packed_forward(packed: torch.Tensor, packed_bias: torch.Tensor | None, dtype: torch.dtype):
    out_features = packed.shape[0]

    def forward(x, *args, **kwargs):
        if torch.is_grad_enabled():  # the packed matmul has no backward: fail rather than drop gradients
            raise RuntimeError("packed_linears: run the model under torch.no_grad() or inference_mode()")
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]).to(dtype), packed, packed_bias,
                                               "none", [], "")
        return y.view(*x.shape[:-1], out_features)

    return forward


def _pack_merged_lora(module, dtype: torch.dtype, batch_hint: int):
    base = module.base_layer
    with torch.no_grad():
        packed = torch.ops.mkldnn._reorder_linear_weight(merged_lora_weight(module).to(dtype).contiguous(),
                                                         batch_hint)
        packed_bias = None if base.bias is None else base.bias.detach().to(dtype)
    return packed, packed_bias


def release_packed_linears(model) -> None:
    """Drop the kept packs of the model's frozen weights (see :func:`packed_linears`)."""
    for module in model.modules():
        _PACKS.pop(module, None)


# ------------------------------------------------------------------------------------------------------ attention
FP32_ATTENTION = "sdpa_fp32"
"""The name :func:`use_fp32_attention` registers with transformers' attention and mask interfaces."""


def _fp32_sdpa(module, query, key, value, attention_mask, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def fp32(t):  # additive masks and T5's position bias were computed under autocast too
        return t.float() if torch.is_tensor(t) and t.is_floating_point() else t

    kwargs = {name: fp32(arg) for name, arg in kwargs.items()}
    with torch.autocast(query.device.type, enabled=False):
        return sdpa_attention_forward(module, fp32(query), fp32(key), fp32(value), fp32(attention_mask), **kwargs)


def _register_fp32_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(FP32_ATTENTION, _fp32_sdpa)
    AttentionMaskInterface.register(FP32_ATTENTION, sdpa_mask)  # the same masks as "sdpa"


def use_fp32_attention(model, dtype: torch.dtype | None) -> bool:
    """Switch a Hugging Face model (plain or wrapped by peft) from ``"sdpa"`` attention to the same kernel run in
    fp32 with autocast off inside it, when ``dtype`` is bf16 and the model is on a CPU. Returns whether it switched:
    models on another attention implementation (eager, T5's own) are left alone."""
    if dtype != torch.bfloat16 or not _on_cpu(model):
        return False
    get_base = getattr(model, "get_base_model", None)
    base = get_base() if callable(get_base) else model
    if getattr(base.config, "_attn_implementation", None) != "sdpa":
        return False
    _register_fp32_attention()
    base.set_attn_implementation(FP32_ATTENTION)
    return True


def linear_types() -> tuple[type, ...]:
    types: tuple[type, ...] = (torch.nn.Linear,)
    try:  # GPT-2 style models use transformers' Conv1D (an addmm, which autocast casts like a linear)
        from transformers.pytorch_utils import Conv1D

        types += (Conv1D,)
    except ImportError:  # pragma: no cover
        pass
    return types


@contextlib.contextmanager
def precast_weights(model, dtype: torch.dtype | None, *, trainable: bool | None = None, skip=frozenset(),
                    copy=None):
    """Within the block, the weights and biases of the model's linear layers (``nn.Linear``, transformers'
    ``Conv1D``) are ``dtype`` copies; the original parameters are put back on exit, even after an error.

    Why: ``torch.autocast`` casts each fp32 weight to bf16 on every forward; it caches the cast only for weights
    that require grad and only outside ``inference_mode``, so a sampling loop (or any frozen LoRA base) recasts the
    whole model once per generated token: on a CPU a large share of a decoding step. Casting once here
    gives the same numbers under autocast to the same dtype (the linears compute in ``dtype`` either way; embeddings,
    norms and the residual stream keep their own dtype, since only linear layers are touched, even when the LM head
    is tied to the embedding).

    ``trainable``: also swap tensors that require grad. The default, None, swaps them only if grad is disabled on
    entry; with grad, only frozen tensors (``requires_grad=False``, e.g. a LoRA base) may be swapped, or gradients
    would not reach the trainable parameters. ``skip``: modules left alone. ``copy(module, name, param)``: makes the
    ``dtype`` copy (default: a new tensor each entry; static decoding passes one that keeps its copies). ``dtype=None``
    is a no-op. Not for models sharded by FSDP/DeepSpeed.
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
                if not isinstance(module, linear_types()) or module in skip:
                    continue
                for name in ("weight", "bias"):
                    param = module._parameters.get(name)
                    if param is None or not param.is_floating_point() or param.dtype == dtype:
                        continue
                    if param.requires_grad and not swap_trainable:
                        continue
                    cast = casts.get(id(param))
                    if cast is None:
                        cast = casts[id(param)] = (
                            copy(module, name, param) if copy is not None
                            else torch.nn.Parameter(param.detach().to(dtype), requires_grad=False))
                        cast.precast_from = param  # for code that needs the full-precision values (merged LoRA)
                    module._parameters[name] = cast
                    swapped.append((module, name, param))
        yield model
    finally:
        for module, name, param in reversed(swapped):
            module._parameters[name] = param
