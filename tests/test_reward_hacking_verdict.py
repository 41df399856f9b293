"""The reward-hacking grid's verdict (experiments/reward_hacking/verdict.py) follows the rules its docstring fixes,
run as a user runs it on synthetic cells whose answer is known."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "reward_hacking" / "verdict.py"
ARMS = ("none", "rloo_kl_0.01", "rloo_kl_0.03", "er", "rr", "gr")


def write_cell(results: Path, proxy: str, arm: str, seed: int, gold_b: list[float],
               gold_a: list[float] | None = None) -> None:
    """One finished cell: evaluations every 5 iterations with set B's gold ``gold_b`` (set A's ``gold_a``, default
    the same), the proxy rising throughout, perplexity and KL growing with the step."""
    cell = results / "runs" / proxy / arm / f"seed{seed}"
    cell.mkdir(parents=True)
    rows = []
    for i, b in enumerate(gold_b):
        a = b if gold_a is None else gold_a[i]
        rows.append({"step": 5 * i, "eval/gold": a, "eval/gold_log_odds": 4 * a - 2, "eval/reward": float(i),
                     "eval/kl_init": 0.1 * i, "eval/perplexity": 40 + i, "eval_report/gold": b,
                     "eval_report/reward": float(i), "eval_report/kl_init": 0.1 * i,
                     "eval_report/perplexity": 40 + i + seed, "eval_report/proxy_gold_agreement": 0.7})
    (cell / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (cell / "label").write_text(arm + "\n")
    (cell / "done").write_text(json.dumps({"steps": 50}))


HACKED = [0.5, 0.7, 0.9, 0.8, 0.7]  # peaks at 0.9, falls 0.2


def grid(results: Path, er: dict[int, list[float]], **arms: list[float]) -> None:
    """Every RM and AM arm on seeds 0-2: hacked unless given; Elastic Reset's golds per seed."""
    for arm in ARMS:
        for seed in range(3):
            golds = er[seed] if arm == "er" else arms.get(arm.replace(".", "_"), HACKED)
            write_cell(results, "rm", arm, seed, [g + 0.001 * seed for g in golds])
    for arm in ("none", "er"):
        for seed in range(3):
            write_cell(results, "am", arm, seed, arms.get(f"am_{arm}", HACKED))


def run_verdict(results: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(results), *args], capture_output=True, text=True,
                          check=True)


def summary(results: Path) -> dict:
    run_verdict(results)
    return json.loads((results / "summary.json").read_text())


def test_elastic_reset_holds_when_it_keeps_a_higher_final_gold_on_every_seed(tmp_path):
    held = [0.5, 0.7, 0.9, 0.9, 0.88]
    grid(tmp_path, {s: [g + 0.01 * s for g in held] for s in range(3)})
    run_verdict(tmp_path)
    out = json.loads((tmp_path / "summary.json").read_text())
    assert out["verdicts"]["a"] == "holds"
    assert out["pairs"]["er vs rloo_kl_0.01"]["outcome"] == "wins"
    assert out["pairs"]["er vs rloo_kl_0.01"]["final_gold"]["mean"] == pytest.approx(0.19, abs=0.011)
    assert out["verdicts"]["c"] == "is untestable at this budget"  # GR, KL and resets all identical
    assert (tmp_path / "verdict.md").is_file() and (tmp_path / "curves.png").is_file()


def test_a_gain_carried_by_one_seed_does_not_separate(tmp_path):
    # seed 2 alone holds the gold
    er = {0: [0.5, 0.7, 0.9, 0.8, 0.7], 1: [0.5, 0.7, 0.9, 0.8, 0.7], 2: [0.5, 0.7, 0.9, 0.9, 0.9]}
    grid(tmp_path, er)
    out = summary(tmp_path)
    assert out["pairs"]["er vs rloo_kl_0.01"]["outcome"] == "not separated"
    assert out["verdicts"]["a"] == "is untestable at this budget"


def test_selection_is_on_set_a_and_the_report_on_set_b(tmp_path):
    held = [0.5, 0.7, 0.9, 0.9, 0.88]
    grid(tmp_path, {s: held for s in range(3)})
    for seed in range(3):  # none: set A peaks at iteration 20, set B at 10
        cell = tmp_path / "runs/rm/none" / f"seed{seed}"
        for f in cell.iterdir():
            f.unlink()
        cell.rmdir()
        write_cell(tmp_path, "rm", "none", seed, [0.5, 0.6, 0.9, 0.7, 0.6], gold_a=[0.5, 0.6, 0.7, 0.6, 0.95])
    row = summary(tmp_path)["arms"]["rm/none"]
    assert row["peak_step"][0] == 20 and row["peak_gold"][0] == pytest.approx(0.6)
    assert row["final_gold"][0] == pytest.approx(0.6) and row["drop"][0] == pytest.approx(0.0)


def test_the_am_claim_needs_an_rm_that_over_optimises(tmp_path):
    rising = [0.5, 0.6, 0.7, 0.8, 0.9]
    grid(tmp_path, {s: rising for s in range(3)}, none=rising)
    out = summary(tmp_path)
    assert out["verdicts"]["b"].startswith("is untestable at this budget")


