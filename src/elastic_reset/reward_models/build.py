"""``elastic-reset reward-model train``: a reward model or Advantage Model on named preference data, trained with
:class:`~elastic_reset.reward_models.train.PairwiseTrainer`, checkpointed by the ``Trainer`` (``--resume``
continues from the newest checkpoint) and written atomically as one folder: its settings, its trained weights
(the LoRA adapters and heads only, for SmolLM2) and its validation and test metrics."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from elastic_reset.errors import ConfigError
from elastic_reset.io import atomic_write_text, save_folder_atomically
from elastic_reset.reward_models.data import (
    PreferencePair,
    load_hh_rlhf,
    load_stack_exchange,
    read_pairs,
    split_by_prompt,
)
from elastic_reset.reward_models.losses import AM_MARGIN
from elastic_reset.reward_models.model import PairwiseRewardModel

BACKBONES = ("smollm2", "minilm", "tiny-llama")
DEFAULT_LR = {"smollm2": 1e-4, "minilm": 3e-5, "tiny-llama": 3e-3}
"""LoRA on SmolLM2 takes a larger rate than full fine-tuning of MiniLM (StackLLaMA's LoRA reward model: 2e-5 on
LLaMA-7B with r = 8; these are small models)."""
WEIGHTS = "trained.pt"
SETTINGS = "reward_model.json"
EVALUATION = "evaluation.json"


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
    50 batches) instead of random batches: on HH-RLHF + Stack Exchange at 256 tokens, 1.4x fewer padded tokens a
    step. Off by default, so the committed MiniLM grid (random batches) reproduces."""
    max_tokens: int = 256
    """Tokens kept per prompt + response (the end is kept: where the responses differ)."""
    seed: int = 0
    """Seeds the heads, LoRA and the batch order."""
    bf16: bool = False
    """Train under bf16 autocast (the weights stay fp32; scoring stays fp32): for a GPU. On a 2-core AVX-512 BF16 CPU
    the Trainer's autocast was no faster than fp32 for SmolLM2 + LoRA (8 steps of the same batches: 112 s against
    114 s, 2026-11-25). Not profiled; the likely causes are the two the RL engine measured and works around
    (:mod:`elastic_reset.lm.cpu_bf16`): bf16 attention is slow on such CPUs, and frozen weights are recast each pass."""
    save_steps: int = 100
    """The Trainer writes a checkpoint every this many steps (``--resume`` starts from the newest)."""

    def validate(self) -> None:
        if self.backbone not in BACKBONES and not (Path(self.backbone) / "config.json").is_file():
            raise ConfigError(f"backbone: expected one of {BACKBONES} or a Hugging Face folder, got {self.backbone!r}")
        if not self.data:
            raise ConfigError("data: name at least one preference set (hh-rlhf, stack-exchange) or JSONL file")
        for name, value in (("epochs", self.epochs), ("margin", self.margin)):
            if not value > 0:
                raise ConfigError(f"{name}: expected > 0, got {value!r}")
        for name in ("batch_size", "max_tokens", "lora_r", "save_steps"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                raise ConfigError(f"{name}: expected a positive integer, got {getattr(self, name)!r}")


def load_preferences(data: list[str], data_dir: str | None) -> list[PreferencePair]:
    pairs = []
    for name in data:
        if name in ("hh-rlhf", "stack-exchange"):
            if data_dir is None:
                raise ConfigError(f"data_dir: {name!r} is read from a data folder (e.g. ../shared/data)")
            pairs += load_hh_rlhf(data_dir) if name == "hh-rlhf" else load_stack_exchange(data_dir)
        else:
            pairs += read_pairs(name)
    return pairs


def build_model(config: RewardModelConfig):
    """(PairwiseRewardModel, tokenizer) with fresh heads (and fresh LoRA adapters on SmolLM2)."""
    from transformers import AutoModel, AutoTokenizer

    torch.manual_seed(config.seed)
    if config.backbone == "smollm2":
        from peft import LoraConfig, get_peft_model

        from elastic_reset.models import load_smollm2

        causal, tokenizer = load_smollm2()
        backbone = get_peft_model(causal.model, LoraConfig(r=config.lora_r, lora_alpha=2 * config.lora_r,
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
    return PairwiseRewardModel(backbone, pooling=pooling, advantage=config.advantage), tokenizer


def trained_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights training changed: every parameter that requires grad (LoRA adapters and heads, or all)."""
    return {n: p.detach().cpu().clone() for n, p in model.named_parameters() if p.requires_grad}


def load_reward_model(path: str | Path):
    """(PairwiseRewardModel, tokenizer, settings) from a folder :func:`train_reward_model` wrote."""
    path = Path(path)
    if not (path / SETTINGS).is_file():
        raise FileNotFoundError(f"{path}: no {SETTINGS}; train one with `elastic-reset reward-model train`")
    settings = json.loads((path / SETTINGS).read_text())
    config = RewardModelConfig(**{**settings["config"], "split": tuple(settings["config"]["split"])})
    model, tokenizer = build_model(config)
    state = torch.load(path / WEIGHTS, map_location="cpu", weights_only=True)
    expected = set(trained_state(model))
    if set(state) != expected:
        raise ValueError(f"{path / WEIGHTS}: its tensors do not match a {config.backbone} "
                         f"{'Advantage' if config.advantage else 'reward'} model")
    model.load_state_dict(state, strict=False)
    return model.eval(), tokenizer, settings


def train_reward_model(config: RewardModelConfig, out: str | Path, *, resume: bool = False,
                       progress: bool = True, log=print, callbacks=None) -> dict:
    """Train, evaluate on val and test, and write ``out`` atomically; checkpoints go to ``out``'s sibling
    ``<name>.checkpoints`` (kept until the model is written). Returns the metrics."""
    from transformers import TrainingArguments

    from elastic_reset.reward_models.train import (
        PairCollator,
        PairwiseTrainer,
        TrainingClock,
        encode_pairs,
        evaluate_pairs,
        last_complete_checkpoint,
    )

    config.validate()
    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out}: a reward model is already there (choose another --out)")
    checkpoints = out.parent / f"{out.name}.checkpoints"
    if checkpoints.exists() and not resume:
        raise FileExistsError(f"{checkpoints}: an unfinished run is there; continue it with --resume")
    parts = split_by_prompt(load_preferences(config.data, config.data_dir), config.split, config.split_seed)
    empty = [name for name, part in parts.items() if not part]
    if empty:  # found now, not after the training, when the evaluation would have nothing to score
        raise ConfigError(f"data: the split {tuple(config.split)} by prompt (seed {config.split_seed}) leaves no "
                          f"{' and no '.join(empty)} pairs out of {sum(map(len, parts.values()))}: give more pairs "
                          "(more distinct prompts) or other split fractions")
    log(f"reward-model: {', '.join(f'{k} {len(v):,}' for k, v in parts.items())} pairs")
    model, tokenizer = build_model(config)
    args = TrainingArguments(
        output_dir=str(checkpoints), per_device_train_batch_size=config.batch_size, num_train_epochs=config.epochs,
        learning_rate=config.lr or DEFAULT_LR.get(config.backbone, 3e-5), weight_decay=0.0, warmup_steps=0.05,
        lr_scheduler_type="linear", logging_steps=10, save_strategy="steps", save_steps=config.save_steps,
        save_total_limit=2, report_to=[], remove_unused_columns=False, bf16=config.bf16,
        train_sampling_strategy="group_by_length" if config.group_by_length else "random",
        disable_tqdm=not progress, seed=config.seed, data_seed=config.seed, use_cpu=not torch.cuda.is_available())
    trainer = PairwiseTrainer(model=model, args=args, margin=config.margin,
                              train_dataset=encode_pairs(parts["train"], tokenizer, config.max_tokens,
                                                         share_prompt=model.shares_prompt),
                              data_collator=PairCollator(tokenizer.pad_token_id), callbacks=callbacks)
    start = last_complete_checkpoint(checkpoints, log) if resume and checkpoints.is_dir() else None
    clock = TrainingClock(start)
    trainer.add_callback(clock)
    trainer.train(resume_from_checkpoint=start)
    metrics = {"train_seconds": clock.seconds(), "train_pairs": len(parts["train"]),
               "train_loss": [r["loss"] for r in trainer.state.log_history if "loss" in r]}
    for split in ("val", "test"):
        metrics[split] = evaluate_pairs(model, parts[split], tokenizer, config.max_tokens)
        log(f"reward-model: {split} accuracy {metrics[split]['accuracy']:.3f}, ECE {metrics[split]['ece']:.3f}")

    def write(tmp: Path) -> None:
        torch.save(trained_state(model), tmp / WEIGHTS)
        settings = {"config": asdict(config), "metrics": metrics}
        (tmp / SETTINGS).write_text(json.dumps(settings, indent=2) + "\n")

    save_folder_atomically(out, write)
    shutil.rmtree(checkpoints, ignore_errors=True)
    return metrics


def evaluate_reward_model(path: str | Path, splits: tuple[str, ...] = ("test",), data_dir: str | None = None,
                          *, force: bool = False) -> dict:
    """Score a trained model again on the parts of its own split (the data, split fractions and seed it was trained
    with) and write ``path/evaluation.json``: for models trained before a metric existed (per-set accuracy and
    ECE), or on data moved to ``data_dir``. Returns ``{split: metrics}``."""
    from elastic_reset.reward_models.train import evaluate_pairs

    path = Path(path)
    model, tokenizer, settings = load_reward_model(path)
    config = settings["config"]
    target = path / EVALUATION
    if target.exists() and not force:
        raise FileExistsError(f"{target}: already there (--force replaces it)")
    unknown = sorted(set(splits) - {"train", "val", "test"})
    if unknown:
        raise ConfigError(f"split: expected train, val or test, got {', '.join(unknown)}")
    pairs = load_preferences(config["data"], data_dir or config["data_dir"])
    parts = split_by_prompt(pairs, tuple(config["split"]), config["split_seed"])
    results = {split: evaluate_pairs(model, parts[split], tokenizer, config["max_tokens"]) for split in splits}
    atomic_write_text(target, json.dumps(results, indent=2) + "\n")
    return results
