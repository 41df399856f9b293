"""Pareto frontiers on hand-made points (paper §5): ties, non-monotone runs, seeds, dominance."""

import numpy as np
import pytest

from elastic_reset.evaluation.pareto import aggregate_frontier, dominance, frontier_at, mean_and_se

# A non-monotone run: reward goes up, dips, goes up again; perplexity rises, falls after a "reset", rises.
SCORES = [0.50, 0.60, 0.55, 0.70, 0.70, 0.65]
PPL = [30.0, 31.0, 30.5, 34.0, 33.0, 31.5]


def test_frontier_is_best_drift_among_points_reaching_the_level():
    levels = [0.40, 0.50, 0.52, 0.60, 0.65, 0.70, 0.71]
    # ≥0.40 and ≥0.50: all points → 30.0; ≥0.52: {31, 30.5, 34, 33, 31.5} → 30.5; ≥0.60: {31, 34, 33, 31.5} → 31;
    # ≥0.65: {34, 33, 31.5} → 31.5; ≥0.70: the tie {34, 33} → 33; ≥0.71: nothing reaches it.
    got = frontier_at(SCORES, PPL, levels)
    np.testing.assert_allclose(got[:-1], [30.0, 30.0, 30.5, 31.0, 31.5, 33.0])
    assert np.isnan(got[-1])


def test_higher_is_better_drift_flips_the_comparison():
    bleu = [20.0, 19.0, 21.0]
    np.testing.assert_allclose(frontier_at([0.1, 0.2, 0.3], bleu, [0.1, 0.2, 0.3], lower_is_better=False),
                               [21.0, 21.0, 21.0])
    np.testing.assert_allclose(frontier_at([0.1, 0.2, 0.3], bleu, [0.15], lower_is_better=True), [19.0])


def test_nan_points_are_ignored_and_bad_shapes_refused():
    np.testing.assert_allclose(frontier_at([0.5, np.nan, 0.6], [30.0, 1.0, 32.0], [0.5]), [30.0])
    with pytest.raises(ValueError, match="scores/drifts"):
        frontier_at([0.5, 0.6], [30.0], [0.5])


def test_standard_error_over_seeds():
    mean, se = mean_and_se(np.array([[1.0, 10.0], [3.0, 14.0]]))
    np.testing.assert_allclose(mean, [2.0, 12.0])
    np.testing.assert_allclose(se, [np.sqrt(2.0) / np.sqrt(2), np.sqrt(8.0) / np.sqrt(2)])
    _, se1 = mean_and_se(np.array([[1.0, 2.0]]))
    np.testing.assert_allclose(se1, [0.0, 0.0])


def test_aggregate_uses_the_range_every_seed_reaches():
    runs = [([0.4, 0.6], [30.0, 32.0]), ([0.5, 0.8], [31.0, 35.0])]
    f = aggregate_frontier(runs, n_levels=3)
    np.testing.assert_allclose(f.levels, [0.5, 0.55, 0.6])
    # seed 1 at 0.5: 32 (only 0.6 ≥ 0.5 besides... 0.4 < 0.5) → 32; seed 2 at 0.5: min(31, 35) = 31.
    np.testing.assert_allclose(f.mean[0], 31.5)
    np.testing.assert_allclose(f.se[0], 0.5)
    assert f.n_seeds == 2


def test_dominance_reports_where_each_method_is_better_and_the_area():
    levels = np.array([0.0, 1.0])
    a = aggregate_frontier([([0.0, 1.0], [10.0, 12.0])], levels=levels)   # drift 10 → 12
    b = aggregate_frontier([([0.0, 1.0], [11.0, 11.0])], levels=levels)   # drift 11 flat
    d = dominance(a, b, n_levels=1001)
    assert d["range"] == [0.0, 1.0]
    # A is better for scores below 0.5, B above: b − a = 1 − 2x, whose integral over [0, 1] is 0.
    assert d["a_better"] == pytest.approx(0.5, abs=2e-3) and d["b_better"] == pytest.approx(0.5, abs=2e-3)
    assert d["area"] == pytest.approx(0.0, abs=1e-9)
    c = aggregate_frontier([([0.0, 1.0], [9.0, 9.0])], levels=levels)
    assert dominance(c, b)["a_better"] == 1.0 and dominance(c, b)["area"] == pytest.approx(2.0)


