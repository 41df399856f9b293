"""The anchor family on the demo task: table, frontier figure and verdict, by rules fixed before
the grid ran.

    .venv/bin/python experiments/anchor_demo/report.py runs/anchor_demo experiments/anchor_demo/results

Reads ``GRID/<label>/seed<i>/`` (``experiments/anchor_demo/grid.sh``) and writes into RESULTS ``summary.json``
(per label: final held-out reward, perplexity and KL to the initial model, mean ± SE over seeds, the number of
pulls; every pairwise dominance), ``pareto.png`` (each family's representative, below), ``pareto_all.png``
(every label) and ``verdict.md``.

Score: the held-out VADER reward (10 validation prompts × 4 samples); drift: perplexity of the initial policy's
24 samples (the demo's drift). ``none+sweep`` is ``none`` with its swept points (θ0 + λ(θ − θ0), λ 0.25, 0.5, 0.75,
1.25) added to its evaluations: the frontier that model averaging and ExPO give without more RL.

Rules (written before the grid):
(0) Learning: ``none``'s mean held-out reward must rise by at least 0.15 from step 0 to its last evaluation; if
    not, nothing is compared.
(1) A family (``kl``, ``er``, ``erkl``, ``refreset``, ``refsync``, ``ema``) is represented by whichever of its two
    settings has the larger area between its mean frontier and ``none``'s (positive: less drift at equal reward);
    the selection uses the same seeds it reports on, and both settings are in the table.
(2) A *dominates* B when A's mean frontier has the lower perplexity on at least 2/3 of the reward range both reach,
    and that range is at least 0.05 wide; otherwise neither dominates.
(3) Elastic Reset (``er``) has the best trade-off here when it dominates every other representative and
    ``none+sweep``: the claim *holds*; *in part* when it dominates at least one and none dominates it; *does not
    hold* when any dominates it. Added after the grid ran, a wording that changes no outcome: when no shared range
    is 0.05 wide, the claim *is untestable at this budget*; when the frontiers only cross, it does not hold.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

from elastic_reset.evaluation.figures import plot_pareto
from elastic_reset.evaluation.pareto import mean_and_se
from elastic_reset.evaluation.runs import find_run_dirs, group_runs, load_run
from elastic_reset.evaluation.summary import dominance_summary, pareto_claim, summarize, to_jsonable
from elastic_reset.io import read_metrics

FAMILIES = {"kl": ("kl_b01", "kl_b03"), "er": ("er_d78", "er_d90"), "erkl": ("erkl_4", "erkl_8"),
            "refreset": ("refreset_4", "refreset_8"), "refsync": ("refsync_3", "refsync_8"),
            "ema": ("ema_80", "ema_95")}
LEARNED = 0.15
DOMINATES = 2 / 3
MIN_RANGE = 0.05


def with_sweep(run):
    """The run with its swept points (toward the initial model) added to its evaluations."""
    points = sorted((p for p in run.sweep if p[1] == "init"), key=lambda p: p[0])
    if not points:
        return run
    return dataclasses.replace(run, steps=np.concatenate([run.steps, [run.steps[-1]] * len(points)]),
                               rewards=np.concatenate([run.rewards, [p[2] for p in points]]),
                               drifts=np.concatenate([run.drifts, [p[3] for p in points]]))


def final(run_dir: Path) -> dict[str, float]:
    records = read_metrics(run_dir / "metrics.jsonl")
    last = [r for r in records if "eval/reward" in r][-1]
    pulls = sum(1 for r in records if "reset" in r)  # a reset or an anchor's pull, one record each
    return {"reward": last["eval/reward"], "perplexity": last["eval/perplexity"], "kl": last["eval/kl_init"],
            "pulls": pulls}


def main(grid: str, results: str) -> None:
    out = Path(results)
    out.mkdir(parents=True, exist_ok=True)
    groups = group_runs([load_run(p, drift="perplexity") for p in find_run_dirs(grid)])
    labels = sorted(groups)
    table = {}
    for label in labels:
        finals = [final(r.path) for r in groups[label]]
        table[label] = {k: dict(zip(("mean", "se"), map(float, mean_and_se(np.array([f[k] for f in finals])))))
                        for k in finals[0]}
        table[label]["seeds"] = len(finals)
    none = groups["none"]
    gain = float(np.mean([r.rewards[-1] - r.rewards[0] for r in none]))
    lines = [f"(0) learning: `none` held-out reward {np.mean([r.rewards[0] for r in none]):.3f} -> "
             f"{np.mean([r.rewards[-1] for r in none]):.3f} (gain {gain:+.3f}; needed {LEARNED})"]
    summary = {"table": table, "learning_gain": gain}
    if gain >= LEARNED:
        reps = {"none+sweep": [with_sweep(r) for r in none]}
        for family, (a, b) in FAMILIES.items():
            if a not in groups or b not in groups:
                continue
            area = {x: next(row["area"] for row in dominance_summary({x: groups[x], "none": none})) for x in (a, b)}
            pick = a if area[a] >= area[b] else b
            reps[f"{family}:{pick}"] = groups[pick]
            lines.append(f"(1) {family}: area vs none {a} {area[a]:+.3g}, {b} {area[b]:+.3g} -> {pick}")
        rows = dominance_summary(reps)
        wins, separable = {}, set()
        for row in rows:
            ok = row["range"] is not None and row["range"][1] - row["range"][0] >= MIN_RANGE
            if ok:
                separable.add((row["a"], row["b"]))
            winner = (row["a"] if ok and row["a_better"] >= DOMINATES else
                      row["b"] if ok and row["b_better"] >= DOMINATES else None)
            wins[(row["a"], row["b"])] = winner
            lines.append(f"(2) {row['text']} -> {winner or 'neither'} dominates")
        er = next((k for k in reps if k.startswith("er:")), None)
        if er is not None:
            others = [k for k in reps if k != er]
            beats = [o for o in others if wins.get((er, o), wins.get((o, er))) == er]
            beaten = [o for o in others if wins.get((er, o), wins.get((o, er))) == o]
            outcomes = {o: "dominates" if o in beats else "dominated" if o in beaten else
                        "trade-off" if (er, o) in separable or (o, er) in separable else "no comparison"
                        for o in others}
            verdict = pareto_claim(outcomes, tuple(others))
            lines.append(f"(3) Elastic Reset ({er}) dominates {beats or 'none'}; dominated by {beaten or 'none'}: "
                         f"the claim {verdict}")
            summary["verdict"] = verdict
        summary["dominance"] = rows
        plot_pareto(reps, out / "pareto.png")
    plot_pareto(groups, out / "pareto_all.png")
    summary["summary"] = summarize(groups)
    (out / "summary.json").write_text(json.dumps(to_jsonable(summary), indent=1) + "\n")
    (out / "verdict.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"{'label':12} {'seeds':>5} {'reward':>13} {'perplexity':>15} {'KL to init':>13} {'pulls':>6}")
    for label, row in table.items():
        print(f"{label:12} {row['seeds']:>5} {row['reward']['mean']:.3f} ± {row['reward']['se']:.3f} "
              f"{row['perplexity']['mean']:7.1f} ± {row['perplexity']['se']:5.1f} "
              f"{row['kl']['mean']:6.2f} ± {row['kl']['se']:4.2f} {row['pulls']['mean']:6.1f}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