def test_the_am_claim_holds_when_its_drop_is_lower_at_the_same_peak(tmp_path):
    grid(tmp_path, {s: HACKED for s in range(3)}, am_none=[0.5, 0.7, 0.9, 0.89, 0.88],
         am_er=[0.5, 0.7, 0.9, 0.89, 0.86])
    out = summary(tmp_path)
    assert out["am_vs_rm"]["none"]["drop"]["beats"] and out["verdicts"]["b"] == "holds"


def test_a_family_is_tuned_on_seed_0_by_peak_set_a_gold(tmp_path):
    write_cell(tmp_path, "rm", "er_17", 0, HACKED, gold_a=[0.5, 0.6, 0.7, 0.7, 0.7])
    assert run_verdict(tmp_path, "--choose", "er").stdout.strip() == ""  # er_8 unfinished
    write_cell(tmp_path, "rm", "er_8", 0, [0.5, 0.5, 0.5, 0.5, 0.5], gold_a=[0.5, 0.6, 0.8, 0.7, 0.7])
    assert run_verdict(tmp_path, "--choose", "er").stdout.strip() == "er_8"


FAKE_CLI = '''
import json, os, sys
from pathlib import Path
args = sys.argv[1:]
if args[0] != "compare":
    sys.exit(0)
out, seeds = Path(args[args.index("--out") + 1]), int(args[args.index("--seeds") + 1])
peaks = {"er_8": 0.95, "rr_17": 0.93, "gr_0.001": 0.92}
for entry in args[args.index("--methods") + 1].split(","):
    label = entry.split("=")[0]
    for seed in range(seeds):
        cell = out / label / f"seed{seed}"
        if (cell / "done").exists():
            continue
        with open(os.environ["TRAINED"], "a") as log:
            log.write(f"{out.name}/{label}/seed{seed}\\n")
        cell.mkdir(parents=True, exist_ok=True)
        golds = [0.5, 0.7, peaks.get(label, 0.9), 0.8, 0.7]
        rows = [{"step": 5 * i, "eval/gold": g, "eval/gold_log_odds": g, "eval/reward": i, "eval/kl_init": i,
                 "eval/perplexity": 40 + i, "eval_report/gold": g + 0.01 * seed, "eval_report/reward": i,
                 "eval_report/kl_init": i, "eval_report/perplexity": 40 + i} for i, g in enumerate(golds)]
        (cell / "metrics.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in rows))
        (cell / "label").write_text(label)
        (cell / "done").write_text(json.dumps({"steps": 50}))
'''


def test_the_grid_tunes_on_seed_0_then_runs_each_familys_choice_on_every_seed(tmp_path):
    cache, results = tmp_path / "cache", tmp_path / "results"
    files = {"imdb-sentiment-minilm/config.json": {}, "imdb-smollm2/config.json": {},
             "imdb-smollm2/pretrain_metrics.json": {"held_out_perplexity": 38.0},
             "gold-pairs/imdb-n4000-t0.5-seed0/metrics.json": {"gold_p_positive_mean": 0.53},
             **{f"reward-models/hacking-minilm-{k}-first1000/reward_model.json": {"metrics": {"test": {
                 "log_loss": 0.6}}} for k in ("rm", "am")}}
    for name, content in files.items():
        (cache / name).parent.mkdir(parents=True, exist_ok=True)
        (cache / name).write_text(json.dumps(content))
    (cache / "gold-pairs/imdb-n4000-t0.5-seed0/pairs.jsonl").write_text("{}\n" * 1000)
    results.mkdir()
    (results / "stage0.json").write_text(json.dumps({"choice": 1000}))
    (tmp_path / "er").write_text(FAKE_CLI)
    env = {"PATH": "/usr/bin:/bin", "ELASTIC_RESET_CACHE": str(cache), "RESULTS": str(results),
           "GRID": str(tmp_path / "grid"), "ER": f"{sys.executable} {tmp_path / 'er'}", "PY": sys.executable,
           "PYTHON": sys.executable, "TRAINED": str(tmp_path / "trained.txt")}
    done = subprocess.run(["bash", str(SCRIPT.parent / "grid.sh")], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    trained = (tmp_path / "trained.txt").read_text().split()
    candidates = [f"rm/{c}/seed0" for c in ("er_17", "er_8", "rr_17", "rr_8", "gr_0.01", "gr_0.001")]
    assert set(candidates) <= set(trained) and len(trained) == len(set(trained)) == 27  # no cell twice
    assert trained.index("am/er/seed0") > max(trained.index(c) for c in candidates)  # at the RM's choice
    assert "rm/er/seed0" not in trained and "rm/er/seed2" in trained  # the choice's seed 0 copied, not rerun
    out = json.loads((results / "grid/summary.json").read_text())
    assert out["chosen"] == {"er": "er_8", "rr": "rr_17", "gr": "gr_0.001"}
    assert (results / "grid/runs/rm/er/seed0/label").read_text().strip() == "er"
    assert (results / "grid/runs/am/er/seed2/done").is_file()
