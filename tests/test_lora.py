"""``lm.lora.add_lora``: peft's LoRA wrapper, without the warning peft provokes from transformers."""

from __future__ import annotations

import warnings

from peft import LoraConfig

from elastic_reset.lm.lora import add_lora
from elastic_reset.models import tiny_causal_lm


def test_add_lora_wraps_the_model_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = add_lora(tiny_causal_lm(hidden=32, layers=2, seed=0),
                         LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]))
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