def test_pareto_outcome_needs_the_better_drift_on_most_of_the_shared_range_and_the_others_reach():
    from elastic_reset.evaluation.summary import pareto_outcome

    def entry(lo, hi):
        return {"final_reward": {"mean": hi, "se": 0.01}, "final_drift": {"mean": 50.0, "se": 1.0},
                "frontier": {"levels": [lo, hi]}}

    def summary(a_better, b_better, a_range, b_range, shared):
        return {"drift": "perplexity", "lower_is_better": True, "methods": {"a": entry(*a_range), "b": entry(*b_range)},
                "dominance": [{"a": "a", "b": "b", "range": shared, "a_better": a_better, "b_better": b_better}]}

    assert pareto_outcome(summary(0.95, 0.05, (0.4, 0.9), (0.4, 0.8), (0.4, 0.8)), "a", "b")[0] == "dominates"
    assert pareto_outcome(summary(0.95, 0.05, (0.4, 0.9), (0.4, 0.8), (0.4, 0.8)), "b", "a")[0] == "dominated"
    assert pareto_outcome(summary(0.85, 0.15, (0.4, 0.9), (0.4, 0.8), (0.4, 0.8)), "a", "b")[0] == "trade-off"
    # Better on the whole shared range, but that range stops at a third of B's own: B reached further, unmatched.
    outcome, text = pareto_outcome(summary(1.0, 0.0, (0.4, 0.6), (0.4, 1.0), (0.4, 0.6)), "a", "b")
    assert outcome == "trade-off" and "lower perplexity there: a on 100%" in text
    assert pareto_outcome(summary(0.0, 0.0, (0.4, 0.5), (0.6, 0.9), None), "a", "b")[0] == "no comparison"
    # Frontiers equal everywhere on the shared range (all at the start's point): not separated, not a trade-off.
    assert pareto_outcome(summary(0.0, 0.0, (0.4, 0.9), (0.4, 0.9), (0.4, 0.9)), "a", "b")[0] == "not separated"


def test_a_claim_no_baseline_separates_from_is_untestable_not_refuted():
    from elastic_reset.evaluation.summary import pareto_claim

    base = ("k1", "k2")
    assert pareto_claim({"k1": "dominates", "k2": "dominates"}, base) == "holds"
    assert pareto_claim({"k1": "dominates"}, base) == "holds in part"  # k2 absent: no comparison
    assert pareto_claim({"k1": "dominates", "k2": "dominated"}, base) == "does not hold"
    assert pareto_claim({"k1": "not separated", "k2": "no comparison"}, base) == "is untestable at this budget"
    assert pareto_claim({"k1": "not separated", "k2": "trade-off"}, base) == "does not hold"


def test_paired_by_seed_beats_beyond_two_standard_errors_and_never_on_one_seed_alone():
    from elastic_reset.evaluation.summary import paired_by_seed

    zero = {0: 0.0, 1: 0.0, 2: 0.0}
    p = paired_by_seed({0: 0.10, 1: 0.11, 2: 0.09}, zero, seeds=3)
    assert p["beats"] and not p["beaten"]
    assert (p["mean"], p["se"]) == pytest.approx((0.10, 0.01 / 3 ** 0.5))
    assert paired_by_seed(zero, {0: 0.10, 1: 0.11, 2: 0.09}, seeds=3)["beaten"]
    for carried in ((0.3, 0.0, 0.0), (0.3, 0.01, -0.01), (5.0, 0.0, 0.0, 0.0, 0.0)):  # one seed carries the mean
        p = paired_by_seed(dict(enumerate(carried)), dict.fromkeys(range(len(carried)), 0.0), seeds=3)
        assert p["se"] >= p["mean"] > 0 and not p["beats"]
    assert paired_by_seed({0: 1.0, 1: 2.0}, zero, seeds=3) is None  # fewer than the seeds asked for
