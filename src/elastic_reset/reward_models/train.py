"""``elastic-reset reward-model train``: a reward model or Advantage Model trained on named preference data with
transformers' ``Trainer`` (its loop, progress bar, checkpoints and ``resume_from_checkpoint``), the loss being the
only part written here; checkpointed by the ``Trainer`` (``--resume`` continues from the newest checkpoint) and
written atomically as one folder: its settings, its trained weights (the LoRA adapters and heads only, for
SmolLM2) and its validation and test metrics.

TRL's ``RewardTrainer`` fits the Bradley–Terry model alone: it scores ``AutoModelForSequenceClassification``
outputs for chosen and rejected and has no place for the Advantage Model's second head e(x) on the prompt or its
bounding loss. One ``Trainer`` subclass trains both, so RM and AM differ only in the loss and the extra head."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

import torch
from transformers import Trainer
from transformers.trainer_pt_utils import LengthGroupedSampler

from elastic_reset.data.preferences import load_preferences, split_by_prompt
from elastic_reset.errors import ConfigError
from elastic_reset.io import save_folder_atomically
from elastic_reset.lm.hf_trainer import TrainingClock, last_complete_checkpoint
from elastic_reset.reward_models.evaluate import evaluate_pairs
from elastic_reset.reward_models.losses import AM_MARGIN, advantage_model_loss, bradley_terry_loss
from elastic_reset.reward_models.model import (
    DEFAULT_LR,
    SETTINGS,
    WEIGHTS,
    RewardModelConfig,
    build_model,
    trained_state,
)
from elastic_reset.reward_models.packing import PairCollator, encode_pairs, pair_scores


class PairwiseTrainer(Trainer):
    """``Trainer`` with the pairwise loss: Bradley–Terry, or the Advantage Model's ranking + bounding loss."""

    def __init__(self, *args, margin: float = AM_MARGIN, **kwargs):
        super().__init__(*args, **kwargs)
        self.margin = margin

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        chosen, rejected = pair_scores(model, inputs)
        if model.is_advantage_model:
            loss = advantage_model_loss(chosen, rejected, self.margin)
        else:
            loss = bradley_terry_loss(chosen, rejected)
        return (loss, {"chosen": chosen, "rejected": rejected}) if return_outputs else loss

    def _get_train_sampler(self, train_dataset=None):
        # transformers infers lengths from an "input_ids" field our pairs do not have.
        if self.args.train_sampling_strategy != "group_by_length":
            return super()._get_train_sampler(train_dataset)
        dataset = self.train_dataset if train_dataset is None else train_dataset
        return LengthGroupedSampler(self.args.train_batch_size * self.args.gradient_accumulation_steps,
                                    lengths=[f["length"] for f in dataset])


def train_reward_model(config: RewardModelConfig, out: str | Path, *, resume: bool = False,
                       progress: bool = True, log=print, callbacks=None) -> dict:
    """Train, evaluate on val and test, and write ``out`` atomically; checkpoints go to ``out``'s sibling
    ``<name>.checkpoints`` (kept until the model is written). Returns the metrics."""
    from transformers import TrainingArguments

    from elastic_reset.lm.device import resolve_device

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
        save_total_limit=2, report_to=config.report_to or "none", remove_unused_columns=False, bf16=config.bf16,
        train_sampling_strategy="group_by_length" if config.group_by_length else "random",
        disable_tqdm=not progress, seed=config.seed, data_seed=config.seed, use_cpu=resolve_device().type != "cuda")
    try:
        trainer = PairwiseTrainer(model=model, args=args, margin=config.margin,
                                  train_dataset=encode_pairs(parts["train"], tokenizer, config.max_tokens,
                                                             share_prompt=model.shares_prompt),
                                  data_collator=PairCollator(tokenizer.pad_token_id), callbacks=callbacks)
    except RuntimeError as err:  # a tracker's callback whose package is not installed: transformers' one line
        if not config.report_to or "install" not in str(err):
            raise
        raise ConfigError(f"report_to: {err}") from None
    start = last_complete_checkpoint(checkpoints, log, "reward-model") if resume and checkpoints.is_dir() else None
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
        if (checkpoints / "runs").is_dir():  # TensorBoard's event files (transformers writes them there)
            shutil.copytree(checkpoints / "runs", tmp / "runs")

    save_folder_atomically(out, write)
    shutil.rmtree(checkpoints, ignore_errors=True)
    return metrics
