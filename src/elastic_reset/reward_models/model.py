"""A pairwise reward model: a backbone (SmolLM2 with LoRA, all-MiniLM-L6-v2, or a tiny test model) with a scalar
reward head r(x, y) on the pooled last hidden state of prompt + response, and for the Advantage Model a second
head e(x) on the prompt alone, the expected reward of the prompt (Peng et al. 2023, eq. 7).

Also the settings of one (:class:`RewardModelConfig`), the model they build fresh (:func:`build_model`), and its
folder: the settings and the trained weights only (:func:`trained_state`), loaded back by :func:`load_reward_model`
(for the RL engine's reward and for evaluation alike)."""

from __future__ import annotations

import json
import math
import pickle
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch
from torch import nn

from elastic_reset.errors import ConfigError, RunFileError
from elastic_reset.io import load_failure
from elastic_reset.lm.pooling import mean_pool
from elastic_reset.reward_models.losses import AM_MARGIN

POOLING = ("last", "mean")


class PairwiseRewardModel(nn.Module):
    """Args:
        backbone: a transformers base model (``last_hidden_state`` out), plain or wrapped by peft.
        pooling: ``last`` (the last non-padding token: decoders, as StackLLaMA's LLaMA reward model reads the end
            of the text) or ``mean`` (mean over tokens: how all-MiniLM-L6-v2 was trained to embed sentences).
        advantage: add the expected-reward head e(x) (the Advantage Model).
    """

    def __init__(self, backbone: nn.Module, pooling: str = "last", advantage: bool = False):
        super().__init__()
        if pooling not in POOLING:
            raise ValueError(f"pooling: expected one of {POOLING}, got {pooling!r}")
        self.backbone = backbone
        self.pooling = pooling
        hidden = backbone.config.hidden_size
        self.reward_head = nn.Linear(hidden, 1)
        self.expected_head = nn.Linear(hidden, 1) if advantage else None
        for head in filter(None, (self.reward_head, self.expected_head)):
            nn.init.normal_(head.weight, std=1.0 / (hidden + 1) ** 0.5)
            nn.init.zeros_(head.bias)

    @property
    def is_advantage_model(self) -> bool:
        return self.expected_head is not None

    def _pooled(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state.float()
        if self.pooling == "mean":
            return mean_pool(hidden, attention_mask)
        # The last position whose mask is 1, whichever side the padding is on.
        positions = torch.arange(attention_mask.shape[1], device=attention_mask.device).expand_as(attention_mask)
        last = (positions * attention_mask).argmax(1)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]

    def reward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """r(x, y) ``[B]`` for tokenized prompt + response."""
        return self.reward_head(self._pooled(input_ids, attention_mask)).squeeze(-1)

    def expected(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """e(x) ``[B]`` for tokenized prompts (the Advantage Model only)."""
        if self.expected_head is None:
            raise RuntimeError("expected(): this is a plain reward model, it has no expected-reward head")
        return self.expected_head(self._pooled(input_ids, attention_mask)).squeeze(-1)

    def score(self, input_ids, attention_mask, prompt_ids=None, prompt_mask=None) -> torch.Tensor:
        """What the model reports for a (prompt, response): r(x, y), or the advantage r(x, y) − e(x)."""
        reward = self.reward(input_ids, attention_mask)
        if self.expected_head is None:
            return reward
        return reward - self.expected(prompt_ids, prompt_mask)

    @property
    def shares_prompt(self) -> bool:
        """A last-token reader is a decoder: its responses can share one pass over their prompt
        (:mod:`~elastic_reset.reward_models.packing`). A mean-pooled encoder reads the prompt in the light of the
        response, so it reads each ``prompt + response`` on its own."""
        return self.pooling == "last"

    def packed_scores(self, packed_ids: torch.Tensor, packed_positions: torch.Tensor, packed_mask: torch.Tensor,
                      packed_ends: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(r(x, y) of every response ``[B, k]``, e(x) ``[B]`` or None) from rows that
        :func:`~elastic_reset.reward_models.packing.pack` built."""
        attention = self.backbone.config._attn_implementation
        if attention == "eager":  # eager attention adds the mask to the scores
            dtype = next(self.backbone.parameters()).dtype
            packed_mask = torch.zeros(packed_mask.shape, dtype=dtype, device=packed_mask.device).masked_fill(
                ~packed_mask, torch.finfo(dtype).min)
        elif attention != "sdpa":
            raise ValueError(f"packed scoring takes a custom attention mask: sdpa or eager attention, not {attention}")
        if self.expected_head is not None and bool((packed_ends[:, 0] < 0).any()):
            raise ValueError("the Advantage Model's e(x) needs at least one prompt token; a prompt is empty")
        hidden = self.backbone(input_ids=packed_ids, attention_mask=packed_mask,
                               position_ids=packed_positions).last_hidden_state.float()
        at = hidden[torch.arange(hidden.shape[0], device=hidden.device)[:, None], packed_ends]  # [B, 1 + k, H]
        rewards = self.reward_head(at[:, 1:]).squeeze(-1)
        expected = None if self.expected_head is None else self.expected_head(at[:, 0]).squeeze(-1)
        return rewards, expected


BACKBONES = ("smollm2", "minilm", "tiny-llama")
DEFAULT_LR = {"smollm2": 1e-4, "minilm": 3e-5, "tiny-llama": 3e-3}
"""LoRA on SmolLM2 takes a larger rate than full fine-tuning of MiniLM (StackLLaMA's LoRA reward model: 2e-5 on
LLaMA-7B with r = 8; these are small models)."""
WEIGHTS = "trained.pt"
SETTINGS = "reward_model.json"


@dataclass
class RewardModelConfig:
    """One reward model's training run."""

    backbone: str = "minilm"
    """``smollm2`` (SmolLM2-135M-Instruct with LoRA, pooled at the last token, as StackLLaMA's LLaMA + LoRA reward
    model), ``minilm`` (all-MiniLM-L6-v2, fully fine-tuned, mean-pooled) or ``tiny-llama`` (tests)."""
    advantage: bool = False
    """Train the Advantage Model (Peng et al. eq. 6) instead of the Bradley–Terry reward model."""
    margin: float = AM_MARGIN
    """m(x) of the Advantage Model's bounding loss."""
    data: list[str] = field(default_factory=lambda: ["hh-rlhf"])
    """Named sets (``hh-rlhf``, ``stack-exchange``) read from ``data_dir``, or paths of JSONL pair files."""
    data_dir: str | None = None
    """Folder holding ``hh-rlhf/`` and ``stack-exchange-paired/`` (``../shared/data``)."""
    split: tuple[float, float, float] = (0.8, 0.1, 0.1)
    """Train / val / test fractions of the prompts (each prompt in exactly one part)."""
    split_seed: int = 0
    """Seed of the split: fixed across the seeds of a comparison, so RM and AM see the same test set."""
    lora_r: int = 16
    """LoRA rank (SmolLM2 only; α = 2r, on q_proj and v_proj)."""
    lr: float | None = None
    """AdamW learning rate; None: the backbone's default (:data:`DEFAULT_LR`)."""
    epochs: float = 1.0
    """Passes over the training pairs."""
    batch_size: int = 8
    """Pairs per optimizer step."""
    group_by_length: bool = False
    """Batches of pairs of similar length (transformers' ``LengthGroupedSampler``: sorted within random groups of
    50 batches) instead of random batches: less padding a step (see BENCHMARKS.md). Off by default, so the
    committed MiniLM grid (random batches) reproduces."""
    max_tokens: int = 256
    """Tokens kept per prompt + response (the end is kept: where the responses differ)."""
    seed: int = 0
    """Seeds the heads, LoRA and the batch order."""
    bf16: bool = False
    """Train under bf16 autocast (the weights stay fp32; scoring stays fp32): for a GPU; on a CPU it was no faster
    than fp32 for SmolLM2 + LoRA (see BENCHMARKS.md)."""
    save_steps: int = 100
    """The Trainer writes a checkpoint every this many steps (``--resume`` starts from the newest)."""
    report_to: list[str] = field(default_factory=list)
    """Experiment trackers, as transformers' ``report_to`` (``tensorboard``, ``wandb``, ``trackio``, ``mlflow``, ...,
    or ``all`` installed); none by default. TensorBoard's event files end up in the model's folder, under ``runs/``."""

    def validate(self) -> None:
        if self.backbone not in BACKBONES and not (Path(self.backbone) / "config.json").is_file():
            raise ConfigError(f"backbone: expected one of {BACKBONES} or a Hugging Face folder, got {self.backbone!r}")
        if not self.data:
            raise ConfigError("data: name at least one preference set (hh-rlhf, stack-exchange) or JSONL file")
        # Checked before any data or model loads: a bad number must not cost the minutes a model takes to build.
        for name, value in (("epochs", self.epochs), ("margin", self.margin), ("lr", self.lr)):
            if name == "lr" and value is None:  # the backbone's default
                continue
            finite = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if not (finite and value > 0):
                raise ConfigError(f"{name}: expected a finite number > 0, got {value!r}")
        for name in ("seed", "split_seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**32:
                raise ConfigError(f"{name}: expected an integer from 0 to {2**32 - 1}, got {value!r}")
        from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

        known = ["all", "none", *INTEGRATION_TO_CALLBACK]
        for name in self.report_to:
            if name not in known:
                raise ConfigError(f"report_to: expected tracker names from {', '.join(known)}, got {name!r}")
        for name in ("batch_size", "max_tokens", "lora_r", "save_steps"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                raise ConfigError(f"{name}: expected a positive integer, got {getattr(self, name)!r}")


def build_model(config: RewardModelConfig):
    """(PairwiseRewardModel, tokenizer) with fresh heads (and fresh LoRA adapters on SmolLM2)."""
    from transformers import AutoModel, AutoTokenizer

    torch.manual_seed(config.seed)
    if config.backbone == "smollm2":
        from peft import LoraConfig

        from elastic_reset.lm.lora import add_lora
        from elastic_reset.models import load_smollm2

        causal, tokenizer = load_smollm2()
        backbone = add_lora(causal.model, LoraConfig(r=config.lora_r, lora_alpha=2 * config.lora_r,
                                                     target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
        pooling = "last"
    elif config.backbone == "tiny-llama":
        from elastic_reset.models import byte_tokenizer, tiny_causal_lm

        backbone, tokenizer, pooling = tiny_causal_lm(seed=config.seed).model, byte_tokenizer(), "last"
    else:
        from elastic_reset.models import minilm_path

        path = minilm_path() if config.backbone == "minilm" else Path(config.backbone)
        backbone, tokenizer, pooling = AutoModel.from_pretrained(path), AutoTokenizer.from_pretrained(path), "mean"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    rows = backbone.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:  # ids past the embedding table: an index error mid-training, or silent garbage
        raise ConfigError(f"backbone: {config.backbone}: its tokenizer has {len(tokenizer)} tokens but the model "
                          f"embeds {rows}; the folder's tokenizer is not the model's")
    return PairwiseRewardModel(backbone, pooling=pooling, advantage=config.advantage), tokenizer


def trained_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights training changed: every parameter that requires grad (LoRA adapters and heads, or all)."""
    return {n: p.detach().cpu().clone() for n, p in model.named_parameters() if p.requires_grad}


def load_reward_model(path: str | Path):
    """(PairwiseRewardModel, tokenizer, settings) from a folder
    :func:`~elastic_reset.reward_models.train.train_reward_model` wrote."""
    path = Path(path)
    if not (path / SETTINGS).is_file():
        raise FileNotFoundError(f"{path}: no {SETTINGS}; train one with `elastic-reset reward-model train`")
    where = path / SETTINGS
    try:
        settings = json.loads(where.read_text(encoding="utf-8"))
        saved = dict(settings["config"])
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise ConfigError(f"{where}: not the settings `reward-model train` writes ({type(err).__name__})") from None
    known = {f.name for f in fields(RewardModelConfig)}
    unknown = sorted(set(saved) - known)
    if unknown:
        raise ConfigError(f"{where}: config.{unknown[0]}: unknown key (known: {', '.join(sorted(known))})")
    if "split" in saved:
        saved["split"] = tuple(saved["split"])
    config = RewardModelConfig(**saved)
    model, tokenizer = build_model(config)
    try:  # tensors and plain data only: unpickling anything else could run code planted in the file
        state = torch.load(path / WEIGHTS, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as err:
        raise RunFileError(f"{path / WEIGHTS}: does not load ({load_failure(err)[1]})") from None
    expected = set(trained_state(model))
    if set(state) != expected:
        raise ValueError(f"{path / WEIGHTS}: its tensors do not match a {config.backbone} "
                         f"{'Advantage' if config.advantage else 'reward'} model")
    model.load_state_dict(state, strict=False)
    return model.eval(), tokenizer, settings
