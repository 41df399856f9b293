"""Training a pairwise reward model with transformers' ``Trainer`` (its loop, progress bar, checkpoints and
``resume_from_checkpoint``), the loss being the only part written here.

TRL's ``RewardTrainer`` fits the Bradley–Terry model alone: it scores ``AutoModelForSequenceClassification``
outputs for chosen and rejected and has no place for the Advantage Model's second head e(x) on the prompt or its
bounding loss. One ``Trainer`` subclass trains both, so RM and AM differ only in the loss and the extra head."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import Trainer, TrainerCallback
from transformers.trainer_pt_utils import LengthGroupedSampler

from elastic_reset.io import atomic_write_text
from elastic_reset.lm.scoring import right_pad
from elastic_reset.reward_models.calibration import calibration, clustered_accuracy_se
from elastic_reset.reward_models.data import DATASETS, PreferencePair
from elastic_reset.reward_models.losses import AM_MARGIN, advantage, advantage_model_loss, bradley_terry_loss
from elastic_reset.reward_models.model import PairwiseRewardModel
from elastic_reset.reward_models.packing import encode_shared_prompts, pack


@contextmanager
def truncating_left(tokenizer) -> Iterator:
    """Within the block the tokenizer cuts a long text from the left: a long dialogue keeps its end, where the
    responses are (in training and when the trained model scores a policy's text alike)."""
    side = tokenizer.truncation_side
    tokenizer.truncation_side = "left"
    try:
        yield tokenizer
    finally:
        tokenizer.truncation_side = side


def encode_pairs(pairs: list[PreferencePair], tokenizer, max_tokens: int, share_prompt: bool = False) -> list[dict]:
    """Token ids of each pair, with its ``length`` (the tokens a batch pads it to).

    ``share_prompt`` (a causal model, :attr:`PairwiseRewardModel.shares_prompt`): the prompt once and the two
    responses, packed into one row by the collator (:mod:`~elastic_reset.reward_models.packing`). Otherwise
    prompt + chosen, prompt + rejected and the prompt, each cut to its last ``max_tokens``."""
    if share_prompt:
        encoded = encode_shared_prompts(tokenizer, [p.prompt for p in pairs], [[p.chosen, p.rejected] for p in pairs],
                                        max_tokens)
        return [{"prompt": x, "responses": ys, "length": len(x) + sum(map(len, ys))} for x, ys in encoded]
    with truncating_left(tokenizer):
        def ids(texts):
            return tokenizer(texts, truncation=True, max_length=max_tokens)["input_ids"]
        chosen = ids([p.prompt + p.chosen for p in pairs])
        rejected = ids([p.prompt + p.rejected for p in pairs])
        prompts = ids([p.prompt for p in pairs])
    return [{"chosen": c, "rejected": r, "prompt": x, "length": max(len(c), len(r))}
            for c, r, x in zip(chosen, rejected, prompts)]


@dataclass
class PairCollator:
    """Packs each pair's prompt and responses into one row (features of ``encode_pairs(..., share_prompt=True)``),
    or pads the three sequences of each pair (right padding; the model pools the last real token either way)."""

    pad_token_id: int

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        if "responses" in features[0]:
            return pack([f["prompt"] for f in features], [f["responses"] for f in features], self.pad_token_id)
        # Chosen and rejected in one batch: one forward for both.
        pair_ids, pair_mask = right_pad([f["chosen"] for f in features] + [f["rejected"] for f in features],
                                        self.pad_token_id)
        prompt_ids, prompt_mask = right_pad([f["prompt"] for f in features], self.pad_token_id)
        return {"pair_ids": pair_ids, "pair_mask": pair_mask, "prompt_ids": prompt_ids, "prompt_mask": prompt_mask}


def pair_scores(model: PairwiseRewardModel, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(score of chosen, score of rejected): rewards, or advantages for the Advantage Model."""
    if "packed_ids" in batch:
        rewards, expected = model.packed_scores(batch["packed_ids"], batch["packed_positions"], batch["packed_mask"],
                                                batch["packed_ends"])
        chosen, rejected = rewards.unbind(1)
    else:
        chosen, rejected = model.reward(batch["pair_ids"], batch["pair_mask"]).chunk(2)
        expected = model.expected(batch["prompt_ids"], batch["prompt_mask"]) if model.is_advantage_model else None
    if expected is not None:
        chosen, rejected = advantage(chosen, expected), advantage(rejected, expected)
    return chosen, rejected


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


class TrainingClock(TrainerCallback):
    """The seconds a training took, over every process of a resumed run: each checkpoint keeps the seconds up to it
    in ``training_seconds.json``, and a resumed run counts on from the one it starts from. What ran after the last
    checkpoint of an interrupted process is done again, so it is not counted. (The Trainer's own ``train_runtime``
    is the last process's alone: a SmolLM2 reward model on 2 CPU cores takes several processes.)"""

    FILE = "training_seconds.json"

    def __init__(self, checkpoint: str | Path | None = None):
        path = None if checkpoint is None else Path(checkpoint) / self.FILE
        # A checkpoint written before this clock existed has no file: its time is unknown, so it counts as 0.
        self.before = json.loads(path.read_text())["seconds"] if path is not None and path.is_file() else 0.0
        self.start = time.perf_counter()

    def seconds(self) -> float:
        return self.before + time.perf_counter() - self.start

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_save(self, args, state, control, **kwargs):
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if folder.is_dir():
            atomic_write_text(folder / self.FILE, json.dumps({"seconds": self.seconds()}) + "\n")


def last_complete_checkpoint(folder: str | Path, log=print) -> str | None:
    """The newest checkpoint in ``folder`` whose save finished, or None. transformers' ``get_last_checkpoint`` takes
    the newest folder as it is, so after a process killed while saving, ``--resume`` would stop at a missing or
    half-written file (transformers 5.23: ``FileNotFoundError`` / ``JSONDecodeError`` on ``trainer_state.json``),
    or load half-written weights. ``Trainer._save_checkpoint`` writes the weights, the optimizer, scheduler and RNG
    states, and the trainer state last (none atomically), so a readable ``trainer_state.json`` marks a finished
    save. (Its rotation deletes old checkpoints only after a newer one is saved, so a half-deleted one is never the
    newest finished.) Newer, unfinished checkpoints are removed, each named in the log, so that the rotation cannot
    later keep one of them in place of a good one."""
    found = []
    for path in Path(folder).glob("checkpoint-*"):
        step = path.name.removeprefix("checkpoint-")
        if path.is_dir() and step.isdigit():
            found.append((int(step), path))
    for _, path in sorted(found, reverse=True):
        try:
            json.loads((path / "trainer_state.json").read_text())
            return str(path)
        except (OSError, ValueError):
            log(f"reward-model: {path} was not saved to the end (no readable trainer_state.json): removed")
            shutil.rmtree(path)
    return None


@torch.no_grad()
def score_pairs(model: PairwiseRewardModel, pairs: list[PreferencePair], tokenizer, max_tokens: int,
                batch_size: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """The scores of the chosen and of the rejected response of every pair (the AM's: advantages), in the order of
    ``pairs``."""
    was_training = model.training
    model.eval()
    collate = PairCollator(tokenizer.pad_token_id)
    encoded = encode_pairs(pairs, tokenizer, max_tokens, share_prompt=model.shares_prompt)
    # Scored longest first, so that a batch pads to about its own length (the HH-RLHF + Stack Exchange test split at
    # 256 tokens: 1.12x the real tokens, 1.54x in file order); the scores go back to their pairs' places.
    order = sorted(range(len(encoded)), key=lambda i: -encoded[i]["length"])
    device = next(model.parameters()).device
    chosen, rejected = np.empty(len(encoded)), np.empty(len(encoded))
    try:
        for start in range(0, len(order), batch_size):
            where = order[start:start + batch_size]
            batch = {k: v.to(device) for k, v in collate([encoded[i] for i in where]).items()}
            c, r = pair_scores(model, batch)
            chosen[where], rejected[where] = c.float().cpu().numpy(), r.float().cpu().numpy()
    finally:
        model.train(was_training)
    return chosen, rejected


def pair_metrics(pairs: list[PreferencePair], chosen: np.ndarray, rejected: np.ndarray) -> dict:
    """Accuracy (with its standard error over prompts, :func:`clustered_accuracy_se`), ECE, log loss, mean
    confidence and the reliability bins of σ(score_c − score_r) over all pairs; per category the same plus the mean
    and standard deviation of the scores of all its responses (Peng et al. Fig. 1 and 4: comparable score
    distributions across tasks); per named preference set present (``hh-rlhf``, ``stack-exchange``) the same
    numbers (their Table 1 reports HH-RLHF alone)."""
    margins = chosen - rejected
    categories = np.asarray([p.category for p in pairs])
    prompts = np.asarray([p.prompt for p in pairs], dtype=object)

    def numbers(cal, where) -> dict:  # one list of the reported numbers, for every subset alike
        return {"pairs": int(np.sum(where)), "prompts": len(set(prompts[where].tolist())), "accuracy": cal.accuracy,
                "accuracy_se": clustered_accuracy_se(margins[where], prompts[where]), "ece": cal.ece,
                "log_loss": cal.log_loss, "confidence": cal.confidence}

    def summary(where) -> dict:
        return numbers(calibration(margins[where]), where)

    everything = calibration(margins)
    per_category = {}
    for cat in sorted(set(categories.tolist())):
        where = categories == cat
        scores = np.concatenate([chosen[where], rejected[where]])
        per_category[cat] = {"mean": float(scores.mean()), "std": float(scores.std()), "responses": int(scores.size),
                             **summary(where)}
    members = {name: np.isin(categories, cats) for name, cats in DATASETS.items()}
    datasets = {name: summary(where) for name, where in members.items() if where.any()}
    return {**numbers(everything, np.ones(len(pairs), dtype=bool)), "categories": per_category, "datasets": datasets,
            "bins": {"confidence": everything.bin_confidence.tolist(), "accuracy": everything.bin_accuracy.tolist(),
                     "count": everything.bin_count.tolist()}}


def evaluate_pairs(model: PairwiseRewardModel, pairs: list[PreferencePair], tokenizer, max_tokens: int,
                   batch_size: int = 16) -> dict:
    """:func:`pair_metrics` of the model's scores on ``pairs``."""
    return pair_metrics(pairs, *score_pairs(model, pairs, tokenizer, max_tokens, batch_size))
