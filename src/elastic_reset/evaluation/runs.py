"""Reading run directories into :class:`Run` objects, the input of :mod:`~elastic_reset.evaluation.summary` and
:mod:`~elastic_reset.evaluation.figures`.

A *run* is a directory written by :class:`elastic_reset.rl.trainer.RLTrainer`: ``config.yaml``,
``metrics.jsonl`` and ``task.json`` (which score and drift its task is reported by). Only its evaluation
records (``eval/reward`` with the drift metrics, logged every ``eval.every`` iterations on held-out prompts and
text) enter a frontier: training rewards are noisy, on-policy, and KL-shaped.
Runs are grouped by method (:func:`group_runs`); each group's seeds then give a mean ± standard error.

This module only reads: no statistics, no figures.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from elastic_reset.errors import ReportError, RunFileError
from elastic_reset.io import read_metrics


@dataclass(frozen=True)
class DriftMetric:
    key: str
    """The metric's name after the ``eval/`` (or ``eval_ema/``) prefix of metrics.jsonl."""
    label: str
    """How axes and tables name it."""
    lower_is_better: bool
    """Perplexity and KL: lower is better (the figure inverts its y axis). BLEU-like metrics: higher."""


DRIFTS: dict[str, DriftMetric] = {
    # Neutral on purpose: the texts are held-out human text or the initial policy's samples (config eval.reference).
    "perplexity": DriftMetric("perplexity", "perplexity on the reference texts", True),
    "kl_init": DriftMetric("kl_init", "KL to the initial model", True),
    # The Translation Game: FR→EN BLEU of the speaker against the English the game never sees (paper §4).
    "drift_bleu": DriftMetric("drift_bleu", "FR→EN BLEU (drift)", False),
}

SCORES: dict[str, str] = {
    "reward": "validation reward",
    "task_bleu": "FR→EN→DE BLEU (task)",
    "gold": "gold reward (P(positive))",  # the gold-vs-proxy testbed: eval/reward is the proxy's
    "gold_log_odds": "gold reward (log-odds)",
}
"""Task scores a report can put on its x axis (``eval/<key>``), with their axis labels."""

# Which weights a run's evaluation describes: the policy (``eval/*``) or its EMA (``eval_ema/*``).
WEIGHTS = ("auto", "policy", "ema")
SWEEP_FILE = "sweep.jsonl"
"""``elastic-reset sweep``'s evaluations in a run directory (``rl/sweep.py`` writes it)."""
LABEL_FILE = "label"
"""A run directory's optional group name (``compare`` writes its cell label there); default: ``method.name``."""
TASK_FILE = "task.json"
"""What the trainer records of a run's task: ``{"name", "score", "drift"}``, the task score and drift metric a
report shows unless told otherwise (:attr:`elastic_reset.tasks.Task.score_key` and ``drift_key``)."""


def drift_metric(drift: str) -> DriftMetric:
    if drift not in DRIFTS:
        raise ReportError(f"drift: expected one of {', '.join(DRIFTS)}, got {drift!r}")
    return DRIFTS[drift]


def score_label(score: str) -> str:
    if score not in SCORES:
        raise ReportError(f"score: expected one of {', '.join(SCORES)}, got {score!r}")
    return SCORES[score]


@dataclass
class Run:
    """One run's evaluation history, ready to plot."""

    path: Path
    method: str
    """The group it is plotted in: ``method.name`` of its config unless overridden."""
    seed: int | None
    drift: str
    """Which drift metric ``drifts`` holds (a key of :data:`DRIFTS`)."""
    source: str
    """``eval`` (the policy's weights) or ``eval_ema`` (the EMA's)."""
    steps: np.ndarray
    rewards: np.ndarray
    """The task score at each evaluation (``eval/reward``, or the metric named by ``score``)."""
    drifts: np.ndarray
    reset_steps: list[int] = field(default_factory=list)
    """Iterations at which a reset happened (training records carrying ``reset``)."""
    total_steps: int | None = None
    """``steps`` of its config: the run is finished when its last evaluation is there."""
    score: str = "reward"
    """Which task score ``rewards`` holds (a key of :data:`SCORES`)."""
    test: tuple[float, float] | None = None
    """(score, drift) of the run's final test evaluation (``test/*`` records, tasks with test prompts), if any."""
    sweep: list[tuple[float, str, float, float]] = field(default_factory=list)
    """(λ, anchor, score, drift) of the points ``elastic-reset sweep`` evaluated (``sweep.jsonl``), if any: the
    weights between the run's policy and its initial model or EMA, not points the run itself passed through."""


