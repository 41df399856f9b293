"""``elastic-reset reward-model evaluate``, and the numbers training reports too: a model's scores of the chosen and
the rejected response of every pair, and from them accuracy (with its standard error over prompts), calibration
(ECE, log loss, reliability bins) and score statistics, overall, per category and per preference set."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from elastic_reset.data.preferences import DATASETS, PreferencePair, load_preferences, split_by_prompt
from elastic_reset.errors import ConfigError
from elastic_reset.io import atomic_write_text
from elastic_reset.reward_models.calibration import calibration, clustered_accuracy_se
from elastic_reset.reward_models.model import PairwiseRewardModel, load_reward_model
from elastic_reset.reward_models.packing import PairCollator, encode_pairs, pair_scores

EVALUATION = "evaluation.json"


@torch.no_grad()
def score_pairs(model: PairwiseRewardModel, pairs: list[PreferencePair], tokenizer, max_tokens: int,
                batch_size: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """The scores of the chosen and of the rejected response of every pair (the AM's: advantages), in the order of
    ``pairs``."""
    was_training = model.training
    model.eval()
    collate = PairCollator(tokenizer.pad_token_id)
    encoded = encode_pairs(pairs, tokenizer, max_tokens, share_prompt=model.shares_prompt)
    # Scored longest first, so that a batch pads to about its own length (see BENCHMARKS.md); the scores go back to
    # their pairs' places.
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


def evaluate_reward_model(path: str | Path, splits: tuple[str, ...] = ("test",), data_dir: str | None = None,
                          *, force: bool = False) -> dict:
    """Score a trained model again on the parts of its own split (the data, split fractions and seed it was trained
    with) and write ``path/evaluation.json``: for models trained before a metric existed (per-set accuracy and
    ECE), or on data moved to ``data_dir``. Returns ``{split: metrics}``."""
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
