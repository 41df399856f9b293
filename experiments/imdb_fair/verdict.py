"""Does Elastic Reset drift less than RLOO + a tuned fixed KL penalty on IMDB at 135M? The fair study's verdict.

    .venv/bin/python experiments/imdb_fair/verdict.py experiments/imdb_fair/results \
        [--first-grid experiments/imdb/results/135m]

Reads every cell ``RESULTS/runs/<arm>/seed<k>/metrics.jsonl`` (grid.sh) and writes ``summary.json``,
``verdict.md`` and ``levels.png`` into RESULTS. Arms still missing seeds are reported as pending.

Data. Every 5 iterations (0-50) each cell is evaluated on two disjoint sets of held-out test reviews:
set A (``eval/*``: 64 prompts, perplexity on 64 reviews) selects, set B (``eval_report/*``: 64 other prompts,
perplexity on 64 other reviews) reports; ``test/*`` (256 prompts) once on the final weights. Drift is perplexity.

Rules, fixed before the first cell:
1. Selection on A. For a reward level L in LEVELS, a cell's checkpoint at L is, among its evaluations with A-reward
   >= L, the one of least A-perplexity (the earliest on ties). A cell with none does not carry L; an arm carries L
   if every one of its seeds does.
2. Report on B: the selected evaluation's B-reward and B-perplexity. Nothing of B enters a selection.
3. X beats Y at L, both carrying L, paired by seed: the B-perplexity differences d_s = X_s - Y_s have a mean below
   -2 SE, every leave-one-seed-out mean of them is below 0 (robust to one seed), and X's B-reward is on average not
   lower than Y's by more than MARGIN. Y beats X likewise; anything else is a tie at L (the rule does not separate
   them at this budget). If only X carries L, X beats Y at L (Y never reaches it); if neither does, L is untested.
4. X beats Y overall if it beats Y at >= 2 of the 3 levels and Y beats X at none.
5. (a) The claim holds if Elastic Reset beats every fixed beta that carries 0.8; "does not hold" if one of those
   beats it; "holds in part" if it beats some and none beats it; "ties" if it beats none and none beats it
   (not separable at 3 seeds); "untestable at this budget" if no fixed beta carries 0.8.
   (b) The EMA matters if Elastic Reset beats reset_to_init overall, or if er_decay_0.90 and elastic_reset
   differ (one beats the other overall); "not separable at this budget" if those pairs only tie; "untestable at
   this budget" if fewer than 2 levels are tested for each.
   (c) Gradient regularisation, when its arm ``gr`` has run: (a)'s rule with gr in Elastic Reset's place, and the
   gr-vs-elastic_reset pair by rule 4. Its setting is chosen by its own budget, two candidates ``gr_<setting>`` on
   seed 0 only: the candidate of least A-perplexity at the highest level of LEVELS that every candidate carries
   (no level carried: the highest peak A-reward); seeds 1-2 then run at that setting (``--choose-gr``). The fixed
   beta had three settings on every seed; Elastic Reset runs the paper's one.
6. Beside the rule, without selection: the final weights' B-reward, B-perplexity and test reward, paired by seed
   (Elastic Reset minus each arm, mean +- SE, and on how many seeds the difference is negative).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from elastic_reset.io import atomic_write_text, read_metrics

LEVELS = (0.6, 0.7, 0.8)
MARGIN = 0.03
"""How much lower X's mean B-reward may be than Y's for a drift win of X to count (reward units, P(positive))."""
SEEDS = 3
KL_ARMS = ("rloo_kl_0.003", "rloo_kl_0.01", "rloo_kl_0.03")
ER, ER90, INIT, GR = "elastic_reset", "er_decay_0.90", "reset_to_init", "gr"
ARMS = (*KL_ARMS, ER, ER90, INIT, GR)
LABELS = {"rloo_kl_0.003": "RLOO + KL β 0.003 (fixed)", "rloo_kl_0.01": "RLOO + KL β 0.01 (fixed)",
          "rloo_kl_0.03": "RLOO + KL β 0.03 (fixed)", ER: "Elastic Reset (decay 0.995)",
          ER90: "Elastic Reset (decay 0.90)", INIT: "RESET to init", GR: "RLOO + gradient regularisation (no KL)"}


def evaluations(records: list[dict]) -> list[dict]:
    """Each evaluation of a cell (its metrics.jsonl records) on both sets: step, A-reward, A-perplexity, B-reward,
    B-perplexity."""
    out = []
    for r in records:
        if "eval/reward" in r and "eval_report/reward" in r:
            out.append({"step": r["step"], "a_reward": r["eval/reward"], "a_ppl": r["eval/perplexity"],
                        "b_reward": r["eval_report/reward"], "b_ppl": r["eval_report/perplexity"]})
    return out


def final_point(path: Path) -> dict:
    """The last evaluation and the test reward (the final weights), no selection."""
    records = read_metrics(path)
    last = evaluations(records)[-1]
    test = [r["test/reward"] for r in records if "test/reward" in r]
    return {**last, "test_reward": test[-1] if test else math.nan}


def read_cells(results: Path) -> dict[str, dict[int, Path]]:
    """``{arm: {seed: metrics.jsonl}}`` of the finished cells (those with a ``done`` marker)."""
    cells: dict[str, dict[int, Path]] = {}
    for done in sorted(results.glob("runs/*/seed*/done")):
        arm, seed = done.parent.parent.name, int(done.parent.name.removeprefix("seed"))
        cells.setdefault(arm, {})[seed] = done.parent / "metrics.jsonl"
    return cells


def select(evals: list[dict], level: float) -> dict | None:
    """Rule 1: the least-A-perplexity evaluation with A-reward >= level (earliest on ties), or None."""
    above = [e for e in evals if e["a_reward"] >= level]
    return min(above, key=lambda e: (e["a_ppl"], e["step"])) if above else None


def mean_se(xs: list[float]) -> tuple[float, float]:
    n = len(xs)
    mean = sum(xs) / n
    se = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1) / n) if n > 1 else math.inf
    return mean, se


def compare_at(x: dict[int, list[dict]], y: dict[int, list[dict]], level: float) -> dict:
    """Rules 1-3 for arms X and Y (``{seed: evaluations}``) at one level: who beats whom, with the numbers."""
    seeds = sorted(set(x) & set(y))
    sx = {s: select(x[s], level) for s in seeds}
    sy = {s: select(y[s], level) for s in seeds}
    cx, cy = all(v is not None for v in sx.values()), all(v is not None for v in sy.values())
    out = {"level": level, "seeds": seeds, "x_carries": cx, "y_carries": cy}
    if not (cx or cy):
        return {**out, "outcome": "untested"}
    if cx != cy:
        return {**out, "outcome": "x" if cx else "y"}
    d = [sx[s]["b_ppl"] - sy[s]["b_ppl"] for s in seeds]
    r = [sx[s]["b_reward"] - sy[s]["b_reward"] for s in seeds]
    (dm, dse), (rm, rse) = mean_se(d), mean_se(r)
    loo = [sum(d[:i] + d[i + 1:]) / (len(d) - 1) for i in range(len(d))] if len(d) > 1 else []
    outcome = "tie"
    if dm < -2 * dse and loo and all(v < 0 for v in loo) and rm >= -MARGIN:
        outcome = "x"
    elif dm > 2 * dse and loo and all(v > 0 for v in loo) and rm <= MARGIN:
        outcome = "y"
    return {**out, "outcome": outcome, "ppl_diff": dm, "ppl_diff_se": dse, "reward_diff": rm,
            "reward_diff_se": rse, "ppl_diff_by_seed": d,
            "x_b": [[sx[s]["b_reward"], sx[s]["b_ppl"], sx[s]["step"]] for s in seeds],
            "y_b": [[sy[s]["b_reward"], sy[s]["b_ppl"], sy[s]["step"]] for s in seeds]}


def pair(x: dict[int, list[dict]], y: dict[int, list[dict]]) -> dict:
    """Rule 4 over LEVELS."""
    levels = [compare_at(x, y, level) for level in LEVELS]
    wins_x = sum(lv["outcome"] == "x" for lv in levels)
    wins_y = sum(lv["outcome"] == "y" for lv in levels)
    tested = sum(lv["outcome"] != "untested" for lv in levels)
    overall = "x" if wins_x >= 2 and wins_y == 0 else "y" if wins_y >= 2 and wins_x == 0 else "tie"
    return {"levels": levels, "wins_x": wins_x, "wins_y": wins_y, "tested": tested, "overall": overall}


def carries(evals: dict[int, list[dict]], level: float) -> bool:
    return all(select(e, level) is not None for e in evals.values())


def claim(method: str, arms: dict, pairs: dict) -> tuple[str, str]:
    """Rule 5(a) for ``method`` against the fixed betas."""
    considered = [b for b in KL_ARMS if carries(arms[b], 0.8)]
    if not considered:
        return "untestable at this budget", "no fixed β carries 0.8 on every seed"
    beaten = [b for b in considered if pairs[(method, b)]["overall"] == "x"]
    lost = [b for b in considered if pairs[(method, b)]["overall"] == "y"]
    said = f"fixed β carrying 0.8: {', '.join(considered)}; beaten: {', '.join(beaten) or 'none'}; " \
           f"beaten by: {', '.join(lost) or 'none'}"
    if lost:
        return "does not hold", said
    if beaten == considered:
        return "holds", said
    return ("holds in part" if beaten else "ties (not separable at 3 seeds)"), said


def ema_matters(arms: dict, pairs: dict) -> tuple[str, str]:
    """Rule 5(b)."""
    init, decay = pairs[(ER, INIT)], pairs[(ER, ER90)]
    said = (f"elastic_reset vs reset_to_init: {init['wins_x']} wins, {init['wins_y']} losses of {init['tested']} "
            f"tested levels; elastic_reset vs er_decay_0.90: {decay['wins_x']} wins, {decay['wins_y']} losses of "
            f"{decay['tested']}")
    if init["overall"] == "x" or decay["overall"] in ("x", "y"):
        return "the EMA matters", said
    if init["tested"] < 2 and decay["tested"] < 2:
        return "untestable at this budget", said
    return "not separable at this budget", said


def choose_gr(cells: dict[str, dict[int, Path]]) -> str | None:
    """Rule 5(c)'s choice among the ``gr_<setting>`` candidates of seed 0, on set A only."""
    candidates = {a: evaluations(read_metrics(s[0])) for a, s in cells.items() if a.startswith("gr_") and 0 in s}
    if not candidates:
        return None
    for level in sorted(LEVELS, reverse=True):
        chosen = {a: select(e, level) for a, e in candidates.items()}
        if all(v is not None for v in chosen.values()):
            return min(chosen, key=lambda a: (chosen[a]["a_ppl"], a))
    return max(candidates, key=lambda a: (max(e["a_reward"] for e in candidates[a]), a))


