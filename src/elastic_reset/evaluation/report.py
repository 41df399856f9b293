"""Reports over finished (or still running) runs: Pareto frontier figures, curves, dominance, final tables.

A *run* is a directory written by :class:`elastic_reset.rl.trainer.RLTrainer`: ``config.yaml`` and
``metrics.jsonl``. Only its evaluation records (``eval/reward`` with the drift metrics, logged every ``eval.every``
iterations on held-out prompts and text) enter a frontier: training rewards are noisy, on-policy, and KL-shaped.
Runs are grouped by method; each group's seeds give a mean ± standard error (Elastic Reset paper §5 and Fig. 3c/4).

The figures follow the paper's convention: task score on x, drift on y, oriented so that *up is better*. Our drift
metrics (perplexity on held-out human text, KL to the initial model) are lower-is-better, so their y axis is
inverted; a method whose curve lies above another's then dominates it.

Figures are drawn with matplotlib's object API on an Agg canvas, never pyplot: importing this module does not
change the backend of a user's interactive session, and nothing needs a display.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from elastic_reset.evaluation.pareto import Frontier, aggregate_frontier, dominance, mean_and_se


class ReportError(ValueError):
    """A run directory cannot be read into a report. The message names the offending file."""


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
}

# Which weights a run's evaluation describes: the policy (``eval/*``) or its EMA (``eval_ema/*``).
WEIGHTS = ("auto", "policy", "ema")
LABEL_FILE = "label"
"""A run directory's optional group name (``compare`` writes its cell label there); default: ``method.name``."""

# Enough levels that the step-shaped frontier reads as one; fine for any number of evaluations.
N_LEVELS = 100


def drift_metric(drift: str) -> DriftMetric:
    if drift not in DRIFTS:
        raise ReportError(f"drift: expected one of {', '.join(DRIFTS)}, got {drift!r}")
    return DRIFTS[drift]


# --------------------------------------------------------------------------------------------------- runs
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
    drifts: np.ndarray
    reset_steps: list[int] = field(default_factory=list)
    """Iterations at which a reset happened (training records carrying ``reset``)."""
    total_steps: int | None = None
    """``steps`` of its config: the run is finished when its last evaluation is there."""


def _read_records(path: Path) -> list[dict[str, Any]]:
    """metrics.jsonl, tolerating a torn LAST line: a run still being written (a grid in progress) can be
    plotted. A bad line anywhere else means the file is damaged, and the error says where."""
    lines = path.read_text(encoding="utf-8").splitlines()
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            if i == len(lines) - 1:
                break
            raise ReportError(f"{path}: line {i + 1} is not valid JSON ({err})") from None
    return records


