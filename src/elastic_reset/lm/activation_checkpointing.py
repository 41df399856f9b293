"""Activation (gradient) checkpointing through transformers, for a policy kept in eval mode.

transformers recomputes a checkpointed layer's activations in the backward pass instead of keeping them, but only
for a layer in training mode. The policy here stays in eval mode (no dropout: PPO's ratio compares the same
weights), so the checkpointed layers alone are marked training for a forward with grad; their submodules, dropout
included, stay in eval mode. A layer whose own forward reads its training flag (Marian's functional dropout) is
found by a probe before the run and refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from elastic_reset.errors import ConfigError


def _layers(model: nn.Module) -> list[nn.Module]:
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing]


@contextmanager
def recomputing(model: nn.Module) -> Iterator[None]:
    """Within it, a forward with grad through ``model`` keeps only each checkpointed layer's input; the backward
    pass recomputes the rest."""
    layers = _layers(model)
    before = [layer.training for layer in layers]
    for layer in layers:
        layer.training = True
    try:
        yield
    finally:
        for layer, was in zip(layers, before):
            layer.training = was


def enable_activation_checkpointing(model: nn.Module, name: str) -> None:
    """Checkpoint every decoder (and encoder) layer of ``model`` (a transformers model, or peft's around one:
    transformers' ``activation_checkpointing_enable``, non-reentrant) and put it in eval mode, after checking that
    a forward under :func:`recomputing` computes what eval mode does. ``name``: the model, for the error."""
    get_base = getattr(model, "get_base_model", None)
    base = get_base() if callable(get_base) else model
    if not getattr(base, "supports_gradient_checkpointing", False):
        raise ConfigError(f"model.activation_checkpointing: {name!r} ({type(base).__name__}) does not support "
                          "activation checkpointing in transformers")
    base.activation_checkpointing_enable({"use_reentrant": False})
    base.disable_input_require_grads()  # a hook only reentrant checkpointing needs; it would run in every decoding step
    model.eval()
    ids = torch.arange(1, 9, device=next(model.parameters()).device)[None] % model.config.vocab_size
    inputs = {"input_ids": ids, "use_cache": False,
              **({"decoder_input_ids": ids} if model.config.is_encoder_decoder else {})}
    with torch.no_grad():
        expected = model(**inputs).logits
    with recomputing(model), torch.enable_grad():
        got = model(**inputs).logits.detach()
    if not torch.allclose(got, expected, rtol=1e-5, atol=1e-5):
        raise ConfigError(f"model.activation_checkpointing: {name!r} ({type(base).__name__}) computes other outputs "
                          "when its layers are marked training (dropout in the layers' own forward); set it to false")