def final_rows(cells: dict[str, dict[int, Path]]) -> dict:
    """Rule 6."""
    finals = {a: {s: final_point(p) for s, p in seeds.items()} for a, seeds in cells.items()}
    rows = {}
    for arm, by_seed in finals.items():
        row = {k: mean_se([v[k] for v in by_seed.values()]) for k in ("b_reward", "b_ppl", "a_reward", "test_reward")}
        if arm != ER and ER in finals:
            seeds = sorted(set(by_seed) & set(finals[ER]))
            for k in ("b_ppl", "test_reward"):
                diffs = [finals[ER][s][k] - by_seed[s][k] for s in seeds]
                if len(diffs) > 1:
                    row[f"er_minus_{k}"] = (*mean_se(diffs), sum(d < 0 for d in diffs), len(diffs))
        rows[arm] = row
    return rows


def first_grid(path: Path) -> list[str]:
    """The first 35-cell grid re-read at its final weights, paired by seed, with the labels of what ran."""
    labels = {"kl": "RLOO + KL β 0.1 (adaptive, target 0.5)", "kl_small": "RLOO + KL β 0.01 (adaptive, target 0.5)"}
    finals: dict[str, dict[int, tuple[float, float]]] = {}
    for metrics in sorted(path.glob("runs/*/seed*/metrics.jsonl")):
        records = read_metrics(metrics)
        last = [r for r in records if "eval/reward" in r][-1]
        test = [r["test/reward"] for r in records if "test/reward" in r]
        finals.setdefault(metrics.parent.parent.name, {})[int(metrics.parent.name[4:])] = (
            test[-1] if test else math.nan, last["eval/perplexity"])
    lines = ["", "## The first grid re-read (final weights, paired by seed, no selection)", "",
             f"{path}: Elastic Reset minus each arm; test reward (256 prompts) and perplexity on set A's reviews.", "",
             "| arm | test reward diff | perplexity diff | seeds with lower perplexity |", "|---|---|---|---|"]
    for arm in sorted(finals):
        if arm == ER or ER not in finals:
            continue
        seeds = sorted(set(finals[arm]) & set(finals[ER]))
        tr = mean_se([finals[ER][s][0] - finals[arm][s][0] for s in seeds])
        pp = [finals[ER][s][1] - finals[arm][s][1] for s in seeds]
        m, se = mean_se(pp)
        lines.append(f"| {labels.get(arm, arm)} | {tr[0]:+.3f} ± {tr[1]:.3f} | {m:+.1f} ± {se:.1f} | "
                     f"{sum(p < 0 for p in pp)} of {len(pp)} |")
    return lines


