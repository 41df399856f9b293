"""Figures over runs (:class:`~elastic_reset.evaluation.runs.Run`): the Pareto frontier and the curves over
training, and :func:`report`, which draws both and returns the numbers of :mod:`elastic_reset.evaluation.summary`.

The figures follow the paper's convention: task score on x, drift on y, oriented so that *up is better*. Our drift
metrics (perplexity on held-out human text, KL to the initial model) are lower-is-better, so their y axis is
inverted; a method whose curve lies above another's then dominates it.

Figures are drawn with matplotlib's object API on an Agg canvas, never pyplot: importing this module does not
change the backend of a user's interactive session, and nothing needs a display. matplotlib is imported where a
figure is drawn, so reading runs and computing numbers never loads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from elastic_reset.errors import ReportError
from elastic_reset.evaluation.runs import DRIFTS, SCORES, Run, check_groups, group_score
from elastic_reset.evaluation.summary import dominance_summary, mean_curve, method_frontiers, summarize
from elastic_reset.io import atomic_write


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

    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    atomic_write(out_png, lambda f: fig.savefig(f, format="png", dpi=120, bbox_inches="tight"))
    return out_png


def drift_scale(values) -> str:
    """``log`` when positive drift values span a decade or more (perplexity from 30 to 900 would squash the
    fluent end of the axis into a line), else ``linear``."""
    values = np.asarray([v for v in np.ravel(values) if np.isfinite(v)], dtype=float)
    if values.size == 0 or values.min() <= 0:
        return "linear"
    return "log" if values.max() / values.min() >= 10 else "linear"


def plot_pareto(groups: dict[str, list[Run]], out_png: str | Path, drift: str | None = None) -> Path:
    """The Pareto frontier graph (paper §5): per method, the best drift reached at each validation reward level,
    mean ± SE over seeds. Better is right (reward) and up (drift; the axis is inverted for lower-is-better
    metrics). ``drift`` defaults to the metric the runs were loaded with, and must match it."""
    from matplotlib.figure import Figure

    loaded = check_groups(groups)
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
            if run.sweep:  # `elastic-reset sweep`'s points: hollow diamonds, never part of the frontier
                swept = not any(r.sweep for r in runs[:runs.index(run)])
                ax.scatter([p[2] for p in run.sweep], [p[3] for p in run.sweep], s=26, marker="D",
                           facecolors="none", edgecolors=color, linewidths=1,
                           label=f"{name}: sweep θa + λ(θ − θa)" if swept else None)
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
    ax.set_yscale(drift_scale([d for runs in groups.values() for run in runs for d in run.drifts]))
    if metric.lower_is_better:
        ax.invert_yaxis()
    orientation = "lower is better, axis inverted: up is better" if metric.lower_is_better else "up is better"
    score = group_score(groups)
    ax.set_xlabel(f"{SCORES[score]} (eval/{score}), right is better")
    ax.set_ylabel(f"{metric.label} (eval/{metric.key})\n{orientation}")
    ax.set_title("Task score vs drift Pareto frontier (mean ± SE over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, out_png)


def plot_curves(groups: dict[str, list[Run]], out_png: str | Path) -> Path:
    """Validation reward and drift over training iterations, mean ± SE over seeds per method, with each method's
    reset steps as dotted vertical lines in its colour."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    metric = DRIFTS[check_groups(groups)]
    colors = _colors(groups)
    fig = Figure(figsize=(11, 4.6), layout="constrained")
    ax_reward, ax_drift = fig.subplots(1, 2)
    for name, runs in groups.items():
        color = colors[name]
        for ax, values in ((ax_reward, "rewards"), (ax_drift, "drifts")):
            steps, mean, se = mean_curve(runs, values)
            if steps.size == 0:
                continue
            ax.plot(steps, mean, color=color, marker="." if steps.size < 30 else None,
                    label=_legend_label(name, runs))
            ax.fill_between(steps, mean - se, mean + se, color=color, alpha=0.2, linewidth=0)
            # The reset schedule is the same for every seed of a method; the union covers a seed that ran longer.
            for step in sorted({s for run in runs for s in run.reset_steps}):
                ax.axvline(step, color=color, linestyle=":", linewidth=1, alpha=0.8)
    score = group_score(groups)
    ax_reward.set_title(f"{SCORES[score]} (eval/{score})\nhigher is better", fontsize=10)
    ax_reward.set_ylabel(score)
    ax_drift.set_title(f"{metric.label} (eval/{metric.key})\n"
                       f"{'lower' if metric.lower_is_better else 'higher'} is better", fontsize=10)
    ax_drift.set_ylabel(metric.key)
    ax_drift.set_yscale(drift_scale([d for runs in groups.values() for run in runs for d in run.drifts]))
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
    if Path(out_png).suffix.lower() != ".png":  # never a run's metrics.jsonl or config.yaml by a slip
        raise ReportError(f"--out {out_png}: expected a .png path for the figure")
    plot_pareto(groups, out_png)
    plot_curves(groups, curves_path(out_png))
    return summarize(groups), dominance_summary(groups)


