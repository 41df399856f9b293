"""Numbers and text tables over runs (:class:`~elastic_reset.evaluation.runs.Run`): frontiers, dominance, final tables.

Each method's seeds give a mean ± standard error (Elastic Reset paper §5 and Fig. 3c/4): of the final evaluation,
of the Pareto frontier (the best drift reached at each validation reward level, :mod:`elastic_reset.evaluation.pareto`)
and of the curves over training. Everything here is plain numbers and text, JSON-ready; the figures that draw them
are in :mod:`elastic_reset.evaluation.figures`.
"""

from __future__ import annotations

import math
import warnings
from itertools import combinations
from typing import Any

import numpy as np

from elastic_reset.evaluation.pareto import Frontier, aggregate_frontier, dominance, mean_and_se
from elastic_reset.evaluation.runs import DRIFTS, SCORES, Run, check_groups, group_score

# Enough levels that the step-shaped frontier reads as one; fine for any number of evaluations.
N_LEVELS = 100


class NonFiniteResultWarning(UserWarning):
    """A run's final (or test) evaluation holds NaN or an infinity: its method's mean in the table reads n/a."""


def _warn_non_finite(run: Run, test: bool) -> None:
    """Say which run, step and metric make a table cell n/a (the table alone cannot)."""
    values = [(f"final evaluation (step {int(run.steps[-1])})", f"{run.source}/{run.score}", run.rewards[-1]),
              (f"final evaluation (step {int(run.steps[-1])})", f"{run.source}/{DRIFTS[run.drift].key}",
               run.drifts[-1])]
    if test and run.test is not None:
        values += [("test evaluation", f"test/{run.score}", run.test[0]),
                   ("test evaluation", f"test/{DRIFTS[run.drift].key}", run.test[1])]
    for where, key, value in values:
        if not math.isfinite(value):
            warnings.warn(f"{run.path}: the {where} has {key} = {value}; the table shows n/a for the mean of "
                          f"{run.method!r}", NonFiniteResultWarning, stacklevel=3)


def method_frontiers(groups: dict[str, list[Run]], n_levels: int = N_LEVELS) -> dict[str, Frontier]:
    """Each method's frontier: mean ± SE over its seeds, on the reward range every seed reaches."""
    metric = DRIFTS[check_groups(groups)]
    out = {}
    for name, runs in groups.items():
        f = aggregate_frontier([(r.rewards, r.drifts) for r in runs], n_levels=n_levels,
                               lower_is_better=metric.lower_is_better)
        if f.levels.size and np.ptp(f.levels) == 0:
            # Every seed reached one single reward level (e.g. a run too short to learn): one point, not n copies.
            f = Frontier(levels=f.levels[:1], mean=f.mean[:1], se=f.se[:1], n_seeds=f.n_seeds)
        out[name] = f
    return out


