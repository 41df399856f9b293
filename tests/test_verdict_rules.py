"""The gold-vs-proxy grid's verdicts and the Translation Game's follow the rules their scripts
state before the grids run."""

import json
from pathlib import Path

import pytest
from helpers import load_script

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
SCRIPT = EXPERIMENTS / "gold_vs_proxy" / "report.py"


@pytest.fixture(scope="module")
def report():
    return load_script(SCRIPT, "gold_vs_proxy_report")


def entry(mean, se=0.01):
    return {"mean": mean, "se": se, "n": 3}


def method(report, **means):
    """A method's summary: every measure 0.5 ± 0.01 unless given."""
    return {"seeds": [0, 1, 2], **{m: entry(means.get(m, 0.5)) for m in report.MEASURES}}


def test_greater_is_two_standard_errors_of_the_difference(report):
    # 2 * sqrt(0.1² + 0.1²) = 0.283
    assert report.greater(entry(1.0, 0.1), entry(0.7, 0.1))
    assert not report.greater(entry(1.0, 0.1), entry(0.75, 0.1))
    assert not report.greater(entry(0.7, 0.1), entry(1.0, 0.1))


def test_run_measures_take_the_peak_and_the_last_evaluation(report, tmp_path):
    rows = [{"step": 1, "train/loss": 0.3}]  # a training row without evaluations is skipped
    for step, gold, proxy in ((0, 0.40, -1.0), (5, 0.90, 1.5), (10, 0.70, 0.5)):
        rows.append({"step": step, "eval/gold": gold, "eval/reward": proxy, "eval/perplexity": 40 + step,
                     "eval/kl_init": step / 2,
                     "eval/win_rate": 0.5 + step / 100, "eval_forget/win_rate": 0.5, "eval_forget/kl_init": step})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    m = report.run_measures(tmp_path)
    assert m["peak_gold"] == 0.90 and m["final_gold"] == 0.70
    assert m["drop"] == pytest.approx(0.20) and m["proxy_drop"] == pytest.approx(1.0)
    assert (m["final_perplexity"], m["final_kl"], m["final_forget_kl"]) == (50, 5.0, 10)


def test_verdict_a_holds_only_when_elastic_reset_wins_against_both_betas_with_both_proxies(report):
    def grid(er_vs_small):
        proxy = {"kl": method(report, peak_gold=0.6), "kl_small": method(report, **er_vs_small),
                 "elastic_reset": method(report, peak_gold=0.8, final_perplexity=50, final_kl=10)}
        return {"rm": proxy, "am": proxy}

    assert report.verdict_a(grid({"peak_gold": 0.7}))[0] == "holds"
    # the same peak gold: a win needs both the lower perplexity and the lower KL
    same_peak_more_drift = {"peak_gold": 0.8, "final_perplexity": 60, "final_kl": 20}
    assert report.verdict_a(grid(same_peak_more_drift))[0] == "holds"
    only_perplexity = {"peak_gold": 0.8, "final_perplexity": 60, "final_kl": 10}
    outcome, lines = report.verdict_a(grid(only_perplexity))
    assert outcome == "holds in part" and sum("**neither**" in line for line in lines) == 2
    assert report.verdict_a(grid({"peak_gold": 0.9}))[0] == "does not hold"


def test_verdict_b_needs_an_rm_run_that_over_optimises(report):
    def grid(rm_drop, am_drop):
        return {p: {kl: method(report, drop=d) for kl in ("kl", "kl_small")}
                for p, d in (("rm", rm_drop), ("am", am_drop))}

    assert report.verdict_b(grid(0.01, 0.0))[0].startswith("is not testable")
    assert report.verdict_b(grid(0.2, 0.05))[0] == "holds"
    assert report.verdict_b(grid(0.2, 0.2))[0].startswith("is untestable at this budget")  # equal: not separated
    assert report.verdict_b(grid(0.2, 0.4))[0] == "does not hold"
    mixed = grid(0.2, 0.05)
    mixed["am"]["kl_small"] = method(report, drop=0.2)
    assert report.verdict_b(mixed)[0] == "holds in part"


