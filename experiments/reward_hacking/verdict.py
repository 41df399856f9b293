"""Which way of stopping reward hacking holds the gold, on a proxy that is hacked? The reward-hacking grid's verdict.

    .venv/bin/python experiments/reward_hacking/verdict.py experiments/reward_hacking/results/grid
    .venv/bin/python experiments/reward_hacking/verdict.py experiments/reward_hacking/results/grid --choose FAMILY

Reads every cell ``RESULTS/runs/<proxy>/<arm>/seed<k>/metrics.jsonl`` (grid.sh; ``proxy`` is ``rm`` or ``am``,
the proxies of the pair count stage 0 chose) and writes ``summary.json``, ``verdict.md``, ``curves.png`` (gold,
proxy and the proxy's agreement with the gold over training, per arm) and ``gold_vs_sqrt_kl.png`` (Gao et al.'s
figure with the fits) into RESULTS. Arms still missing seeds are reported as pending. ``--choose FAMILY`` prints the
candidate of a tuned family that rule 1 picks (grid.sh runs it on the other seeds), or nothing while one is missing.

Data. Every 5 iterations (0-50) each cell is evaluated on two disjoint sets of held-out test reviews: set A
(``eval/*``: 64 prompts, perplexity on 64 reviews) selects, set B (``eval_report/*``: 64 other prompts, perplexity on
64 other reviews) reports (no test split and no forget set: cut to fit the budget, grid.sh). The gold is the sentiment
classifier's mean P(positive) of the policy's continuations (``gold``); the proxy's own mean score is ``reward``.

Rules, fixed before the first cell of the grid:
1. Tuning, the same budget for each tuned method: two candidates on seed 0 (Elastic Reset: reset every 8 or 17
   iterations; reference resets: every 8 or 17; gradient regularisation: γ 0.001 or 0.01); the one of higher peak
   A-gold (ties: the first listed) is the family's arm, run on seeds 1-2, its seed-0 cell copied. RLOO + KL runs
   both fixed β (0.01, 0.03) on every seed: the baseline has more tuning than any method, and the β the same rule
   picks on seed 0 is named the tuned β.
2. Per cell, selection on A and report on B: the peak is the evaluation of highest A-gold (the earliest on ties);
   ``peak_gold`` is B-gold there, ``final_gold`` B-gold at the last evaluation, ``drop`` = peak_gold − final_gold.
   Nothing of B enters a selection.
3. X beats Y on a measure, both with all SEEDS seeds, paired by seed: the differences d_s = X_s − Y_s (for
   ``drop``, Y_s − X_s: less is better) have a mean above 2 SE (``paired_by_seed``: robust to one seed, since a
   seed that carried the mean alone would make the SE at least the mean).
4. X wins against Y if X beats Y on peak_gold or final_gold and Y beats X on neither; X loses if Y wins; "trade-off"
   if each beats the other on one; "not separated" otherwise (the rule cannot tell them apart at this budget).
5. (a) Elastic Reset against RLOO + KL (RM proxy): *holds* if Elastic Reset wins against both β, *holds in part*
   if it wins against one and loses against none, *does not hold* if it loses against one, *is untestable at this
   budget* if no pair separates (a trade-off counts as neither a win nor a loss).
   (b) The Advantage Model over-optimises less than the RM: for no control and for Elastic Reset (its RM-tuned
   setting), the AM arm beats the RM arm on ``drop`` while its peak_gold is not beaten by the RM arm's. *Holds* if
   both, *in part* if one and the RM does not beat the AM on ``drop`` in the other, *does not hold* if the RM beats
   the AM on ``drop`` in one; *untestable at this budget* if the RM's no-control arm does not over-optimise (its
   mean ``drop`` below DROP) or nothing separates.
   (c) Gradient regularisation (the 2026 paper's claim): (a)'s rule for GR against both β and against reference
   resets (three comparisons): *holds* if it wins all three, *in part* if it wins one and loses none, *does not
   hold* if it loses one, *untestable at this budget* if none separates. Reference resets and Elastic Reset against
   each other and against both β are reported by rule 4 beside it.
6. Beside the rules: the last evaluation's perplexity on B's reviews, KL to the initial model and proxy score; Gao
   et al.'s fit R(d) = d(α − β log d) of the gold's log-odds gain against d = √KL per arm (set A, every evaluation
   of every seed); and gold against perplexity at equal gold (set A mean frontiers,
   :func:`~elastic_reset.evaluation.summary.pareto_outcome`'s words).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from elastic_reset.evaluation.pareto import mean_and_se
from elastic_reset.evaluation.summary import paired_by_seed
from elastic_reset.io import atomic_write_text, read_metrics

SEEDS = 3
DROP = 0.05
"""Stage 0's threshold: the RM's no-control arm over-optimises if its mean drop is at least this."""
KL_ARMS = ("rloo_kl_0.01", "rloo_kl_0.03")
FAMILIES = {"er": ("er_17", "er_8"), "rr": ("rr_17", "rr_8"), "gr": ("gr_0.01", "gr_0.001")}
"""Each tuned family's two candidates (rule 1; the first listed wins ties)."""
NONE, ER, RR, GR = "none", "er", "rr", "gr"
RM_ARMS = (NONE, *KL_ARMS, ER, RR, GR)
AM_ARMS = (NONE, ER)
PROXY_ARMS = (("rm", RM_ARMS), ("am", AM_ARMS))
LABELS = {NONE: "RLOO, no KL (no control)", "rloo_kl_0.01": "RLOO + KL β 0.01 (fixed)",
          "rloo_kl_0.03": "RLOO + KL β 0.03 (fixed)", ER: "Elastic Reset (RLOO + KL β 0.001 to the EMA)",
          RR: "Reference resets (RLOO + KL β 0.03, reference ← policy)",
          GR: "RLOO + gradient regularisation (no KL)"}
