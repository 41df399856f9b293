"""LoRA adapters through peft: the one place the project calls ``get_peft_model``."""

from __future__ import annotations

import warnings


def add_lora(model, lora_config):
    """``peft.get_peft_model(model, lora_config)``, without a warning that is neither the user's doing nor ours:
    peft (0.21) reads transformers' deprecated ``is_gradient_checkpointing`` on every model it wraps, and
    transformers (5.x) answers each time with a FutureWarning."""
    from peft import get_peft_model

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        return get_peft_model(model, lora_config)
