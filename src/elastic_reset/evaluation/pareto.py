"""Reward-vs-drift Pareto frontiers (Elastic Reset paper §5).

Every validation point of a run is a pair (task score, drift). A method's *frontier* answers "what is the least
drift with which this method reached at least this score?": at score level x it is the best drift over all points
whose score is ≥ x. It is a step function, monotone in x (reaching a higher score never gets cheaper). Across
seeds, each seed's frontier is read on a common grid of score levels that every seed reaches, and the mean and
standard error over seeds are taken level by level.

Drift may be lower-is-better (perplexity, KL) or higher-is-better (BLEU): ``lower_is_better`` says which.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def frontier_at(scores, drifts, levels, lower_is_better: bool = True) -> np.ndarray:
    """The frontier of one run at each score level: best drift over points with score ≥ level (NaN where no
    point reaches the level). Ties in score are handled naturally (all points at that score count)."""
    scores = np.asarray(scores, dtype=float)
    drifts = np.asarray(drifts, dtype=float)
    levels = np.asarray(levels, dtype=float)
    if scores.shape != drifts.shape or scores.ndim != 1 or scores.size == 0:
        raise ValueError(f"scores/drifts: expected two 1-D arrays of the same non-zero length, got "
                         f"{scores.shape} and {drifts.shape}")
    ok = np.isfinite(scores) & np.isfinite(drifts)
    scores, drifts = scores[ok], drifts[ok]
    sign = 1.0 if lower_is_better else -1.0
    order = np.argsort(-scores, kind="stable")          # highest score first
    best = np.minimum.accumulate(sign * drifts[order])  # best drift among points with score ≥ this one's
    sorted_scores = scores[order]
    # For each level, the last index (in descending-score order) whose score is still ≥ level.
    idx = np.searchsorted(-sorted_scores, -levels, side="right") - 1
    out = np.full(levels.shape, np.nan)
    hit = idx >= 0
    out[hit] = sign * best[idx[hit]]
    return out


@dataclass
class Frontier:
    """A method's frontier over seeds on a grid of score levels."""

    levels: np.ndarray
    """Score levels (x axis)."""
    mean: np.ndarray
    """Mean over seeds of each seed's frontier at that level."""
    se: np.ndarray
    """Standard error over seeds (std with ddof=1 / sqrt(n)); 0 for a single seed."""
    n_seeds: int
    """How many seeds were aggregated."""

    def to_dict(self) -> dict:
        return {"levels": self.levels.tolist(), "mean": self.mean.tolist(), "se": self.se.tolist(),
                "n_seeds": self.n_seeds}


def mean_and_se(values: np.ndarray, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard error of the mean along ``axis`` (SE 0 for a single sample)."""
    values = np.asarray(values, dtype=float)
    n = values.shape[axis]
    mean = values.mean(axis=axis)
    if n < 2:
        return mean, np.zeros_like(mean)
    return mean, values.std(axis=axis, ddof=1) / np.sqrt(n)


def aggregate_frontier(runs: list[tuple], n_levels: int = 50, lower_is_better: bool = True,
                       levels=None) -> Frontier:
    """Mean ± SE over seeds of the frontiers of ``runs`` (a list of (scores, drifts)), on ``levels`` or on
    ``n_levels`` evenly spaced levels between the highest of the seeds' lowest scores and the lowest of their
    highest scores (the range every seed reaches, so no level averages over a subset of seeds)."""
    if not runs:
        raise ValueError("runs: expected at least one (scores, drifts) pair")
    if levels is None:
        lo = max(float(np.nanmin(s)) for s, _ in runs)
        hi = min(float(np.nanmax(s)) for s, _ in runs)
        if hi < lo:
            lo, hi = hi, lo  # seeds share no range: fall back to the span between them, with NaNs where unmet
        levels = np.linspace(lo, hi, n_levels)
    levels = np.asarray(levels, dtype=float)
    curves = np.stack([frontier_at(s, d, levels, lower_is_better) for s, d in runs])
    mean, se = mean_and_se(curves)
    return Frontier(levels=levels, mean=mean, se=se, n_seeds=len(runs))


def dominance(a: Frontier, b: Frontier, lower_is_better: bool = True, n_levels: int = 200) -> dict:
    """Compare two methods' mean frontiers over the score range both reach.

    Returns the shared range, the fraction of it where each has the better drift, and the area between the
    frontiers (∫ (drift_b − drift_a) d score for lower-is-better drift, so positive means A drifts less).
    """
    fa, fb = np.isfinite(a.mean), np.isfinite(b.mean)
    if not fa.any() or not fb.any():
        return {"range": None, "a_better": 0.0, "b_better": 0.0, "area": 0.0}
    # Interpolate each frontier through its finite levels only (a NaN level is one that not every seed reached).
    la, ma, lb, mb = a.levels[fa], a.mean[fa], b.levels[fb], b.mean[fb]
    lo, hi = max(la.min(), lb.min()), min(la.max(), lb.max())
    if not hi > lo:
        return {"range": None, "a_better": 0.0, "b_better": 0.0, "area": 0.0}
    grid = np.linspace(lo, hi, n_levels)
    da = np.interp(grid, la, ma)
    db = np.interp(grid, lb, mb)
    diff = (db - da) if lower_is_better else (da - db)  # > 0 where A is better
    return {
        "range": [float(lo), float(hi)],
        "a_better": float(np.mean(diff > 0)),
        "b_better": float(np.mean(diff < 0)),
        "area": float(np.trapezoid(diff, grid)),
    }