MEASURES = ("peak_gold", "final_gold", "drop")


def evaluations(records: list[dict]) -> list[dict]:
    return [r for r in records if "eval/gold" in r and "eval_report/gold" in r]


def cell_measures(records: list[dict]) -> dict[str, float]:
    """Rule 2 on one cell, and the measures reported beside it."""
    evals = evaluations(records)
    a = [r["eval/gold"] for r in evals]
    peak, last = evals[a.index(max(a))], evals[-1]
    out = {"peak_gold": peak["eval_report/gold"], "final_gold": last["eval_report/gold"],
           "peak_step": peak["step"], "peak_gold_a": max(a), "final_perplexity": last["eval_report/perplexity"],
           "final_proxy": last["eval_report/reward"]}
    out["drop"] = out["peak_gold"] - out["final_gold"]
    out["final_kl"] = last["eval_report/kl_init"]
    return out


def read_cells(results: Path) -> dict[str, dict[str, dict[int, list[dict]]]]:
    """``{proxy: {arm: {seed: records}}}`` of the finished cells (those with a ``done`` marker)."""
    out: dict[str, dict[str, dict[int, list[dict]]]] = {}
    for done in sorted((results / "runs").glob("*/*/seed*/done")):
        cell = done.parent
        proxy, arm, seed = cell.parent.parent.name, cell.parent.name, int(cell.name.removeprefix("seed"))
        out.setdefault(proxy, {}).setdefault(arm, {})[seed] = read_metrics(cell / "metrics.jsonl")
    return out


def choose(cells: dict[str, dict[int, list[dict]]], candidates: tuple[str, ...]) -> str | None:
    """Rule 1: the candidate of higher peak A-gold on seed 0, or None while one has not finished seed 0."""
    if any(0 not in cells.get(c, {}) for c in candidates):
        return None
    peaks = [cell_measures(cells[c][0])["peak_gold_a"] for c in candidates]
    return candidates[peaks.index(max(peaks))]