def load_run(run_dir: str | Path, *, method: str | None = None, drift: str = "perplexity",
             weights: str = "auto") -> Run:
    """Read one run directory.

    Args:
        method: the group name; default: the run's ``label`` file (written by ``compare``), else ``method.name``
            from its ``config.yaml``.
        drift: ``perplexity`` (``eval/perplexity``) or ``kl_init`` (``eval/kl_init``).
        weights: ``policy`` reads ``eval/*``, ``ema`` reads ``eval_ema/*``; ``auto`` reads the EMA's evaluation
            for method ``ema_only`` (that ablation's point is the EMA; its policy is plain KL-penalised RL) and
            the policy's for every other method.
    """
    metric = drift_metric(drift)
    if weights not in WEIGHTS:
        raise ReportError(f"weights: expected one of {', '.join(WEIGHTS)}, got {weights!r}")
    run_dir = Path(run_dir)
    metrics_path = run_dir / "metrics.jsonl"
    if not metrics_path.is_file():
        raise ReportError(f"{metrics_path}: not found ({run_dir} is not a training run directory)")
    config_path = run_dir / "config.yaml"
    config: dict[str, Any] = {}
    if config_path.is_file():
        config = yaml.safe_load(config_path.read_text()) or {}
    elif method is None:
        raise ReportError(f"{config_path}: not found, so the run's method is unknown (name it explicitly)")
    if method is None and (run_dir / LABEL_FILE).is_file():
        method = (run_dir / LABEL_FILE).read_text().strip() or None
    if method is None:
        method = (config.get("method") or {}).get("name")
        if not method:
            raise ReportError(f"{config_path}: has no method.name")

    records = _read_records(metrics_path)
    has_ema = any("eval_ema/reward" in r for r in records)
    if weights == "ema" and not has_ema:
        raise ReportError(f"{metrics_path}: has no eval_ema/* records (the method keeps no EMA, or eval.ema "
                          "was off)")
    use_ema = weights == "ema" or (weights == "auto" and has_ema
                                   and (config.get("method") or {}).get("name") == "ema_only")
    source = "eval_ema" if use_ema else "eval"
    reward_key, drift_key = f"{source}/reward", f"{source}/{metric.key}"

    # Keyed by step: should a line ever be repeated (a resume that could not truncate), the later one wins.
    evals: dict[int, tuple[float, float]] = {}
    resets: set[int] = set()
    for r in records:
        if reward_key in r:
            if drift_key not in r:
                raise ReportError(f"{metrics_path}: the evaluation record of step {r.get('step')} has "
                                  f"{reward_key} but no {drift_key}")
            evals[int(r["step"])] = (float(r[reward_key]), float(r[drift_key]))
        elif isinstance(r.get("reset"), dict):
            resets.add(int(r["step"]))
    if not evals:
        raise ReportError(f"{metrics_path}: has no evaluation records ({reward_key}); was eval.every 0, or was "
                          "the run stopped before its first evaluation?")
    steps = sorted(evals)
    seed = config.get("seed")
    return Run(
        path=run_dir, method=method, seed=int(seed) if seed is not None else None, drift=drift, source=source,
        steps=np.array(steps, dtype=int),
        rewards=np.array([evals[s][0] for s in steps]),
        drifts=np.array([evals[s][1] for s in steps]),
        reset_steps=sorted(resets),
        total_steps=int(config["steps"]) if "steps" in config else None,
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


def _check_groups(groups: dict[str, list[Run]]) -> str:
    """All runs must carry the same drift metric (mixing perplexity and KL on one axis is meaningless)."""
    if not groups:
        raise ReportError("no runs to report on")
    empty = [name for name, runs in groups.items() if not runs]
    if empty:
        raise ReportError(f"method {empty[0]!r} has no runs")
    drifts = {run.drift for runs in groups.values() for run in runs}
    if len(drifts) != 1:
        raise ReportError(f"runs were loaded with different drift metrics: {sorted(drifts)}")
    return drifts.pop()


# ------------------------------------------------------------------------------------------------ numbers
def method_frontiers(groups: dict[str, list[Run]], n_levels: int = N_LEVELS) -> dict[str, Frontier]:
    """Each method's frontier: mean ± SE over its seeds, on the reward range every seed reaches."""
    metric = DRIFTS[_check_groups(groups)]
    out = {}
    for name, runs in groups.items():
        f = aggregate_frontier([(r.rewards, r.drifts) for r in runs], n_levels=n_levels,
                               lower_is_better=metric.lower_is_better)
        if f.levels.size and np.ptp(f.levels) == 0:
            # Every seed reached one single reward level (e.g. a run too short to learn): one point, not n copies.
            f = Frontier(levels=f.levels[:1], mean=f.mean[:1], se=f.se[:1], n_seeds=f.n_seeds)
        out[name] = f
    return out


def dominance_summary(groups: dict[str, list[Run]]) -> list[dict[str, Any]]:
    """For each pair of methods, how their mean frontiers compare over the reward range both reach.

    Each row: ``a``, ``b``, ``range`` (the shared reward range, None if they share none), ``a_better`` /
    ``b_better`` (fraction of that range where each has the better drift), ``area`` (∫ of the drift difference
    over the range, positive where A is better; in drift units × reward units), and ``text``, one printable line.
    """
    drift = _check_groups(groups)
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
            row["text"] = (f"{a} vs {b}: over reward [{lo:.4g}, {hi:.4g}], {a} has the better {metric.label} on "
                           f"{result['a_better']:.0%} of the range, {b} on {result['b_better']:.0%}; "
                           f"area between frontiers {result['area']:+.4g} (positive: {a} better)")
        rows.append(row)
    return rows


def format_dominance(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "Dominance: only one method, nothing to compare."
    return "Dominance (mean frontiers over seeds):\n" + "\n".join(f"  {row['text']}" for row in rows)


def summarize(groups: dict[str, list[Run]]) -> dict[str, Any]:
    """Per method: the final evaluation (each run's last evaluation record) as mean and standard error over
    seeds, and the frontier. JSON-ready (non-finite numbers become null)."""
    drift = _check_groups(groups)
    metric = DRIFTS[drift]
    frontiers = method_frontiers(groups)
    methods = {}
    for name, runs in groups.items():
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
    return to_jsonable({"drift": drift, "drift_label": metric.label, "lower_is_better": metric.lower_is_better,
                      "methods": methods})


def format_table(summary: dict[str, Any]) -> str:
    """The final table of :func:`summarize`: one line per method."""
    def pm(entry: dict[str, Any]) -> str:
        mean, se = entry["mean"], entry["se"]
        if mean is None:
            return "n/a"
        return f"{mean:.4g} ± {se:.2g}" if se is not None else f"{mean:.4g}"

    header = ["method", "seeds", "final step", "final reward", f"final {summary['drift']}"]
    rows = [[name, str(m["n_seeds"]), ",".join(str(s) for s in sorted(set(m["final_steps"]))),
             pm(m["final_reward"]), pm(m["final_drift"])] for name, m in summary["methods"].items()]
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


# ------------------------------------------------------------------------------------------------ figures
def _colors(groups: dict[str, list[Run]]) -> dict[str, Any]:
    """One colour per method, the same in every figure of a report."""
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return {name: cmap(i % 10) for i, name in enumerate(groups)}


def _legend_label(name: str, runs: list[Run]) -> str:
    n = len(runs)
    ema = " (EMA weights)" if any(r.source == "eval_ema" for r in runs) else ""
    return f"{name}{ema} (n={n} seed{'s' if n != 1 else ''})"


def _save(fig, out_png: str | Path) -> Path:
    # Written to a temporary name and renamed: a grid killed while plotting never leaves a torn PNG.
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from elastic_reset.rl.checkpoint import atomic_write_bytes

    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    atomic_write_bytes(out_png, lambda f: fig.savefig(f, format="png", dpi=120, bbox_inches="tight"))
    return out_png


def plot_pareto(groups: dict[str, list[Run]], out_png: str | Path, drift: str | None = None) -> Path:
    """The Pareto frontier graph (paper §5): per method, the best drift reached at each validation reward level,
    mean ± SE over seeds. Better is right (reward) and up (drift; the axis is inverted for lower-is-better
    metrics). ``drift`` defaults to the metric the runs were loaded with, and must match it."""
    from matplotlib.figure import Figure

    loaded = _check_groups(groups)
    if drift is not None and drift != loaded:
        raise ReportError(f"drift: the runs were loaded with {loaded!r}, not {drift!r} (load them with "
                          f"drift={drift!r})")
    metric = DRIFTS[loaded]
    frontiers = method_frontiers(groups)
    colors = _colors(groups)

    fig = Figure(figsize=(6.4, 4.8))
    ax = fig.add_subplot()
    for name, runs in groups.items():
        f, color = frontiers[name], colors[name]
        label = _legend_label(name, runs)
        # Each seed's own evaluation points, faintly: shows how much of the range the frontier summarises.
        for run in runs:
            ax.scatter(run.rewards, run.drifts, s=8, color=color, alpha=0.3, linewidths=0)
        ok = np.isfinite(f.mean)
        if not ok.any():
            continue
        if ok.sum() == 1:
            # A single shared reward level: a point with its error bar.
            ax.errorbar(f.levels[ok], f.mean[ok], yerr=f.se[ok], fmt="o", color=color, capsize=3, label=label)
            continue
        # Each seed's frontier is a step function of the level (constant on (level_i, level_i+1]); drawn as such.
        ax.step(f.levels, f.mean, where="pre", color=color, label=label)
        ax.fill_between(f.levels, f.mean - f.se, f.mean + f.se, step="pre", color=color, alpha=0.2, linewidth=0)
    if metric.lower_is_better:
        ax.invert_yaxis()
    orientation = "lower is better, axis inverted: up is better" if metric.lower_is_better else "up is better"
    ax.set_xlabel("validation reward (eval/reward), right is better")
    ax.set_ylabel(f"{metric.label} (eval/{metric.key})\n{orientation}")
    ax.set_title("Reward vs drift Pareto frontier (mean ± SE over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, out_png)


def _mean_curve(runs: list[Run], values: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean ± SE over seeds at the evaluation steps every seed has. Averaging over whichever seeds happen to
    have a step would make the curve jump where a seed ends (a run still in progress); this never does."""
    common = set(runs[0].steps.tolist())
    for run in runs[1:]:
        common &= set(run.steps.tolist())
    steps = np.array(sorted(common), dtype=int)
    if steps.size == 0:
        return steps, np.array([]), np.array([])
    stacked = np.stack([getattr(run, values)[np.searchsorted(run.steps, steps)] for run in runs])
    mean, se = mean_and_se(stacked)
    return steps, mean, se


def plot_curves(groups: dict[str, list[Run]], out_png: str | Path) -> Path:
    """Validation reward and drift over training iterations, mean ± SE over seeds per method, with each method's
    reset steps as dotted vertical lines in its colour."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    metric = DRIFTS[_check_groups(groups)]
    colors = _colors(groups)
    fig = Figure(figsize=(11, 4.6), layout="constrained")
    ax_reward, ax_drift = fig.subplots(1, 2)
    for name, runs in groups.items():
        color = colors[name]
        for ax, values in ((ax_reward, "rewards"), (ax_drift, "drifts")):
            steps, mean, se = _mean_curve(runs, values)
            if steps.size == 0:
                continue
            ax.plot(steps, mean, color=color, marker="." if steps.size < 30 else None,
                    label=_legend_label(name, runs))
            ax.fill_between(steps, mean - se, mean + se, color=color, alpha=0.2, linewidth=0)
            # The reset schedule is the same for every seed of a method; the union covers a seed that ran longer.
            for step in sorted({s for run in runs for s in run.reset_steps}):
                ax.axvline(step, color=color, linestyle=":", linewidth=1, alpha=0.8)
    ax_reward.set_title("validation reward (eval/reward)\nhigher is better", fontsize=10)
    ax_reward.set_ylabel("reward")
    ax_drift.set_title(f"{metric.label} (eval/{metric.key})\n"
                       f"{'lower' if metric.lower_is_better else 'higher'} is better", fontsize=10)
    ax_drift.set_ylabel(metric.key)
    for ax in (ax_reward, ax_drift):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("training iteration (dotted: resets)")
        ax.grid(alpha=0.3)
    ax_reward.legend(fontsize="small")
    fig.suptitle("Mean ± SE over seeds")
    return _save(fig, out_png)


def curves_path(out_png: str | Path) -> Path:
    """Where the curves figure goes beside a Pareto figure: ``<stem>_curves.png``."""
    out_png = Path(out_png)
    return out_png.with_name(f"{out_png.stem}_curves.png")


def report(groups: dict[str, list[Run]], out_png: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Both figures (``out_png`` and ``<stem>_curves.png``), the summary and the dominance rows."""
    plot_pareto(groups, out_png)
    plot_curves(groups, curves_path(out_png))
    return summarize(groups), dominance_summary(groups)
