"""LoRA adapters through peft: the one place the project calls ``get_peft_model``, and the merged weight W + s·BA
that the samplers multiply by instead of running the adapters beside the base."""

from __future__ import annotations

import warnings

import torch


def add_lora(model, lora_config):
    """``peft.get_peft_model(model, lora_config)``, without a warning that is neither the user's doing nor ours:
    peft (0.21) reads transformers' deprecated ``is_gradient_checkpointing`` on every model it wraps, and
    transformers (5.x) answers each time with a FutureWarning."""
    from peft import get_peft_model

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        return get_peft_model(model, lora_config)


def mergeable_lora(module) -> bool:
    """A peft LoRA linear layer in its plain form: adapters on, unmerged, no variant (DoRA...), no dropout in use."""
    try:
        from peft.tuners.lora import Linear as LoraLinear
    except ImportError:  # pragma: no cover - peft is optional
        return False
    if not isinstance(module, LoraLinear) or module.disable_adapters or module.merged:
        return False
    active = [a for a in module.active_adapters if a in module.lora_A]
    dropout_off = lambda d: isinstance(d, torch.nn.Identity) or not d.training or d.p == 0  # noqa: E731
    return (type(module.base_layer) is torch.nn.Linear and bool(active)
            and not any(a in module.lora_variant for a in active)
            and all(dropout_off(module.lora_dropout[a]) for a in active))


@torch.no_grad()
def merged_lora_weight(module) -> torch.Tensor:
    """W + s·BA of a :func:`mergeable_lora` layer, in fp32, from the fp32 W even where the trainer keeps a bf16 copy
    of it (``precast_weights``): rounding W to bf16 before adding the update, and again after, gave other samples
    than the run without the copy."""
    base = module.base_layer
    weight = getattr(base.weight, "precast_from", base.weight).detach().float()
    for adapter in module.active_adapters:
        if adapter in module.lora_A:
            weight = weight + module.get_delta_weight(adapter).float()
    return weight