def mean_curve(runs: list[Run], values: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps, mean and SE over seeds of ``values`` (``"rewards"`` or ``"drifts"``) at the evaluation steps every
    seed has. Averaging over whichever seeds happen to have a step would make the curve jump where a seed ends (a
    run still in progress); this never does."""
    common = set(runs[0].steps.tolist())
    for run in runs[1:]:
        common &= set(run.steps.tolist())
    steps = np.array(sorted(common), dtype=int)
    if steps.size == 0:
        return steps, np.array([]), np.array([])
    stacked = np.stack([getattr(run, values)[np.searchsorted(run.steps, steps)] for run in runs])
    mean, se = mean_and_se(stacked)
    return steps, mean, se


def dominance_summary(groups: dict[str, list[Run]]) -> list[dict[str, Any]]:
    """For each pair of methods, how their mean frontiers compare over the reward range both reach.

    Each row: ``a``, ``b``, ``range`` (the shared reward range, None if they share none), ``a_better`` /
    ``b_better`` (fraction of that range where each has the better drift), ``area`` (∫ of the drift difference
    over the range, positive where A is better; in drift units × reward units), and ``text``, one printable line.
    """
    drift = check_groups(groups)
    metric = DRIFTS[drift]
    frontiers = method_frontiers(groups)
    rows = []
    for a, b in combinations(groups, 2):
        fa, fb = frontiers[a], frontiers[b]
        if not (np.isfinite(fa.mean).any() and np.isfinite(fb.mean).any()):
            result = {"range": None, "a_better": 0.0, "b_better": 0.0, "area": 0.0}
        else:
            result = dominance(fa, fb, lower_is_better=metric.lower_is_better)
        row = {"a": a, "b": b, **result}
        if result["range"] is None:
            row["text"] = (f"{a} vs {b}: no shared reward range (one method reaches a single reward level, or "
                           "their ranges do not overlap): no comparison")
        else:
            lo, hi = result["range"]
            tied = 1.0 - result["a_better"] - result["b_better"]  # where the two mean frontiers coincide
            row["text"] = (f"{a} vs {b}: over reward [{lo:.4g}, {hi:.4g}], {a} has the better {metric.label} on "
                           f"{result['a_better']:.0%} of the range, {b} on {result['b_better']:.0%}, equal on "
                           f"{tied:.0%}; area between frontiers {result['area']:+.4g} (positive: {a} better)")
        rows.append(row)
    return rows


def pareto_outcome(summary: dict[str, Any], a: str, b: str, share: float = 0.9, reach: float = 0.9
                   ) -> tuple[str, str]:
    """Whether A Pareto-dominates B in a grid's ``summary.json``: ``dominates`` when A's mean frontier has the better
    drift on at least ``share`` of the score range both cover *and* that range reaches at least ``reach`` of the way
    up B's own frontier range (a mean frontier spans only the levels every seed reached, so one stalled seed
    shortens it); ``dominated``, the same with A and B swapped; ``not separated`` when neither frontier is better
    anywhere on the shared range (e.g. both still at the start's point); otherwise ``trade-off``, or ``no
    comparison`` without a shared range. Returned with one line of the numbers (ranges, shares, final evaluations)."""
    methods = summary["methods"]
    score, drift = summary.get("score", "reward"), summary["drift"]
    better = "lower" if summary["lower_is_better"] else "higher"
    row = next((r for r in summary["dominance"] if {r["a"], r["b"]} == {a, b}), None)
    fa, fb = methods[a]["final_reward"], methods[b]["final_reward"]
    da, db = methods[a]["final_drift"], methods[b]["final_drift"]
    finals = (f"final {score} {fa['mean']:.3f} ± {fa['se']:.3f} vs {fb['mean']:.3f} ± {fb['se']:.3f}; final "
              f"{drift} {da['mean']:.1f} ± {da['se']:.1f} vs {db['mean']:.1f} ± {db['se']:.1f}")
    if row is None or row.get("range") is None:
        return "no comparison", f"no shared {score} range; {finals}"
    a_better, b_better = (row["a_better"], row["b_better"]) if row["a"] == a else (row["b_better"], row["a_better"])
    lo, hi = row["range"]

    def covered(m: str) -> float:  # how far up m's own frontier range the shared range reaches (its top matters)
        levels = methods[m]["frontier"]["levels"]
        return 1.0 if levels[-1] <= levels[0] else (hi - levels[0]) / (levels[-1] - levels[0])

    ranges = ", ".join(f"{m} [{methods[m]['frontier']['levels'][0]:.3f}, {methods[m]['frontier']['levels'][-1]:.3f}]"
                       for m in (a, b))
    text = (f"shared {score} range [{lo:.3f}, {hi:.3f}] (own ranges: {ranges}); {better} {drift} there: {a} on "
            f"{a_better:.0%}, {b} on {b_better:.0%}; {finals}")
    if a_better == 0 and b_better == 0:
        return "not separated", text
    if a_better >= share and covered(b) >= reach:
        return "dominates", text
    if b_better >= share and covered(a) >= reach:
        return "dominated", text
    return "trade-off", text


def paired_by_seed(x: dict[int, float], y: dict[int, float], seeds: int) -> dict[str, Any] | None:
    """X − Y paired by seed: ``mean``, ``se``, ``seeds``, ``beats`` (mean above 2 SE: X higher) and ``beaten`` (below
    −2 SE), or None unless both have the same ``seeds`` seeds or more. A mean beyond 2 SE is robust to one seed: a
    seed whose removal left a mean of the other sign would be at least n times the mean, and then the SE is at least
    the mean, so no leave-one-out check is needed."""
    common = sorted(set(x) & set(y))
    if len(common) < max(seeds, 2):
        return None
    d = np.array([x[s] - y[s] for s in common], dtype=float)
    mean, se = (float(v) for v in mean_and_se(d))
    return {"mean": mean, "se": se, "seeds": common, "beats": mean > 2 * se, "beaten": mean < -2 * se}


def pareto_claim(outcomes: dict[str, str], baselines: tuple[str, ...]) -> str:
    """A method's claim to dominate ``baselines``, from its :func:`pareto_outcome` against each (a baseline absent
    from ``outcomes`` counts as ``no comparison``): ``holds`` when it dominates every one; ``does not hold`` when one
    dominates it; ``holds in part`` when it dominates at least one; ``is untestable at this budget`` when no
    baseline is separated from it (no shared range, or frontiers equal on it); ``does not hold`` otherwise (only
    trade-offs)."""
    found = [outcomes.get(b, "no comparison") for b in baselines]
    if found and all(o == "dominates" for o in found):
        return "holds"
    if "dominated" in found:
        return "does not hold"
    if "dominates" in found:
        return "holds in part"
    if all(o in ("not separated", "no comparison") for o in found):
        return "is untestable at this budget"
    return "does not hold"


def format_dominance(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "Dominance: only one method, nothing to compare."
    return "Dominance (mean frontiers over seeds):\n" + "\n".join(f"  {row['text']}" for row in rows)


def summarize(groups: dict[str, list[Run]]) -> dict[str, Any]:
    """Per method: the final evaluation (each run's last evaluation record) as mean and standard error over
    seeds, and the frontier. JSON-ready (non-finite numbers become null)."""
    drift = check_groups(groups)
    metric = DRIFTS[drift]
    frontiers = method_frontiers(groups)
    methods = {}
    for name, runs in groups.items():
        for run in runs:
            _warn_non_finite(run, test=all(r.test is not None for r in runs))
        reward_mean, reward_se = mean_and_se(np.array([r.rewards[-1] for r in runs]))
        drift_mean, drift_se = mean_and_se(np.array([r.drifts[-1] for r in runs]))
        methods[name] = {
            "n_seeds": len(runs),
            "seeds": [r.seed for r in runs],
            "runs": [str(r.path) for r in runs],
            "source": sorted({r.source for r in runs}),
            # A run still in progress reports its latest evaluation; these steps show which.
            "final_steps": [int(r.steps[-1]) for r in runs],
            "final_reward": {"mean": float(reward_mean), "se": float(reward_se)},
            "final_drift": {"mean": float(drift_mean), "se": float(drift_se)},
            "frontier": frontiers[name].to_dict(),
        }
        if all(r.test is not None for r in runs):  # the task's test split, evaluated once after training
            for i, key in enumerate(("test_score", "test_drift")):
                mean, se = mean_and_se(np.array([r.test[i] for r in runs]))
                methods[name][key] = {"mean": float(mean), "se": float(se)}
    score = group_score(groups)
    return to_jsonable({"drift": drift, "drift_label": metric.label, "lower_is_better": metric.lower_is_better,
                        "score": score, "score_label": SCORES[score], "methods": methods})


def format_table(summary: dict[str, Any]) -> str:
    """The final table of :func:`summarize`: one line per method."""
    def pm(entry: dict[str, Any], seeds: int) -> str:
        mean, se = entry["mean"], entry["se"]
        if mean is None:
            return "n/a"
        if seeds < 2:  # one seed has no standard error: "± 0" would claim a certainty it lacks
            return f"{mean:.4g} ± n/a"
        return f"{mean:.4g} ± {se:.2g}" if se is not None else f"{mean:.4g}"

    score, drift = summary.get("score", "reward"), summary["drift"]
    header = ["method", "seeds", "final step", f"final {score}", f"final {drift}"]
    rows = [[name, str(m["n_seeds"]), ",".join(str(s) for s in sorted(set(m["final_steps"]))),
             pm(m["final_reward"], m["n_seeds"]), pm(m["final_drift"], m["n_seeds"])]
            for name, m in summary["methods"].items()]
    if all("test_score" in m for m in summary["methods"].values()):
        header += [f"test {score}", f"test {drift}"]
        for row, m in zip(rows, summary["methods"].values()):
            row += [pm(m["test_score"], m["n_seeds"]), pm(m["test_drift"], m["n_seeds"])]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    order = "lower is better" if summary["lower_is_better"] else "higher is better"
    return (f"Final evaluation (mean ± standard error over seeds; {summary['drift_label']}, {order}):\n"
            + "\n".join(lines))


def to_jsonable(value: Any) -> Any:
    """NaN/inf are not JSON: write them as null so any JSON reader accepts the file."""
    if isinstance(value, dict):
        return {k: to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
