"""How well P(y_c ≻ y_r) = σ(Δ) is calibrated: accuracy, expected calibration error and the reliability diagram
(Peng et al. 2023 report ECE in Table 1 and the accuracy against the score difference in Fig. 2; they do not give
the number of bins: 10 equal-width bins, the common choice, as the issue asks)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Calibration:
    accuracy: float
    """Share of pairs with Δ = r_c − r_r > 0 (a tie counts as half)."""
    ece: float
    """Expected calibration error: Σ_b (n_b / n) |accuracy_b − confidence_b| over equal-width bins."""
    log_loss: float
    """Mean −log σ(Δ): the Bradley–Terry loss on these pairs, a proper scoring rule (ln 2 = 0.693 for Δ = 0)."""
    confidence: float
    """Mean max(p, 1 − p): how far from a coin toss the model claims to be. A model that always says p ≈ 0.5 has a
    small ECE whatever it knows; this and the log loss tell that apart from a sharp, calibrated one."""
    bin_confidence: np.ndarray
    """Mean predicted probability per non-empty bin."""
    bin_accuracy: np.ndarray
    """Observed frequency per non-empty bin."""
    bin_count: np.ndarray
    """Predictions per non-empty bin."""


def calibration(margins, bins: int = 10) -> Calibration:
    """Calibration of p = σ(Δ) for the pairs' reward differences Δ = r(x, y_c) − r(x, y_r).

    Each pair is counted in both orders, (p, 1) and (1 − p, 0): the probability is then a binary classifier's
    over a balanced set, and a model that says p = 0.8 is calibrated when it is right 80 % of the time whichever
    response comes first. ECE is over ``bins`` equal-width bins of [0, 1]."""
    margins = np.asarray(margins, dtype=np.float64).ravel()
    if margins.size == 0 or not np.all(np.isfinite(margins)):
        raise ValueError("margins: expected a non-empty array of finite reward differences")
    p = 1.0 / (1.0 + np.exp(-margins))
    probs = np.concatenate([p, 1.0 - p])
    labels = np.concatenate([np.ones_like(p), np.zeros_like(p)])
    index = np.minimum((probs * bins).astype(int), bins - 1)  # [k/bins, (k+1)/bins), 1.0 in the last bin
    count = np.bincount(index, minlength=bins)
    conf = np.bincount(index, weights=probs, minlength=bins)
    hits = np.bincount(index, weights=labels, minlength=bins)
    used = count > 0
    conf, hits, count = conf[used] / count[used], hits[used] / count[used], count[used]
    ece = float(np.sum(count * np.abs(hits - conf)) / probs.size)
    accuracy = float(np.mean((margins > 0) + 0.5 * (margins == 0)))
    log_loss = float(np.mean(np.logaddexp(0.0, -margins)))  # −log σ(Δ) without overflow
    confidence = float(np.mean(np.maximum(p, 1.0 - p)))
    return Calibration(accuracy, ece, log_loss, confidence, conf, hits, count)


def clustered_accuracy_se(margins, prompts) -> float | None:
    """Standard error of the accuracy when pairs that share a prompt are not independent (the cluster-robust
    "sandwich" estimate, with the G / (G − 1) correction for G prompts): √(G / (G − 1) · Σ_g s_g²) / n, where s_g
    sums (right_i − accuracy) over the pairs of prompt g. The Stack Exchange pairs are every pair of answers to a
    question, so a test split's accuracy can rest on a few questions with dozens of pairs each; the binomial
    √(p (1 − p) / n) then understates the error. With one pair per prompt (HH-RLHF) it is the usual standard error
    of a mean. None for fewer than two prompts."""
    margins = np.asarray(margins, dtype=np.float64).ravel()
    if len(prompts) != margins.size:
        raise ValueError(f"prompts: expected one per margin ({margins.size}), got {len(prompts)}")
    right = (margins > 0) + 0.5 * (margins == 0)
    _, group = np.unique(np.asarray(prompts, dtype=object).astype(str), return_inverse=True)
    clusters = int(group.max()) + 1 if group.size else 0
    if clusters < 2:
        return None
    sums = np.bincount(group, weights=right - right.mean())
    return float(np.sqrt(clusters / (clusters - 1) * np.sum(sums ** 2)) / margins.size)