def paired(x: dict[int, dict], y: dict[int, dict], measure: str) -> dict | None:
    """Rule 3's numbers for X − Y (for ``drop``: Y − X), or None unless both have all SEEDS seeds."""
    a, b = ({s: m[measure] for s, m in arm.items()} for arm in ((y, x) if measure == "drop" else (x, y)))
    return paired_by_seed(a, b, SEEDS)


def outcome(x: dict[int, dict], y: dict[int, dict]) -> dict:
    """Rule 4: ``wins``, ``loses``, ``trade-off``, ``not separated`` or ``pending``, with rule 3's numbers."""
    tests = {m: paired(x, y, m) for m in MEASURES}
    if any(t is None for t in tests.values()):
        return {"outcome": "pending", **tests}
    x_beats = any(tests[m]["beats"] for m in ("peak_gold", "final_gold"))
    y_beats = any(tests[m]["beaten"] for m in ("peak_gold", "final_gold"))
    word = ("trade-off" if x_beats and y_beats else "wins" if x_beats else "loses" if y_beats else "not separated")
    return {"outcome": word, **tests}


def claim(results: list[str]) -> str:
    """(a) and (c)'s wording from their comparisons' outcomes."""
    if "pending" in results:
        return "pending"
    if "loses" in results:
        return "does not hold"
    wins = results.count("wins")
    if wins == len(results):
        return "holds"
    if wins:
        return "holds in part"
    return "is untestable at this budget"


def am_claim(pairs: dict[str, dict], rm_none: dict[int, dict] | None) -> str:
    """(b)'s wording from the AM-vs-RM comparisons (AM arm as X, RM arm as Y) of no control and Elastic Reset."""
    if any(p["outcome"] == "pending" for p in pairs.values()) or not rm_none or len(rm_none) < SEEDS:
        return "pending"
    if sum(m["drop"] for m in rm_none.values()) / len(rm_none) < DROP:
        return "is untestable at this budget (the RM's no-control arm does not over-optimise)"
    less = [p["drop"]["beats"] and not p["peak_gold"]["beaten"] for p in pairs.values()]
    more = [p["drop"]["beaten"] for p in pairs.values()]
    if any(more):
        return "does not hold"
    if all(less):
        return "holds"
    if any(less):
        return "holds in part"
    return "is untestable at this budget"


def arms_of(cells: dict[str, dict[str, dict[int, list[dict]]]]) -> dict[str, dict[str, dict[int, dict]]]:
    """Per proxy and arm (a tuned family's arm holds its chosen candidate's cells, grid.sh), each cell's measures."""
    out: dict[str, dict[str, dict[int, dict]]] = {}
    for proxy, arms in cells.items():
        out[proxy] = {arm: {s: cell_measures(r) for s, r in seeds.items()} for arm, seeds in arms.items()}
    return out