def plot_reliability(models: dict[str, dict], out_png: str | Path, split: str = "test") -> Path:
    """Reliability diagrams of reward models (Peng et al. Fig. 2): per model, observed frequency against predicted
    P(y_c ≻ y_r) per bin, with accuracy and ECE in the legend, and below it the share of predictions in each bin
    (a model that puts nearly everything near 0.5 has a small ECE whatever it knows: the lower panel shows it).
    ``models`` maps a label to the metrics a ``reward-model train`` run wrote (``reward_model.json``'s
    ``metrics``); several seeds of one label are averaged bin by bin, weighted by their counts."""
    from matplotlib.figure import Figure

    if not models:
        raise ReportError("reliability: no reward models to plot")
    fig = Figure(figsize=(5.2, 6.4))
    ax, shares = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    ax.plot([0, 1], [0, 1], color="0.6", linestyle="--", linewidth=1, label="perfect calibration")
    width = 0.1 / (len(models) + 1)
    for i, (label, runs) in enumerate(models.items()):
        runs = runs if isinstance(runs, list) else [runs]
        confidence, accuracy, count = (np.concatenate([r[split]["bins"][k] for r in runs])
                                       for k in ("confidence", "accuracy", "count"))
        edges = np.minimum((confidence * 10).astype(int), 9)
        weights = np.bincount(edges, weights=count, minlength=10)
        used = weights > 0
        conf = np.bincount(edges, weights=confidence * count, minlength=10)[used] / weights[used]
        acc = np.bincount(edges, weights=accuracy * count, minlength=10)[used] / weights[used]
        ece = np.mean([r[split]["ece"] for r in runs])
        hits = np.mean([r[split]["accuracy"] for r in runs])
        (line,) = ax.plot(conf, acc, marker="o", label=f"{label}: acc {hits:.3f}, ECE {ece:.3f} (n={len(runs)})")
        shares.bar(np.arange(10) / 10 + (i + 1) * width, weights / weights.sum(), width=width, align="center",
                   color=line.get_color())
    ax.set_ylabel("observed frequency")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_title(f"Reward model calibration ({split}, 10 bins, both orders of each pair)")
    ax.legend(fontsize=7, loc="upper left")
    shares.set_xlabel("predicted P(chosen ≻ rejected) = σ(Δ)")
    shares.set_ylabel("share of predictions")
    return _save(fig, out_png)


def plot_gold_vs_proxy(curves: dict[str, dict], out_png: str | Path) -> Path:
    """Gao et al.'s figure, one panel per method: the gold's and the proxy's gain over the initial policy against
    d = √KL, every evaluation of every seed, and the gold's fit R(d) = d(α − β log d)
    (:func:`~elastic_reset.evaluation.overoptimisation.gold_vs_proxy` gives ``curves``)."""
    from matplotlib.figure import Figure

    if not curves:
        raise ReportError("plot_gold_vs_proxy: no methods to draw")
    fig = Figure(figsize=(3.6 * len(curves), 3.6), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(curves), sharey=True))
    for ax, (name, c) in zip(axes, curves.items()):
        fit = c["fit"]
        ax.scatter(c["d"], c["proxy"], s=10, color="tab:orange", alpha=0.6, linewidths=0, label="proxy")
        ax.scatter(c["d"], c["gold"], s=10, color="tab:blue", alpha=0.6, linewidths=0, label="gold")
        grid = np.linspace(0, max(float(np.max(c["d"])), 1e-3), 100)
        ax.plot(grid, fit(grid), color="tab:blue", label=f"gold fit α={fit.alpha:.2f} β={fit.beta:.2f}")
        ax.axhline(0, color="grey", linewidth=0.8)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("d = √KL(π ‖ π_init)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small")
    axes[0].set_ylabel("gain over the initial policy\n(gold: log-odds; proxy: its own score)")
    return _save(fig, out_png)
