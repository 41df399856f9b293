"""Reward over-optimisation, as Gao et al. (2022, arXiv 2210.10760) measure it: the gold and the proxy reward's gain
over the initial policy against d = √KL(π ‖ π_init), and the gold's fit for RL, R(d) = d(α − β log d) (their §3.1;
R(0) = 0, a peak at d* = exp(α/β − 1) of height β·d*).

A run is read twice with :func:`~elastic_reset.evaluation.runs.load_run` (score ``gold_log_odds`` and ``reward``,
drift ``kl_init``); gains are measured from the run's own step-0 evaluation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from elastic_reset.errors import ReportError
from elastic_reset.evaluation.runs import Run


@dataclass
class GaoFit:
    alpha: float
    beta: float
    r2: float
    """Share of the gains' variance (about zero, as the curve passes through the origin) the fit explains."""
    points: int
    d_max: float
    """The largest d fitted."""

    def __call__(self, d) -> np.ndarray:
        d = np.asarray(d, dtype=float)
        return d * (self.alpha - self.beta * np.log(np.where(d > 0, d, 1.0)))

    @property
    def peak_d(self) -> float | None:
        """Where the fitted gold peaks; None when it does not turn down within 10× the largest d fitted (β ≤ 0, or a
        peak so far out that the data say nothing of it)."""
        if self.beta <= 0 or self.alpha / self.beta - 1 > math.log(10 * self.d_max):
            return None
        return math.exp(self.alpha / self.beta - 1)

    @property
    def peak_gain(self) -> float | None:
        return self.beta * self.peak_d if self.peak_d is not None else None


def gao_fit(d, gain) -> GaoFit:
    """Least squares of ``gain ≈ α·d − β·d·log d`` over the points with d > 0 (linear in α and β)."""
    d, gain = np.asarray(d, dtype=float), np.asarray(gain, dtype=float)
    keep = (d > 0) & np.isfinite(d) & np.isfinite(gain)
    if keep.sum() < 2:
        raise ReportError(f"gao_fit: {int(keep.sum())} point(s) with d > 0; at least 2 are needed")
    d, gain = d[keep], gain[keep]
    features = np.stack([d, -d * np.log(d)], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(features, gain, rcond=None)
    residual = gain - features @ np.array([alpha, beta])
    total = float(np.sum(gain ** 2))
    return GaoFit(float(alpha), float(beta), 1.0 - float(np.sum(residual ** 2)) / total if total > 0 else 0.0,
                  int(keep.sum()), float(d.max()))


def gains(run: Run) -> tuple[np.ndarray, np.ndarray]:
    """(d, gain) of a run read with drift ``kl_init``: d = √KL (negative KL estimates count as 0) and the score's
    gain over its step-0 evaluation."""
    if run.drift != "kl_init":
        raise ReportError(f"{run.path}: read with drift {run.drift!r}; the gains need drift kl_init")
    if run.steps[0] != 0:
        raise ReportError(f"{run.path}: no step-0 evaluation to measure the gain from")
    return np.sqrt(np.clip(run.drifts, 0.0, None)), run.rewards - run.rewards[0]


def gold_vs_proxy(gold: dict[str, list[Run]], proxy: dict[str, list[Run]]) -> dict[str, dict]:
    """Per method, every evaluation of every seed pooled: ``d``, ``gold`` and ``proxy`` gains, and the gold's
    :class:`GaoFit`. ``gold`` and ``proxy`` are the same runs grouped by method, read with each score."""
    if set(gold) != set(proxy):
        raise ReportError(f"gold_vs_proxy: methods differ: {sorted(gold)} vs {sorted(proxy)}")
    out = {}
    for method in gold:
        d, g = map(np.concatenate, zip(*(gains(r) for r in gold[method])))
        d_proxy, p = map(np.concatenate, zip(*(gains(r) for r in proxy[method])))
        if not np.allclose(d, d_proxy):
            raise ReportError(f"gold_vs_proxy: {method}: the gold and proxy readings are not the same evaluations")
        out[method] = {"d": d, "gold": g, "proxy": p, "fit": gao_fit(d, g)}
    return out