def figure(arms: dict, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (arm, by_seed) in enumerate(arms.items()):
        xs, ys, es = [], [], []
        for level in LEVELS:
            chosen = [select(e, level) for e in by_seed.values()]
            if chosen and all(c is not None for c in chosen):
                m, se = mean_se([c["b_ppl"] for c in chosen])
                xs.append(level + (i - len(arms) / 2) * 0.006)
                ys.append(m)
                es.append(se if math.isfinite(se) else 0.0)
        if xs:
            ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=LABELS.get(arm, arm))
    ax.set_xlabel("reward level (checkpoint chosen on set A)")
    ax.set_ylabel("perplexity on set B's reviews (mean ± SE)")
    ax.set_xticks(LEVELS)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def seed_builds(results: Path) -> dict[int, dict]:
    """``{seed: {policy, classifier}}``: the held-out perplexity and final training loss of the builds each seed's
    cells came from (``RESULTS/builds/seed<k>/``, recorded by grid.sh)."""
    out = {}
    for folder in sorted((results / "builds").glob("seed*")):
        policy, classifier = folder / "policy.json", folder / "classifier.json"
        if policy.exists() and classifier.exists():  # grid.sh records both before a seed's first cell
            out[int(folder.name.removeprefix("seed"))] = {
                "policy": json.loads(policy.read_text())["held_out_perplexity"],
                "classifier": json.loads(classifier.read_text())["final_train_loss"]}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--first-grid", type=Path, help="the first grid's results folder, re-read at its final weights")
    parser.add_argument("--choose-gr", action="store_true", help="print rule 5(c)'s gr candidate and stop")
    args = parser.parse_args(argv)
    cells = read_cells(args.results)
    if args.choose_gr:
        print(choose_gr(cells) or "no gr_<setting> candidate on seed 0 yet")
        return 0
    complete = {a: {s: evaluations(read_metrics(p)) for s, p in cells[a].items()} for a in ARMS
                if len(cells.get(a, {})) >= SEEDS}
    pending = [a for a in ARMS if a not in complete]
    pairs = {(x, y): pair(complete[x], complete[y]) for x in complete for y in complete if x != y}
    lines = ["# Elastic Reset against a tuned fixed KL on IMDB at 135M (written by experiments/imdb_fair/verdict.py)",
             "", f"Rules in the script's docstring, fixed before the first cell. Levels {list(LEVELS)}, "
             f"B-reward margin {MARGIN}; seeds per arm {SEEDS}.", ""]
    verdicts = {}
    if ER in complete and all(b in complete for b in KL_ARMS):
        verdicts["a"] = claim(ER, complete, pairs)
    if all(a in complete for a in (ER, ER90, INIT)):
        verdicts["b"] = ema_matters(complete, pairs)
    if GR in complete and all(b in complete for b in KL_ARMS):
        verdicts["c"] = claim(GR, complete, pairs)
        verdicts["c_vs_er"] = ({"x": "gr beats elastic_reset", "y": "elastic_reset beats gr"}.get(
            pairs[(GR, ER)]["overall"], "ties (not separable at 3 seeds)") if ER in complete else "pending", "")
    names = {"a": "(a) Elastic Reset beats every fixed β that reaches 0.8", "b": "(b) the EMA matters",
             "c": "(c) gradient regularisation beats every fixed β that reaches 0.8", "c_vs_er": "(c) gr vs ER"}
    for key, name in names.items():
        outcome, said = verdicts.get(key, ("pending", "arms missing seeds: " + ", ".join(pending)))
        lines.append(f"- **{name}: {outcome}**" + (f" ({said})" if said else ""))
    lines += ["", "## Pairs at each level (X vs Y: B-perplexity difference X - Y, mean ± SE; B-reward difference)", ""]
    for x in (ER, GR):
        for y in complete:
            if x in complete and y != x:
                p = pairs[(x, y)]
                cells_txt = []
                for lv in p["levels"]:
                    if "ppl_diff" in lv:
                        cells_txt.append(f"{lv['level']}: {lv['outcome']} ({lv['ppl_diff']:+.2f} ± "
                                         f"{lv['ppl_diff_se']:.2f}, reward {lv['reward_diff']:+.3f})")
                    else:
                        cells_txt.append(f"{lv['level']}: {lv['outcome']}")
                lines.append(f"- {x} vs {y}: overall {p['overall']}; " + "; ".join(cells_txt))
    finals = final_rows({a: cells[a] for a in complete})
    lines += ["", "## Final weights, no selection (mean ± SE over seeds)", "",
              "| arm | B-reward | B-perplexity | test reward | ER − arm: B-perplexity (seeds lower) "
              "| ER − arm: test reward |",
              "|---|---|---|---|---|---|"]
    for arm, row in finals.items():
        er = row.get("er_minus_b_ppl")
        et = row.get("er_minus_test_reward")
        lines.append(f"| {LABELS.get(arm, arm)} | {row['b_reward'][0]:.3f} ± {row['b_reward'][1]:.3f} | "
                     f"{row['b_ppl'][0]:.1f} ± {row['b_ppl'][1]:.1f} | {row['test_reward'][0]:.3f} ± "
                     f"{row['test_reward'][1]:.3f} | "
                     + (f"{er[0]:+.1f} ± {er[1]:.1f} ({er[2]} of {er[3]})" if er else "") + " | "
                     + (f"{et[0]:+.3f} ± {et[1]:.3f}" if et else "") + " |")
    if pending:
        lines += ["", f"Pending (fewer than {SEEDS} finished seeds): " + ", ".join(
            f"{a} ({len(cells.get(a, {}))})" for a in pending)]
    builds = seed_builds(args.results)
    if builds:
        lines += ["", "Builds (grid.sh: a seed's cells share one; seeds may differ): " + "; ".join(
            f"seed {s}: policy held-out perplexity {b['policy']:.4f}, classifier final loss {b['classifier']:.4f}"
            for s, b in builds.items())]
    if args.first_grid:
        lines += first_grid(args.first_grid)
    summary = {"levels": LEVELS, "margin": MARGIN, "pending": pending, "builds": builds,
               "verdicts": {k: list(v) for k, v in verdicts.items()},
               "pairs": {f"{x} vs {y}": p for (x, y), p in pairs.items()}, "finals": finals}
    atomic_write_text(args.results / "summary.json", json.dumps(summary, indent=1) + "\n")
    atomic_write_text(args.results / "verdict.md", "\n".join(lines) + "\n")
    if complete:
        figure(complete, args.results / "levels.png")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