def test_verdict_c_judges_the_tax_at_equal_gold_by_perplexity_or_forget_kl(report):
    def grid(**sr):
        proxy = {"kl": method(report, final_gold=0.8, final_perplexity=60, final_forget_kl=8),
                 "selective_rehearsal": method(report, **{"final_gold": 0.8, **sr}),
                 "elastic_reset": method(report, final_gold=0.8, final_perplexity=60, final_forget_kl=8),
                 "er_sr": method(report, **{"final_gold": 0.8, **sr})}
        return {"rm": proxy, "am": proxy}

    assert report.verdict_c(grid(final_perplexity=50, final_forget_kl=8))[0] == "holds"
    assert report.verdict_c(grid(final_perplexity=60, final_forget_kl=4))[0] == "holds"
    # less tax bought with less gold is a loss, as is more tax on both measures
    assert report.verdict_c(grid(final_gold=0.6, final_perplexity=50, final_forget_kl=4))[0] == "does not hold"
    assert report.verdict_c(grid(final_perplexity=70, final_forget_kl=12))[0] == "does not hold"
    assert report.verdict_c(grid(final_perplexity=60, final_forget_kl=8))[0].startswith("is untestable")


def test_verdict_c_prime_judges_the_larger_rehearsal_set_alone(report):
    kl = method(report, final_gold=0.8, final_perplexity=60, final_forget_kl=8)
    small = method(report, final_gold=0.8, final_perplexity=90, final_forget_kl=20)  # memorised: more tax
    large = method(report, final_gold=0.8, final_perplexity=50, final_forget_kl=8)
    grid = {"rm": {"kl": kl, "selective_rehearsal": small, "sr_large": large},
            "am": {"kl": kl, "selective_rehearsal": small, "sr_large": large}}
    assert report.verdict_c(grid, report.SR_LARGE_PAIRS)[0] == "holds"
    assert report.verdict_c(grid)[0] == "does not hold"  # (c) unchanged by the second arm
    grid["am"]["sr_large"] = small
    assert report.verdict_c(grid, report.SR_LARGE_PAIRS)[0] == "does not hold"
    assert "(c')" in report.verdict(grid)


def test_a_grid_without_the_methods_a_verdict_compares_is_not_judged(report):
    partial = {"rm": {"kl": method(report)}}
    for verdict in (report.verdict_a, report.verdict_b, report.verdict_c):
        assert verdict(partial)[0].startswith("is not judged")


def test_a_method_with_one_finished_seed_is_not_judged(report):
    one = {"seeds": [0], **{m: entry(0.5, se=0.0) for m in report.MEASURES}}
    better = {"seeds": [0], **{m: entry(0.9, se=0.0) for m in report.MEASURES}}
    grid = {"rm": {"kl": one, "kl_small": one, "elastic_reset": better, "selective_rehearsal": better},
            "am": {"kl": one, "kl_small": one}}
    for verdict in (report.verdict_a, report.verdict_b, report.verdict_c):
        assert verdict(grid)[0].startswith("is not judged")
    for m in ("kl", "kl_small", "elastic_reset"):
        grid["rm"][m] = {**grid["rm"][m], "seeds": [0, 1]}
    assert report.verdict_a(grid)[0] == "holds"


# ------------------------------------------------------------------------------------------ Translation Game
@pytest.mark.parametrize("n, reinforce, se, expected", [
    (1, 20.0, 0.0, "1 seed: no standard error, no verdict yet"),  # one seed's SE is unknown, not 0
    (5, 17.9, 0.2, "no task gain: nothing is compared"),          # +0.5 BLEU: under the 1.0 needed
    (5, 18.6, 0.5, "no task gain: nothing is compared"),          # +1.2 BLEU, under 2 SE of the difference (1.41)
    (5, 18.6, 0.2, "the speaker learns"),                         # +1.2 BLEU, over 2 SE (0.57)
])
def test_the_translation_verdict_needs_a_task_gain_over_seeds_first(tmp_path, n, reinforce, se, expected):
    module = load_script(EXPERIMENTS / "translation_game" / "verdict.py", "translation_verdict")
    methods = {m: {"n_seeds": n, "final_reward": {"mean": value, "se": se}, "final_drift": {"mean": 30.0, "se": se}}
               for m, value in (("frozen", 17.4), ("reinforce", reinforce))}
    (tmp_path / "summary.json").write_text(json.dumps({"methods": methods}))
    rule = next(line for line in module.verdict(tmp_path).splitlines() if line.startswith("(0)"))
    assert rule.endswith(expected)