def figures(cells: dict, fits: dict, results: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from elastic_reset.evaluation.figures import plot_gold_vs_proxy

    shown = [(proxy, arm) for proxy, arms in PROXY_ARMS for arm in arms if arm in cells.get(proxy, {})]
    if not shown:
        return
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for proxy, arm in shown:
        runs = [evaluations(r) for _, r in sorted(cells[proxy][arm].items())]
        steps = [e["step"] for e in runs[0]]
        n = min(len(r) for r in runs)
        style = "-" if proxy == "rm" else "--"
        for ax, key in zip(axes, ("eval_report/gold", "eval_report/reward", "eval_report/proxy_gold_agreement")):
            if all(key in e for r in runs for e in r[:n]):
                ax.plot(steps[:n], [sum(r[i][key] for r in runs) / len(runs) for i in range(n)], style,
                        marker="o", ms=3, label=f"{proxy.upper()}: {LABELS.get(arm, arm)}")
    for ax, title in zip(axes, ("gold: P(positive), set B", "the proxy's own score, set B",
                                "the proxy's ranking agreement with the gold, set B")):
        ax.set(xlabel="iteration", title=title)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(results / "curves.png", dpi=110)
    plt.close(fig)
    if fits:
        plot_gold_vs_proxy(fits, results / "gold_vs_sqrt_kl.png")


def rm_runs(results: Path, cells: dict, score: str, drift: str) -> dict:
    """The RM arms with 2 finished seeds or more, read as runs (set A) for rule 6."""
    from elastic_reset.evaluation.runs import load_run

    out = {}
    for arm in RM_ARMS:
        seeds = sorted(cells.get("rm", {}).get(arm, {}))
        if len(seeds) >= 2:
            out[arm] = [load_run(results / "runs" / "rm" / arm / f"seed{s}", method=arm, score=score, drift=drift)
                        for s in seeds]
    return out


def beside(results: Path, cells: dict) -> tuple[dict, dict]:
    """Rule 6: Gao et al.'s fit per RM arm and the gold-vs-perplexity frontiers' outcomes against each β."""
    from elastic_reset.evaluation.overoptimisation import gold_vs_proxy
    from elastic_reset.evaluation.summary import dominance_summary, pareto_outcome, summarize, to_jsonable

    gold = rm_runs(results, cells, "gold_log_odds", "kl_init")
    fits = gold_vs_proxy({LABELS[a]: r for a, r in gold.items()},
                         {LABELS[a]: r for a, r in rm_runs(results, cells, "reward", "kl_init").items()}) \
        if gold else {}
    groups = rm_runs(results, cells, "gold", "perplexity")
    frontier = {}
    if len(groups) >= 2:
        summary = to_jsonable({**summarize(groups), "dominance": dominance_summary(groups)})
        for x in (ER, RR, GR):
            for kl in KL_ARMS:
                if x in groups and kl in groups:
                    word, text = pareto_outcome(summary, x, kl)
                    frontier[f"{x} vs {kl}"] = {"outcome": word, "text": text}
    return fits, frontier


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--choose", choices=sorted(FAMILIES), help="print the family's chosen candidate and stop")
    args = parser.parse_args(argv)
    cells = read_cells(args.results)
    if args.choose:
        print(choose(cells.get("rm", {}), FAMILIES[args.choose]) or "")
        return 0
    measures = arms_of(cells)
    rm, am = measures.get("rm", {}), measures.get("am", {})
    chosen = {family: choose(cells.get("rm", {}), candidates) for family, candidates in FAMILIES.items()}
    tuned_kl = choose(cells.get("rm", {}), KL_ARMS)
    pair_names = [(ER, kl) for kl in KL_ARMS] + [(GR, kl) for kl in KL_ARMS] + [(GR, RR)] + \
                 [(RR, kl) for kl in KL_ARMS] + [(GR, ER), (RR, ER), (ER, NONE), (RR, NONE), (GR, NONE)] + \
                 [(kl, NONE) for kl in KL_ARMS]
    pairs = {f"{x} vs {y}": outcome(rm.get(x, {}), rm.get(y, {})) for x, y in pair_names}
    am_pairs = {arm: outcome(am.get(arm, {}), rm.get(arm, {})) for arm in AM_ARMS}
    verdicts = {
        "a": claim([pairs[f"{ER} vs {kl}"]["outcome"] for kl in KL_ARMS]),
        "b": am_claim(am_pairs, rm.get(NONE)),
        "c": claim([pairs[f"{GR} vs {kl}"]["outcome"] for kl in KL_ARMS] + [pairs[f"{GR} vs {RR}"]["outcome"]]),
    }
    table = {}
    for proxy, arms in PROXY_ARMS:
        for arm in arms:
            seeds = measures.get(proxy, {}).get(arm, {})
            if seeds:
                table[f"{proxy}/{arm}"] = {"seeds": sorted(seeds), **{
                    k: tuple(float(v) for v in mean_and_se([m[k] for m in seeds.values()])) for k in
                    ("peak_gold", "final_gold", "drop", "peak_step", "final_perplexity", "final_kl", "final_proxy")
                    if all(k in m for m in seeds.values())}}
    fits, frontier = beside(args.results, cells)
    summary = {"seeds": SEEDS, "drop": DROP, "chosen": chosen, "tuned_kl": tuned_kl, "verdicts": verdicts,
               "pairs": pairs, "am_vs_rm": am_pairs, "arms": table,
               "gao_fit": {name: {"alpha": c["fit"].alpha, "beta": c["fit"].beta, "r2": c["fit"].r2,
                                  "peak_d": c["fit"].peak_d} for name, c in fits.items()},
               "gold_vs_perplexity": frontier}
    atomic_write_text(args.results / "summary.json", json.dumps(summary, indent=1, default=float) + "\n")
    lines = ["# Reward hacking: the grid's verdict (written by experiments/reward_hacking/verdict.py)", "",
             "Rules in the script's docstring, fixed before the first cell. Peak gold: set B's gold at the "
             "evaluation of highest set-A gold; final gold: set B's at the last evaluation; mean ± SE over seeds.", "",
             f"- (a) Elastic Reset against RLOO + KL (RM proxy): **{verdicts['a']}**",
             f"- (b) the Advantage Model over-optimises less than the RM: **{verdicts['b']}**",
             f"- (c) gradient regularisation against RLOO + KL and reference resets: **{verdicts['c']}**", "",
             f"Chosen on seed 0 by peak set-A gold: {chosen}; the tuned β by the same rule: {tuned_kl}.", "",
             "| arm | seeds | peak gold (B) | final gold (B) | drop | peak iteration | final perplexity (B) "
             "| final KL | final proxy |", "|---|---|---|---|---|---|---|---|---|"]
    for name, row in table.items():
        proxy, arm = name.split("/")

        def pm(key: str, digits: int = 3) -> str:
            return f"{row[key][0]:.{digits}f} ± {row[key][1]:.{digits}f}" if key in row else "—"
        lines.append(f"| {proxy.upper()}: {LABELS.get(arm, arm)} | {len(row['seeds'])} | {pm('peak_gold')} | "
                     f"{pm('final_gold')} | {pm('drop')} | {pm('peak_step', 1)} | {pm('final_perplexity', 1)} | "
                     f"{pm('final_kl', 2)} | {pm('final_proxy')} |")
    lines += ["", "| pair (RM proxy; X vs Y) | outcome | peak gold X − Y | final gold X − Y | drop Y − X |",
              "|---|---|---|---|---|"]
    for name, p in list(pairs.items()) + [(f"AM vs RM: {arm}", p) for arm, p in am_pairs.items()]:
        cells_text = ["—" if p[m] is None else f"{p[m]['mean']:+.3f} ± {p[m]['se']:.3f}" for m in MEASURES]
        lines.append(f"| {name} | {p['outcome']} | " + " | ".join(cells_text) + " |")
    if fits:
        lines += ["", "Gao fit of the gold's log-odds gain against √KL (set A, RM proxy): " + "; ".join(
            f"{name}: α {c['fit'].alpha:.2f}, β {c['fit'].beta:.2f}, R² {c['fit'].r2:.2f}" for name, c in fits.items())]
    if frontier:
        lines += ["", "Gold against perplexity at equal gold (set A mean frontiers, beside the rules):"] + [
            f"- {name}: {f['outcome']} ({f['text']})" for name, f in frontier.items()]
    pending = [f"{p}/{a}" for p, arms in PROXY_ARMS for a in arms
               if len(measures.get(p, {}).get(a, {})) < SEEDS]
    if pending:
        lines += ["", "Pending (fewer than all seeds): " + ", ".join(pending)]
    atomic_write_text(args.results / "verdict.md", "\n".join(lines) + "\n")
    figures(cells, fits, args.results)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