def task_metrics(run_dir: str | Path) -> tuple[str, str]:
    """(score, drift) the run's task reports by (its ``task.json``); ``reward`` and ``perplexity`` for a run
    written before the trainer recorded them."""
    path = Path(run_dir) / TASK_FILE
    if not path.is_file():
        return "reward", "perplexity"
    try:
        task = json.loads(path.read_text(encoding="utf-8"))
        return str(task["score"]), str(task["drift"])
    except (ValueError, KeyError, TypeError, RecursionError) as e:  # ValueError: not UTF-8, or not JSON
        reason = " ".join(f"{type(e).__name__}: {e}".split())[:120]
        raise ReportError(f"{path}: expected a JSON object with \"score\" and \"drift\" ({reason}); pass --score "
                          "and --drift instead") from None


def _read_text(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise RunFileError(f"{path}: not UTF-8 text (byte {e.start}); expected {what}") from None


def _read_config(path: Path) -> dict[str, Any]:
    """A run's ``config.yaml`` as a mapping, its ``seed``, ``steps`` and ``method.name`` of the expected types; a
    damaged one is a one-line error naming it."""
    try:
        config = yaml.safe_load(_read_text(path, "the run's YAML config")) or {}
    except yaml.YAMLError as e:
        raise RunFileError(f"{path}: not valid YAML ({' '.join(str(e).split())[:120]})") from None
    if not isinstance(config, dict):
        raise RunFileError(f"{path}: expected a YAML mapping (the run's config), got a {type(config).__name__}")
    for key in ("seed", "steps"):
        value = config.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise RunFileError(f"{path}: {key}: expected an integer, got {value!r}")
    method = config.get("method")
    if method is not None and (not isinstance(method, dict) or not isinstance(method.get("name") or "", str)):
        raise RunFileError(f"{path}: method: expected a mapping with a string name, got {method!r}")
    return config


def _number(value: Any, path: Path, step: Any, key: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise RunFileError(f"{path}: the record of step {step} has {key} = {value!r}, not a number") from None


def load_run(run_dir: str | Path, *, method: str | None = None, drift: str | None = None,
             weights: str = "auto", score: str | None = None) -> Run:
    """Read one run directory.

    A torn last line of ``metrics.jsonl`` (a run still being written, or killed) is skipped; a bad line anywhere
    else raises :class:`~elastic_reset.errors.RunFileError` naming the file and line (see
    :func:`elastic_reset.io.read_metrics`).

    Args:
        method: the group name; default: the run's ``label`` file (written by ``compare``), else ``method.name``
            from its ``config.yaml``.
        drift: ``perplexity`` (``eval/perplexity``), ``kl_init`` (``eval/kl_init``) or ``drift_bleu``
            (``eval/drift_bleu``, the Translation Game's FR→EN BLEU); default: the task's own (:func:`task_metrics`).
        score: the task score, ``reward`` (``eval/reward``) or ``task_bleu`` (the Translation Game's FR→EN→DE
            BLEU); default: the task's own.
        weights: ``policy`` reads ``eval/*``, ``ema`` reads ``eval_ema/*``; ``auto`` reads the EMA's evaluation
            for method ``ema_only`` (that ablation's point is the EMA; its policy is plain KL-penalised RL) and
            the policy's for every other method.
    """
    run_dir = Path(run_dir)
    if score is None or drift is None:
        task_score, task_drift = task_metrics(run_dir)
        score, drift = score or task_score, drift or task_drift
    metric = drift_metric(drift)
    score_label(score)
    if weights not in WEIGHTS:
        raise ReportError(f"weights: expected one of {', '.join(WEIGHTS)}, got {weights!r}")
    metrics_path = run_dir / "metrics.jsonl"
    if not metrics_path.is_file():
        raise ReportError(f"{metrics_path}: not found ({run_dir} is not a training run directory)")
    config_path = run_dir / "config.yaml"
    config: dict[str, Any] = {}
    if config_path.is_file():
        config = _read_config(config_path)
    elif method is None:
        raise ReportError(f"{config_path}: not found, so the run's method is unknown (name it explicitly)")
    if method is None and (run_dir / LABEL_FILE).is_file():
        method = _read_text(run_dir / LABEL_FILE, "the run's group name").strip() or None
    if method is None:
        method = (config.get("method") or {}).get("name")
        if not method:
            raise ReportError(f"{config_path}: has no method.name")

    records = read_metrics(metrics_path, warn_torn=True)
    has_ema = any("eval_ema/reward" in r for r in records)
    if weights == "ema" and not has_ema:
        raise ReportError(f"{metrics_path}: has no eval_ema/* records (the method keeps no EMA, or eval.ema "
                          "was off)")
    use_ema = weights == "ema" or (weights == "auto" and has_ema
                                   and (config.get("method") or {}).get("name") == "ema_only")
    source = "eval_ema" if use_ema else "eval"
    reward_key, drift_key = f"{source}/{score}", f"{source}/{metric.key}"

    # Keyed by step: should a line ever be repeated (a resume that could not truncate), the later one wins.
    evals: dict[int, tuple[float, float]] = {}
    resets: set[int] = set()
    test = None
    for r in records:
        if f"test/{score}" in r and f"test/{metric.key}" in r:
            test = (_number(r[f"test/{score}"], metrics_path, r["step"], f"test/{score}"),
                    _number(r[f"test/{metric.key}"], metrics_path, r["step"], f"test/{metric.key}"))
        if reward_key in r:
            if drift_key not in r:
                raise ReportError(f"{metrics_path}: the evaluation record of step {r.get('step')} has "
                                  f"{reward_key} but no {drift_key}")
            evals[int(r["step"])] = (_number(r[reward_key], metrics_path, r["step"], reward_key),
                                     _number(r[drift_key], metrics_path, r["step"], drift_key))
        elif isinstance(r.get("reset"), dict):
            resets.add(int(r["step"]))
    if not evals:
        raise ReportError(f"{metrics_path}: has no evaluation records ({reward_key}); was eval.every 0, or was "
                          "the run stopped before its first evaluation?")
    steps = sorted(evals)
    sweep = []
    sweep_path = run_dir / SWEEP_FILE
    if sweep_path.is_file():
        for r in read_metrics(sweep_path):
            if f"eval/{score}" in r and f"eval/{metric.key}" in r:
                sweep.append((float(r["lambda"]), str(r["toward"]),
                              _number(r[f"eval/{score}"], sweep_path, r.get("step"), f"eval/{score}"),
                              _number(r[f"eval/{metric.key}"], sweep_path, r.get("step"), f"eval/{metric.key}")))
    seed = config.get("seed")
    return Run(
        path=run_dir, method=method, seed=int(seed) if seed is not None else None, drift=drift, source=source,
        steps=np.array(steps, dtype=int),
        rewards=np.array([evals[s][0] for s in steps]),
        drifts=np.array([evals[s][1] for s in steps]),
        reset_steps=sorted(resets),
        total_steps=int(config["steps"]) if "steps" in config else None,
        score=score,
        test=test,
        sweep=sweep,
    )


def find_run_dirs(path: str | Path) -> list[Path]:
    """``path`` itself if it is a run, else every run below it (a compare grid), sorted. A path holding no run
    is reported with the metrics.jsonl it lacks."""
    path = Path(path)
    if (path / "metrics.jsonl").is_file():
        return [path]
    found = sorted(p.parent for p in path.rglob("metrics.jsonl")) if path.is_dir() else []
    if not found:
        raise ReportError(f"{path / 'metrics.jsonl'}: not found, and no run directory below {path}")
    return found


def group_runs(runs: list[Run]) -> dict[str, list[Run]]:
    """Runs by method, methods in order of first appearance, seeds sorted. Two runs of one seed in a group are
    refused: they are two variants (pooling them would understate the standard error), to be named apart."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        twin = next((r for r in groups.get(run.method, []) if r.seed is not None and r.seed == run.seed), None)
        if twin is not None:
            raise ReportError(f"{twin.path} and {run.path} are both seed {run.seed} of {run.method!r}: name the "
                              "variants apart (pareto LABEL=RUN_DIR ...)")
        groups.setdefault(run.method, []).append(run)
    for name, members in groups.items():
        members.sort(key=lambda r: (r.seed is None, r.seed if r.seed is not None else 0, str(r.path)))
    return groups


def check_groups(groups: dict[str, list[Run]]) -> str:
    """The drift metric every run of ``groups`` was loaded with. Refuses no groups, an empty group, and mixed
    drift metrics or task scores (mixing perplexity and KL on one axis is meaningless)."""
    if not groups:
        raise ReportError("no runs to report on")
    empty = [name for name, runs in groups.items() if not runs]
    if empty:
        raise ReportError(f"method {empty[0]!r} has no runs")
    drifts = {run.drift for runs in groups.values() for run in runs}
    if len(drifts) != 1:
        raise ReportError(f"runs were loaded with different drift metrics: {sorted(drifts)}")
    scores = {run.score for runs in groups.values() for run in runs}
    if len(scores) != 1:
        raise ReportError(f"runs were loaded with different task scores: {sorted(scores)}")
    return drifts.pop()


def group_score(groups: dict[str, list[Run]]) -> str:
    """The task score every run of ``groups`` was loaded with (checked by :func:`check_groups`)."""
    check_groups(groups)
    return next(iter(groups.values()))[0].score
