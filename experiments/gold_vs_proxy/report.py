"""The gold-vs-proxy grid's numbers, figures and verdicts, by rules fixed before the grid ran.

    .venv/bin/python experiments/gold_vs_proxy/report.py runs/gold_vs_proxy experiments/gold_vs_proxy/results/xeon

Reads the finished runs ``GRID/<proxy>/<method>/seed<i>/`` (``experiments/gold_vs_proxy/grid.sh``: proxy ``rm`` or
``am``;
a cell still training is left out, and named) and writes into
RESULTS ``summary.json`` (per proxy and method, mean ± SE over seeds of each run's measures below, and the gold's
Gao fit), ``gold_vs_proxy_<proxy>.png`` and ``verdict.md``.

Per run, from its evaluations on the 64 held-out IMDB prompts (every 5 iterations, step 0 included):
- ``peak_gold``: the highest ``eval/gold`` (the gold's P(positive)) over the run; ``final_gold``: at the last step;
- ``drop``: ``peak_gold − final_gold``, the gold lost after its peak (over-optimisation);
- ``proxy_drop``: the same for the proxy's score (``eval/reward``), reported beside ``drop`` and not used by the
  rules (added after the first cell, before any verdict: under an adaptive KL the gold can fall after its peak
  because the controller pulls the policy back, and then the proxy falls with it: a gold drop with no proxy drop is
  over-optimisation, one with it is not);
- ``final_perplexity`` (held-out reviews), ``final_kl`` (to the initial policy), ``final_win_rate`` (the gold
  prefers the policy's continuation to the initial policy's), ``final_forget_win_rate`` (the same on WikiText-2
  openings, the forget set) and ``final_forget_kl`` (the KL to the initial policy on the forget set).

Rules (written before the grid; "A > B" means A's mean exceeds B's by more than 2 standard errors of the
difference, sqrt(se_A² + se_B²); "A ≈ B" means neither exceeds the other so; a method enters a comparison only with
2 finished seeds or more, added before any verdict so that a partial grid's report judges nothing: with one seed
the SE is 0 and any difference would pass):
(a) Elastic Reset against RLOO + KL (``kl``: β 0.1, ``kl_small``: β 0.01), per proxy: ER *wins* against a β when
    peak_gold(ER) > peak_gold(KL), or when peak_gold(ER) ≈ peak_gold(KL) and ER's final perplexity and final KL
    are both lower (>) than KL's. ER *loses* when the reverse holds. The claim *holds* when ER wins against both β
    with both proxies, *holds in part* when it wins at least once and never loses, *does not hold* otherwise.
(b) RLOO + KL against the AM over-optimises less than against the RM when drop(AM) < drop(RM) (by 2 SE) for a β
    and not drop(AM) > drop(RM) for the other: *holds* for both β, *in part* for one, *does not hold* otherwise.
    If no RM run over-optimises (mean drop below 0.02 at both β), the verdict is *not testable here*.
(c) Selective Rehearsal lowers the alignment tax at equal gold: for each pair (``selective_rehearsal`` vs ``kl``,
    ``er_sr`` vs ``elastic_reset``) and proxy, SR *wins* when final_gold(SR) ≈ or > final_gold(base) and
    (final_perplexity(SR) < base's or final_forget_kl(SR) < base's); it *loses* when its final gold is lower
    (> 2 SE) or it is worse on both measures. *Holds* when it wins in all four, *in part* when it wins at least
    once and never loses, *does not hold* otherwise.
    Amended after the learning check and before any grid run: the first version used the forget set's gold win
    rate instead of its KL, but in the learning run that win rate rose with the drift (0.50 -> 1.00 in 20
    iterations while the held-out perplexity went 41 -> 92): a sentiment gold prefers the more positive Wikipedia
    continuation too, so there it measures the reward's transfer, not what was forgotten. It is still reported.
(c') Pre-registered on 2026-11-26, after seed 0 of the grid and before any run of the arm: seed 0
    showed ``selective_rehearsal``'s 32-example set memorised (its NLL 3.40 -> 0.25 nats a token, the drift above
    ``kl``'s), so a second arm, ``sr_large`` (2,048 candidates, 32 clusters x top 8: 256 examples, each rehearsed
    under once in 50 iterations at 4 a step), asks whether a set the policy cannot memorise lowers the tax. The
    rule of (c) for the pair ``sr_large`` vs ``kl``, per proxy: *holds* when it wins with both proxies, *in part*
    when it wins once and never loses, *does not hold* otherwise. (c) is judged as registered, unchanged by (c').
A wording added after the grid ran, which changes no comparison: a claim none of whose comparisons separates by
2 SE either way (no win, no loss) *is untestable at this budget*, not "does not hold".
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

from elastic_reset.compare import DONE
from elastic_reset.evaluation.figures import plot_gold_vs_proxy
from elastic_reset.evaluation.overoptimisation import gold_vs_proxy
from elastic_reset.evaluation.runs import find_run_dirs, group_runs, load_run
from elastic_reset.io import read_metrics

PROXIES = ("rm", "am")
MEASURES = ("peak_gold", "final_gold", "drop", "proxy_drop", "final_perplexity", "final_kl", "final_win_rate",
            "final_forget_win_rate", "final_forget_kl")
DROP_FLOOR = 0.02
MIN_SEEDS = 2
"""A method enters a comparison with at least this many finished seeds: with one, its standard error is 0 and any
difference would pass the 2-SE rule (a partial grid's report judges nothing it cannot)."""


def run_measures(run_dir: Path) -> dict[str, float]:
    evals = [r for r in read_metrics(run_dir / "metrics.jsonl") if "eval/gold" in r]
    last = evals[-1]
    peak = max(r["eval/gold"] for r in evals)
    proxy_peak = max(r["eval/reward"] for r in evals)
    return {"peak_gold": peak, "final_gold": last["eval/gold"], "drop": peak - last["eval/gold"],
            "proxy_drop": proxy_peak - last["eval/reward"],
            "final_perplexity": last["eval/perplexity"], "final_kl": last["eval/kl_init"],
            "final_win_rate": last["eval/win_rate"], "final_forget_win_rate": last["eval_forget/win_rate"],
            "final_forget_kl": last["eval_forget/kl_init"]}


def mean_se(values: list[float]) -> dict[str, float]:
    a = np.asarray(values, dtype=float)
    return {"mean": float(a.mean()), "se": float(a.std(ddof=1) / math.sqrt(len(a))) if len(a) > 1 else 0.0,
            "n": len(a)}


def summarize(grid: Path) -> dict:
    out = {}
    for proxy in PROXIES:
        if not (grid / proxy).is_dir():
            continue
        found = find_run_dirs(grid / proxy)
        dirs = [d for d in found if (d / DONE).is_file()]  # a cell still training would pull the means down
        if len(dirs) < len(found):
            print(f"{proxy}: {len(found) - len(dirs)} unfinished run(s) left out: "
                  f"{', '.join(str(d) for d in found if d not in dirs)}", file=sys.stderr)
        if not dirs:
            continue
        runs = {d: run_measures(d) for d in dirs}
        gold = group_runs([load_run(d, score="gold_log_odds", drift="kl_init") for d in dirs])
        proxy_runs = group_runs([load_run(d, score="reward", drift="kl_init") for d in dirs])
        curves = gold_vs_proxy(gold, proxy_runs)
        plot_gold_vs_proxy(curves, grid / f"gold_vs_proxy_{proxy}.png")
        methods = {}
        for method, group in gold.items():
            measures = [runs[r.path] for r in group]
            fit = curves[method]["fit"]
            methods[method] = {"seeds": sorted(r.seed for r in group),
                               **{m: mean_se([x[m] for x in measures]) for m in MEASURES},
                               "gao_fit": {"alpha": fit.alpha, "beta": fit.beta, "r2": fit.r2,
                                           "peak_d": fit.peak_d, "peak_gain": fit.peak_gain}}
        out[proxy] = methods
    return out


def greater(a: dict, b: dict) -> bool:
    """a's mean exceeds b's by more than 2 SE of the difference."""
    return a["mean"] - b["mean"] > 2 * math.hypot(a["se"], b["se"])


def fmt(entry: dict, digits: int = 3) -> str:
    return f"{entry['mean']:.{digits}f} ± {entry['se']:.{digits}f}"


def judged(methods: dict, name: str) -> dict | None:
    """``name``'s summary when it has :data:`MIN_SEEDS` finished seeds, else None (left out of the verdicts)."""
    entry = methods.get(name)
    return entry if entry is not None and len(entry["seeds"]) >= MIN_SEEDS else None


def claim(wins: int, losses: int, total: int) -> str:
    if not total:
        return f"is not judged (a method it compares has fewer than {MIN_SEEDS} finished seeds)"
    if wins == total:
        return "holds"
    if not wins and not losses:
        return "is untestable at this budget (no comparison separates by 2 SE either way)"
    return "holds in part" if wins and not losses else "does not hold"


def verdict_a(summary: dict) -> tuple[str, list[str]]:
    wins = losses = total = 0
    lines = []
    for proxy, methods in summary.items():
        er = judged(methods, "elastic_reset")
        for kl in ("kl", "kl_small"):
            base = judged(methods, kl)
            if er is None or base is None:
                continue
            total += 1
            tied = not greater(er["peak_gold"], base["peak_gold"]) and not greater(base["peak_gold"], er["peak_gold"])
            win = greater(er["peak_gold"], base["peak_gold"]) or (
                tied and greater(base["final_perplexity"], er["final_perplexity"])
                and greater(base["final_kl"], er["final_kl"]))
            loss = greater(base["peak_gold"], er["peak_gold"]) or (
                tied and greater(er["final_perplexity"], base["final_perplexity"])
                and greater(er["final_kl"], base["final_kl"]))
            wins, losses = wins + win, losses + loss
            lines.append(f"- {proxy}, elastic_reset vs {kl}: **{'win' if win else 'loss' if loss else 'neither'}** — "
                         f"peak gold {fmt(er['peak_gold'])} vs {fmt(base['peak_gold'])}; final perplexity "
                         f"{fmt(er['final_perplexity'], 1)} vs {fmt(base['final_perplexity'], 1)}; final KL "
                         f"{fmt(er['final_kl'], 2)} vs {fmt(base['final_kl'], 2)}")
    return claim(wins, losses, total), lines


def verdict_b(summary: dict) -> tuple[str, list[str]]:
    rm, am = summary.get("rm", {}), summary.get("am", {})
    lines, less, more, total = [], 0, 0, 0
    for kl in ("kl", "kl_small"):
        if judged(rm, kl) is None or judged(am, kl) is None:
            continue
        total += 1
        less += greater(rm[kl]["drop"], am[kl]["drop"])
        more += greater(am[kl]["drop"], rm[kl]["drop"])
        lines.append(f"- {kl}: gold drop after its peak, AM {fmt(am[kl]['drop'])} vs RM {fmt(rm[kl]['drop'])}; "
                     f"the proxy's own drop AM {fmt(am[kl]['proxy_drop'])} vs RM {fmt(rm[kl]['proxy_drop'])}; "
                     f"peak gold AM {fmt(am[kl]['peak_gold'])} vs RM {fmt(rm[kl]['peak_gold'])}")
    if total and all(rm[kl]["drop"]["mean"] < DROP_FLOOR for kl in ("kl", "kl_small") if judged(rm, kl)):
        return "is not testable here (no RM run over-optimises: mean drop below 0.02)", lines
    return claim(less, more, total), lines


SR_PAIRS = (("selective_rehearsal", "kl"), ("er_sr", "elastic_reset"))
"""(c)'s pairs: rehearsal's arm, the method it is added to."""
SR_LARGE_PAIRS = (("sr_large", "kl"),)
"""(c')'s pair: the larger rehearsal set, pre-registered after seed 0."""


def verdict_c(summary: dict, pairs: tuple = SR_PAIRS) -> tuple[str, list[str]]:
    wins = losses = total = 0
    lines = []
    for proxy, methods in summary.items():
        for sr, base_name in pairs:
            a, b = judged(methods, sr), judged(methods, base_name)
            if a is None or b is None:
                continue
            total += 1
            gold_ok = not greater(b["final_gold"], a["final_gold"])
            better = [greater(b["final_perplexity"], a["final_perplexity"]),
                      greater(b["final_forget_kl"], a["final_forget_kl"])]
            worse = [greater(a["final_perplexity"], b["final_perplexity"]),
                     greater(a["final_forget_kl"], b["final_forget_kl"])]
            win, loss = gold_ok and any(better), not gold_ok or all(worse)
            wins, losses = wins + win, losses + loss
            lines.append(f"- {proxy}, {sr} vs {base_name}: **{'win' if win else 'loss' if loss else 'neither'}** — "
                         f"final gold {fmt(a['final_gold'])} vs {fmt(b['final_gold'])}; final perplexity "
                         f"{fmt(a['final_perplexity'], 1)} vs {fmt(b['final_perplexity'], 1)}; forget-set KL "
                         f"{fmt(a['final_forget_kl'], 2)} vs {fmt(b['final_forget_kl'], 2)} (its gold win rate "
                         f"{fmt(a['final_forget_win_rate'])} vs {fmt(b['final_forget_win_rate'])})")
    return claim(wins, losses, total), lines


def verdict(summary: dict) -> str:
    seeds = sorted({s for methods in summary.values() for m in methods.values() for s in m["seeds"]})
    lines = ["# Gold vs proxy on IMDB (written by experiments/gold_vs_proxy/report.py)", "",
             f"Seeds {seeds}; rules in the script's docstring, fixed before the grid ran.", ""]
    for title, (outcome, rows) in (
            ("(a) Elastic Reset reaches a higher peak gold, or the same gold at less drift, than RLOO + KL",
             verdict_a(summary)),
            ("(b) RLOO + KL against the Advantage Model over-optimises less than against the reward model",
             verdict_b(summary)),
            ("(c) Selective Rehearsal lowers the alignment tax at equal gold", verdict_c(summary)),
            ("(c') ... with a rehearsal set it cannot memorise (256 of 2,048 candidates; pre-registered after seed 0)",
             verdict_c(summary, SR_LARGE_PAIRS))):
        lines += [f"**{title}: {outcome}.**", "", *rows, ""]
    return "\n".join(lines)


def main(grid: Path, results: Path) -> None:
    summary = summarize(grid)
    results.mkdir(parents=True, exist_ok=True)
    (results / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    for proxy in summary:
        (results / f"gold_vs_proxy_{proxy}.png").write_bytes((grid / f"gold_vs_proxy_{proxy}.png").read_bytes())
    text = verdict(summary)
    (results / "verdict.md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
