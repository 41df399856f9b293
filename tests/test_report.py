"""Reports and the compare grid: Pareto/curve figures, summary numbers, dominance, `compare` resuming, `pareto` CLI.

Training is the slow part here, so there is ONE real grid (2 methods × 2 seeds × 2 iterations of the tiny model),
shared by the module; the numeric checks of the report run on small hand-written runs whose answers are known.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import statistics
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from elastic_reset.cli import main
from elastic_reset.errors import ReportError, TornRecordWarning
from elastic_reset.io import read_metrics
from elastic_reset.evaluation.figures import drift_scale, plot_curves, plot_pareto
from elastic_reset.evaluation.runs import group_runs, load_run
from elastic_reset.evaluation.summary import dominance_summary, format_dominance, format_table, summarize
from elastic_reset.rl.config import ConfigError
from elastic_reset.rl.trainer import RLTrainer
from helpers import evals

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yaml"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# The smallest run that still has evaluations at steps 0, 1, 2, a checkpoint per step, and a reset at step 2.
# One torch thread: on this 2-core machine, with another job busy, two spinning intra-op threads made the grid
# 15x slower (67 s instead of 4.3 s); the tiny model gains nothing from a second thread anyway.
TINY_SETS = ["threads=1", "steps=2", "eval.every=1", "checkpoint_every=1", "method.reset_every=2", "eval.num_prompts=2",
             "eval.num_texts=2", "sampling.max_new_tokens=6", "sampling.min_new_tokens=6",
             "algo.prompts_per_step=2", "algo.minibatch_size=4", "algo.epochs=1"]


def assert_png(path: Path) -> None:
    assert path.is_file(), path
    data = path.read_bytes()
    assert len(data) > 1000 and data[:8] == PNG_SIGNATURE, path


def last_eval(run_dir: Path, drift: str = "perplexity") -> tuple[float, float]:
    """The run's last evaluation record, read independently of the report module."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    final = [r for r in records if "eval/reward" in r][-1]
    return final["eval/reward"], final[f"eval/{drift}"]


def mean_se(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) / math.sqrt(len(values))


# ------------------------------------------------------------------------------------ hand-written runs
def write_run(run_dir: Path, method: str, seed: int, evals: list[tuple[int, float, float]],
              resets: tuple[int, ...] = (), steps: int | None = None) -> Path:
    """A run directory as the trainer writes it: config.yaml, training records, evaluation records."""
    run_dir.mkdir(parents=True)
    last = max(s for s, _, _ in evals)
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"seed": seed, "steps": steps or last,
                                                         "method": {"name": method}}))
    lines = []
    for step, reward, ppl in evals:
        if step > 0:
            train = {"step": step, "reward": reward, "kl": 0.1}
            if step in resets:
                train["reset"] = {"index": resets.index(step) + 1, "mode": "elastic", "distance": 1.0}
            lines.append(train)
        lines.append({"step": step, "eval/reward": reward, "eval/perplexity": ppl, "eval/kl_init": ppl / 10})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return run_dir


@pytest.fixture
def fake_runs(tmp_path) -> Path:
    """Two methods × two seeds on the same reward levels; `good` has 10 less perplexity everywhere."""
    root = tmp_path / "runs"
    for seed, shift in ((0, 0.0), (1, 2.0)):
        rewards = [0.0, 0.25, 0.5, 0.75, 1.0]
        write_run(root / "good" / f"seed{seed}", "elastic_reset", seed,
                  [(2 * i, r, 20 + 10 * r + shift) for i, r in enumerate(rewards)], resets=(4, 8))
        write_run(root / "bad" / f"seed{seed}", "kl", seed,
                  [(2 * i, r, 30 + 10 * r + shift) for i, r in enumerate(rewards)])
    return root


def test_load_run_reads_evaluations_resets_and_the_chosen_drift(fake_runs):
    run = load_run(fake_runs / "good" / "seed1")
    assert (run.method, run.seed, run.total_steps, run.source) == ("elastic_reset", 1, 8, "eval")
    assert run.steps.tolist() == [0, 2, 4, 6, 8]
    assert run.rewards.tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert np.allclose(run.drifts, [22, 24.5, 27, 29.5, 32])
    assert run.reset_steps == [4, 8]
    kl = load_run(fake_runs / "good" / "seed1", drift="kl_init", method="renamed")
    assert kl.method == "renamed" and np.allclose(kl.drifts, [2.2, 2.45, 2.7, 2.95, 3.2])


def test_load_run_reads_the_ema_evaluation_of_ema_only(tmp_path):
    """EMA-only's point is its EMA (its policy is plain KL-penalised RL): by default it is judged on eval_ema/*."""
    run_dir = write_run(tmp_path / "ema", "ema_only", 0, [(0, 0.0, 30.0), (2, 0.5, 40.0)])
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for r in lines:
        if "eval/reward" in r:
            r.update({"eval_ema/reward": r["eval/reward"] / 2, "eval_ema/perplexity": r["eval/perplexity"] - 5})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    run = load_run(run_dir)
    assert run.source == "eval_ema" and run.rewards.tolist() == [0.0, 0.25] and run.drifts.tolist() == [25, 35]
    assert load_run(run_dir, weights="policy").drifts.tolist() == [30, 40]


def test_load_run_tolerates_a_torn_last_line_of_a_run_being_written(fake_runs):
    path = fake_runs / "bad" / "seed0" / "metrics.jsonl"
    with open(path, "a") as f:
        f.write('{"step": 10, "eval/rew')
    with pytest.warns(TornRecordWarning, match=r"bad/seed0/metrics.jsonl:\d+: the last line is not a whole JSON"):
        assert load_run(path.parent).steps[-1] == 8


def test_load_run_errors_name_the_file(tmp_path, fake_runs, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ReportError, match=str(empty / "metrics.jsonl")):
        load_run(empty)
    no_evals = tmp_path / "no_evals"
    no_evals.mkdir()
    (no_evals / "config.yaml").write_text(yaml.safe_dump({"seed": 0, "method": {"name": "kl"}}))
    (no_evals / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward": 0.5, "kl": 0.0}) + "\n")
    with pytest.raises(ReportError, match=f"{no_evals / 'metrics.jsonl'}.*no evaluation records"):
        load_run(no_evals)
    with pytest.raises(ReportError, match="eval_ema"):
        load_run(fake_runs / "good" / "seed0", weights="ema")
    # The CLI says the same, as an error line and exit status 2, not a traceback.
    assert main(["pareto", str(empty), "--out", str(tmp_path / "fig.png")]) == 2
    assert str(empty / "metrics.jsonl") in capsys.readouterr().err


def test_summary_dominance_and_figures_of_known_runs(fake_runs, tmp_path):
    groups = group_runs([load_run(d) for d in sorted(fake_runs.glob("*/seed*"))])
    assert list(groups) == ["kl", "elastic_reset"]  # bad/ sorts before good/
    summary = summarize(groups)
    er = summary["methods"]["elastic_reset"]
    assert er["n_seeds"] == 2 and er["seeds"] == [0, 1] and er["final_steps"] == [8, 8]
    assert er["final_reward"] == {"mean": 1.0, "se": 0.0}
    assert er["final_drift"]["mean"] == pytest.approx(31.0)           # (30 + 32) / 2
    assert er["final_drift"]["se"] == pytest.approx(1.0)              # stdev(30, 32) / sqrt(2)
    assert summary["methods"]["kl"]["final_drift"]["mean"] == pytest.approx(41.0)
    # The frontier: at every reward level, mean over seeds of the best perplexity reaching it; SE over seeds.
    frontier = er["frontier"]
    assert frontier["levels"][0] == 0.0 and frontier["levels"][-1] == 1.0
    assert frontier["mean"][-1] == pytest.approx(31.0) and frontier["se"][-1] == pytest.approx(1.0)
    assert json.loads(json.dumps(summary, allow_nan=False)) == summary  # strict JSON

    (row,) = dominance_summary(groups)
    assert (row["a"], row["b"]) == ("kl", "elastic_reset")
    assert row["range"] == [0.0, 1.0]
    assert (row["a_better"], row["b_better"]) == (0.0, 1.0)
    assert row["area"] == pytest.approx(-10.0, rel=0.05)              # 10 perplexity better over a range of 1
    assert "elastic_reset on 100%, equal on 0%" in format_dominance([row])
    assert "31 ± 1" in format_table(summary)

    plot_pareto(groups, tmp_path / "p.png")
    plot_curves(groups, tmp_path / "c.png")
    assert_png(tmp_path / "p.png")
    assert_png(tmp_path / "c.png")
    with pytest.raises(ReportError, match="kl_init"):
        plot_pareto(groups, tmp_path / "x.png", drift="kl_init")


def test_the_drift_axis_is_logarithmic_only_when_it_spans_a_decade():
    assert drift_scale([30.0, 45.0, 290.0]) == "linear"
    assert drift_scale([30.0, 45.0, 300.0, float("nan")]) == "log"
    assert drift_scale([0.0, 30.0, 900.0]) == "linear"        # a KL of 0 has no place on a log axis
    assert drift_scale([]) == "linear"


# ---------------------------------------------------------------------------------------- one real grid
def compare_argv(grid: Path) -> list[str]:
    sets = [item for s in TINY_SETS for item in ("--set", s)]
    return ["compare", str(TINY), "--out", str(grid), "--methods", "kl,elastic_reset", "--seeds", "2", *sets,
            "--method-set", "elastic_reset:kl.coef=0.001"]


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    # `threads` sets torch's process-wide thread count: give the rest of the test session its own back.
    threads = torch.get_num_threads()
    grid = tmp_path_factory.mktemp("grid")
    try:
        assert main(compare_argv(grid)) == 0
        yield grid
    finally:
        torch.set_num_threads(threads)


RUNS = [("kl", 0), ("kl", 1), ("elastic_reset", 0), ("elastic_reset", 1)]


def test_compare_writes_the_runs_figures_and_summary(grid):
    for method, seed in RUNS:
        run_dir = grid / method / f"seed{seed}"
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert config["method"]["name"] == method and config["seed"] == seed
        # --method-set applies to its method only; --set to all.
        assert config["kl"]["coef"] == (0.001 if method == "elastic_reset" else 0.05)
        assert config["steps"] == 2
        assert json.loads((run_dir / "done").read_text())["steps"] == 2
    assert_png(grid / "pareto.png")
    assert_png(grid / "pareto_curves.png")
    summary = json.loads((grid / "summary.json").read_text())
    assert summary["command"].startswith("elastic-reset compare ") and "elastic_reset:kl.coef=0.001" in summary[
        "command"]
    assert summary["grid"]["methods"] == {"kl": "kl", "elastic_reset": "elastic_reset"}
    assert summary["grid"]["seeds"] == 2
    assert [(r["method"], r["seed"], r["action"]) for r in summary["runs"]] == [(m, s, "trained") for m, s in RUNS]
    assert len(summary["dominance"]) == 1 and "text" in summary["dominance"][0]
    assert load_run(grid / "elastic_reset" / "seed0").reset_steps == [2]


def test_summary_is_mean_and_standard_error_of_the_last_evaluations(grid):
    summary = json.loads((grid / "summary.json").read_text())
    for method in ("kl", "elastic_reset"):
        entry = summary["methods"][method]
        finals = [last_eval(grid / method / f"seed{seed}") for seed in (0, 1)]
        reward_mean, reward_se = mean_se([r for r, _ in finals])
        drift_mean, drift_se = mean_se([d for _, d in finals])
        assert entry["n_seeds"] == 2 and entry["runs"] == [f"{method}/seed0", f"{method}/seed1"]
        assert entry["final_steps"] == [2, 2]
        assert entry["final_reward"]["mean"] == pytest.approx(reward_mean)
        assert entry["final_reward"]["se"] == pytest.approx(reward_se)
        assert entry["final_drift"]["mean"] == pytest.approx(drift_mean)
        assert entry["final_drift"]["se"] == pytest.approx(drift_se) and drift_se > 0  # seeds differ


def test_pareto_cli_on_run_dirs_prints_dominance_and_table(grid, tmp_path, capsys):
    dirs = [str(grid / m / f"seed{s}") for m, s in RUNS]
    out = tmp_path / "figs" / "front.png"
    assert main(["pareto", *dirs, "--out", str(out), "--drift", "kl_init"]) == 0
    printed = capsys.readouterr().out
    assert "Dominance" in printed and "kl vs elastic_reset" in printed
    assert "final kl_init" in printed and "elastic_reset" in printed
    assert_png(out)
    assert_png(tmp_path / "figs" / "front_curves.png")


def test_compare_rejects_bad_grids_before_training(tmp_path, capsys, monkeypatch):
    def no_training(*args, **kwargs):
        raise AssertionError("nothing may train")

    monkeypatch.setattr(RLTrainer, "__init__", no_training)
    base = ["compare", str(TINY), "--out", str(tmp_path / "g"), "--seeds", "1"]
    assert main([*base, "--methods", "kl,elastc_reset"]) == 2
    assert "elastc_reset" in capsys.readouterr().err
    assert main([*base, "--methods", "kl", "--set", "seed=3"]) == 2
    assert "--seeds" in capsys.readouterr().err
    assert main([*base, "--methods", "kl", "--method-set", "elastic_reset:kl.coef=0.1"]) == 2
    assert "not one of --methods" in capsys.readouterr().err
    assert main([*base, "--methods", "kl", "--method-set", "kl:kl.cof=0.1"]) == 2  # every config is built first
    assert "kl.cof" in capsys.readouterr().err


def test_a_cell_refused_by_the_trainer_says_what_to_change_not_to_run_again(tmp_path, capsys):
    argv = ["compare", str(TINY), "--out", str(tmp_path / "g"), "--seeds", "1", "--methods", "kl", "--set",
            "algo.name=rloo", "--set", "algo.samples_per_prompt=2",
            "--set", "algo.reward_aggregation=normalize_then_sum"]
    assert main(argv) == 2
    out = capsys.readouterr()
    assert "algo.reward_aggregation: normalize_then_sum aggregates" in out.err and "run the same command" not in out.out
    assert not (tmp_path / "g" / "kl" / "seed0" / "config.yaml").exists()


def test_compare_runs_a_named_variant_of_a_method_in_its_own_folder(tmp_path):
    from elastic_reset.compare import parse_method_overrides, parse_methods, plan_grid

    methods = parse_methods("kl, elastic_reset, er_paper=elastic_reset")
    assert methods == {"kl": "kl", "elastic_reset": "elastic_reset", "er_paper": "elastic_reset"}
    overrides = parse_method_overrides(["er_paper:method.ema_update=iteration"], methods)
    cells = plan_grid(TINY, tmp_path, methods, 1, method_overrides=overrides)
    by_label = {c.method: c for c in cells}
    assert by_label["er_paper"].run_dir == tmp_path / "er_paper" / "seed0"
    assert by_label["er_paper"].config.method.name == "elastic_reset"
    assert by_label["er_paper"].config.method.ema_update == "iteration"
    assert by_label["elastic_reset"].config.method.ema_update != "iteration"
    for bad, needle in [("kl,kl", "listed twice"), ("kl,KL=kl", "listed twice"), ("a b=kl", "label"),
                        ("..=kl", "label"), ("summary.json=kl", "report"), ("x=elastc", "elastc")]:
        with pytest.raises(ConfigError, match=needle):
            parse_methods(bad)


def test_pareto_groups_a_grid_by_its_labels_and_refuses_pooled_seeds(grid, tmp_path):
    from elastic_reset.compare import write_label

    assert (grid / "kl" / "seed0" / "label").read_text().strip() == "kl"
    runs = [load_run(grid / m / f"seed{s}") for m, s in RUNS]
    assert [r.method for r in runs] == [m for m, _ in RUNS]
    # A label file renames the group; two runs of one seed in one group (variants pooled) are refused.
    copy = tmp_path / "variant"
    copy.mkdir()
    for name in ("config.yaml", "metrics.jsonl"):
        (copy / name).write_bytes((grid / "kl" / "seed0" / name).read_bytes())
    assert load_run(copy).method == "kl"
    with pytest.raises(ReportError, match="both seed 0"):
        group_runs([runs[0], load_run(copy)])
    write_label(type("Cell", (), {"run_dir": copy, "method": "kl_variant"})())
    assert set(group_runs([runs[0], load_run(copy)])) == {"kl", "kl_variant"}


def test_compare_refuses_a_finished_cell_trained_from_another_config(grid, capsys, monkeypatch):
    def no_training(*args, **kwargs):
        raise AssertionError("nothing may train")

    monkeypatch.setattr(RLTrainer, "__init__", no_training)
    argv = compare_argv(grid)
    argv[argv.index("elastic_reset:kl.coef=0.001")] = "elastic_reset:kl.coef=0.002"
    assert main(argv) == 2
    assert "kl: differs from the run in" in capsys.readouterr().err


def eval_records(run_dir: Path) -> dict[int, tuple]:
    return {step: (r["eval/reward"], r["eval/perplexity"])
            for step, r in evals(read_metrics(run_dir / "metrics.jsonl")).items()}


def test_compare_jobs_trains_cells_side_by_side_to_the_same_records(grid, tmp_path):
    other = tmp_path / "jobs"
    argv = compare_argv(other)
    argv[argv.index("--seeds") + 1] = "1"
    assert main([*argv, "--jobs", "2"]) == 0
    for method in ("kl", "elastic_reset"):
        run_dir = other / method / "seed0"
        assert (run_dir / "done").is_file() and "run written to" in (run_dir / "train.log").read_text()
        # One thread per cell, as in the serial grid (threads=1): the very same numbers.
        assert eval_records(run_dir) == eval_records(grid / method / "seed0")
    summary = json.loads((other / "summary.json").read_text())
    assert sorted(r["action"] for r in summary["runs"]) == ["trained", "trained"]
    assert "--jobs 2" in summary["command"]


def test_compare_jobs_finishes_the_other_cells_when_one_fails(tmp_path, capsys):
    from elastic_reset.io import DirectoryLock

    grid = tmp_path / "jobs"
    argv = compare_argv(grid)
    argv[argv.index("--seeds") + 1] = "1"
    (grid / "kl" / "seed0").mkdir(parents=True)
    with DirectoryLock(grid / "kl" / "seed0"):  # the kl cell's child finds its run directory held by this process
        assert main([*argv, "--jobs", "2"]) == 2
    err = capsys.readouterr().err
    assert "1 of 2 cells failed: kl seed 0 failed (exit code 2)" in err and "train.log" in err
    assert "in use by another run" in (grid / "kl" / "seed0" / "train.log").read_text()
    assert (grid / "elastic_reset" / "seed0" / "done").is_file() and not (grid / "kl" / "seed0" / "done").exists()
    assert main([*argv, "--jobs", "0"]) == 2
    assert "--jobs: expected >= 1, got 0" in capsys.readouterr().err


def test_compare_jobs_on_a_gpu_refuses_cells_that_would_not_fit_before_any_trains(tmp_path, monkeypatch, capsys):
    import elastic_reset.compare as compare

    grid = tmp_path / "gpu"
    argv = [*compare_argv(grid), "--set", "model.device=auto"]
    probed = []

    def probe(cell, config_path):  # what a one-iteration probe measured, per method
        probed.append(cell.method)
        return {"kl": 9.0, "elastic_reset": 11.0}[cell.method]

    monkeypatch.setattr(compare, "resolve_device", lambda setting, field="": torch.device("cuda"))
    monkeypatch.setattr(compare.torch.cuda, "mem_get_info", lambda device: (40 * 2**30, 80 * 2**30))
    monkeypatch.setattr(compare, "probe_gpu_peak_gib", probe)
    assert main([*argv, "--jobs", "4"]) == 2  # 4 x (11 + 0.5) GiB > 40 GiB free
    assert "at most 3 fit (--jobs 3)" in capsys.readouterr().err
    assert sorted(probed) == ["elastic_reset", "kl"]  # one probe per method, not per cell
    assert not any(grid.glob("*/seed*/config.yaml"))  # refused before any cell trained
    monkeypatch.setattr(compare.torch.cuda, "mem_get_info", lambda device: (79 * 2**30, 80 * 2**30))
    cells = compare.plan_grid(TINY, grid, ["kl", "elastic_reset"], 2, [*TINY_SETS, "model.device=auto"])
    compare.check_gpu_room(cells, TINY, 4, log=probed.append)  # 46 GiB of 79 free: they fit
    assert "one cell peaks at 11.00 GiB" in probed[-1]


def test_the_gpu_memory_probe_trains_one_iteration_and_says_when_it_measured_nothing(tmp_path):
    from elastic_reset.compare import plan_grid, probe_gpu_peak_gib
    from elastic_reset.errors import GridError

    cell = plan_grid(TINY, tmp_path / "grid", ["kl"], 1, TINY_SETS)[0]
    with pytest.raises(GridError, match="recorded no memory/gpu_peak_gib"):  # the CPU: no GPU memory to record
        probe_gpu_peak_gib(cell, TINY)
    cell.overrides.append("algo.lr=-1")
    with pytest.raises(GridError, match=r"probe failed \(exit code 2\): .*algo.lr"):  # the child's own error line
        probe_gpu_peak_gib(cell, TINY)
    assert not (tmp_path / "grid").exists()  # the probe trains in a temporary directory


def test_compare_prunes_finished_cells_checkpoints_and_refuses_to_continue_them(grid, tmp_path, monkeypatch, capsys):
    other = tmp_path / "grid"
    shutil.copytree(grid, other)
    argv = compare_argv(other)
    with monkeypatch.context() as m:
        m.setattr(RLTrainer, "__init__", lambda *a, **k: pytest.fail("a finished cell was trained again"))
        assert main([*argv, "--prune-finished"]) == 0  # cells finished earlier are pruned too
    for method, seed in RUNS:
        run_dir = other / method / f"seed{seed}"
        assert not (run_dir / "checkpoints").exists() and (run_dir / "metrics.jsonl").is_file()
        assert json.loads((run_dir / "done").read_text())["pruned"] is True
    assert "checkpoints pruned" in capsys.readouterr().out
    assert (grid / "kl" / "seed0" / "checkpoints").is_dir()  # the copy's source keeps its own
    argv[argv.index("steps=2")] = "steps=3"
    assert main(argv) == 2
    assert "its checkpoints were pruned (--prune-finished), so it cannot be continued to step 3" in \
        capsys.readouterr().err


def test_compare_resumes_where_it_stopped(grid, monkeypatch):
    """Runs last in this module: it re-trains one cell (deterministically, to the same records)."""
    metrics = {(m, s): grid / m / f"seed{s}" / "metrics.jsonl" for m, s in RUNS}
    mtimes = {key: path.stat().st_mtime_ns for key, path in metrics.items()}

    # 1. A finished grid: running it again trains nothing (no trainer is even built) and rewrites the report.
    def no_training(*args, **kwargs):
        raise AssertionError("a finished run was trained again")

    with monkeypatch.context() as m:
        m.setattr(RLTrainer, "__init__", no_training)
        assert main(compare_argv(grid)) == 0
    assert {key: path.stat().st_mtime_ns for key, path in metrics.items()} == mtimes
    summary = json.loads((grid / "summary.json").read_text())
    assert {r["action"] for r in summary["runs"]} == {"skipped"}

    # 2. Simulate a kill of kl/seed1 after its step-1 checkpoint: no done marker, no step-2 checkpoint, while its
    #    metrics.jsonl already holds step-2 records (written before the kill).
    victim = grid / "kl" / "seed1"
    before = [r for r in map(json.loads, metrics["kl", 1].read_text().splitlines()) if "eval/reward" in r]
    (victim / "done").unlink()
    (victim / "checkpoints" / "step_0000002.pt").unlink()
    (victim / "checkpoints" / "latest").write_text("step_0000001.pt")
    built = []
    original_init = RLTrainer.__init__

    def recording_init(self, config, out_dir, **kwargs):
        built.append((Path(out_dir), kwargs.get("resume")))
        original_init(self, config, out_dir, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(RLTrainer, "__init__", recording_init)
        assert main(compare_argv(grid)) == 0
    assert built == [(victim, True)]
    assert (victim / "done").is_file() and (victim / "checkpoints" / "step_0000002.pt").is_file()
    for key, path in metrics.items():
        assert (path.stat().st_mtime_ns == mtimes[key]) == (key != ("kl", 1)), key
    after = [r for r in map(json.loads, metrics["kl", 1].read_text().splitlines()) if "eval/reward" in r]
    assert [r["step"] for r in after] == [0, 1, 2]  # step 2 once: the stale records were cut, then rewritten
    assert after == before  # resuming reproduces the uninterrupted run
    summary = json.loads((grid / "summary.json").read_text())
    assert [r["action"] for r in summary["runs"]] == ["skipped", "resumed", "skipped", "skipped"]


def test_bleu_drift_is_higher_is_better_and_test_scores_are_tabled(tmp_path):
    # The Translation Game's report: x = eval/task_bleu, y = eval/drift_bleu (higher is better), plus the test pass.
    def game_run(run_dir: Path, seed: int, drifts: list[float], test: tuple[float, float]) -> Path:
        run_dir.mkdir(parents=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump({"seed": seed, "steps": 4, "method": {"name": "none"}}))
        lines = [{"step": s, "eval/reward": -1.0, "eval/task_bleu": 10.0 + s, "eval/drift_bleu": d}
                 for s, d in zip((0, 2, 4), drifts)]
        lines.append({"step": 4, "test/reward": -1.0, "test/task_bleu": test[0], "test/drift_bleu": test[1]})
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        return run_dir

    runs = [load_run(game_run(tmp_path / f"s{seed}", seed, [30.0, 20.0 + seed, 10.0], (12.0 + seed, 25.0)),
                     score="task_bleu", drift="drift_bleu") for seed in (0, 1)]
    assert runs[0].rewards.tolist() == [10.0, 12.0, 14.0] and runs[1].test == (13.0, 25.0)
    summary = summarize(group_runs(runs))
    assert summary["lower_is_better"] is False and summary["score"] == "task_bleu"
    assert summary["methods"]["none"]["test_score"]["mean"] == pytest.approx(12.5)
    # Higher drift BLEU is better: at task level 12 the best seen at ≥ 12 is 20.5 (mean of 20 and 21), not 10.
    frontier = summary["methods"]["none"]["frontier"]
    at_12 = frontier["mean"][int(np.argmin(np.abs(np.array(frontier["levels"]) - 12.0)))]
    assert at_12 == pytest.approx(20.5)
    assert "test task_bleu" in format_table(summary)
    with pytest.raises(ReportError, match="score"):
        load_run(tmp_path / "s0", score="bleu")


def test_a_run_is_reported_by_its_task_score_and_drift_unless_told_otherwise(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"seed": 0, "method": {"name": "none"}}))
    record = {"step": 0, "eval/reward": -1.0, "eval/perplexity": 50.0, "eval/task_bleu": 12.0,
              "eval/drift_bleu": 30.0}
    (run_dir / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    assert (load_run(run_dir).score, load_run(run_dir).drifts.tolist()) == ("reward", [50.0])  # no task.json
    (run_dir / "task.json").write_text(json.dumps({"name": "translation_game", "score": "task_bleu",
                                                   "drift": "drift_bleu"}))
    run = load_run(run_dir)
    assert (run.score, run.rewards.tolist(), run.drift, run.drifts.tolist()) == ("task_bleu", [12.0],
                                                                                "drift_bleu", [30.0])
    told = load_run(run_dir, score="reward", drift="perplexity")
    assert (told.rewards.tolist(), told.drifts.tolist()) == ([-1.0], [50.0])
    (run_dir / "task.json").write_text('{"name": "translation_game"}')
    with pytest.raises(ReportError, match="task.json.*score"):
        load_run(run_dir)


# ------------------------------------------------------------------------------------- damaged run files
def damage_metrics_encoding(run_dir: Path) -> None:
    lines = (run_dir / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    lines[1] = b'{"step": 2, "reward": "\xff\xfe"}\n'
    (run_dir / "metrics.jsonl").write_bytes(b"".join(lines))


def damage_metrics_value(run_dir: Path) -> None:
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 10, "eval/reward": "high", "eval/perplexity": 1.0}) + "\n")


DAMAGES = {
    "metrics.jsonl not UTF-8": (damage_metrics_encoding, "metrics.jsonl:2: not UTF-8 text"),
    "metrics.jsonl value not a number": (damage_metrics_value, "metrics.jsonl: the record of step 10 has "
                                                               "eval/reward = 'high', not a number"),
    "config.yaml not UTF-8": (lambda d: (d / "config.yaml").write_bytes(b"seed: 0\nmethod: {name: \xe9}\n"),
                              "config.yaml: not UTF-8 text"),
    "config.yaml not YAML": (lambda d: (d / "config.yaml").write_text("seed: [0\n"), "config.yaml: not valid YAML"),
    "config.yaml not a mapping": (lambda d: (d / "config.yaml").write_text("- 1\n"),
                                  "config.yaml: expected a YAML mapping"),
    "config.yaml seed not an integer": (lambda d: (d / "config.yaml").write_text("seed: one\n"),
                                        "config.yaml: seed: expected an integer"),
    "config.yaml method not a mapping": (lambda d: (d / "config.yaml").write_text("method: kl\n"),
                                         "config.yaml: method: expected a mapping"),
    "task.json not UTF-8": (lambda d: (d / "task.json").write_bytes(b'{"score": "\xff"}'),
                            'task.json: expected a JSON object with "score" and "drift"'),
    "task.json not JSON": (lambda d: (d / "task.json").write_text('{"score": '),
                           'task.json: expected a JSON object with "score" and "drift"'),
    "label not UTF-8": (lambda d: (d / "label").write_bytes(b"\xffkl\n"), "label: not UTF-8 text"),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_pareto_names_a_damaged_run_file_in_one_line(fake_runs, tmp_path, capsys, damage):
    make, needle = DAMAGES[damage]
    run_dir = fake_runs / "good" / "seed1"
    make(run_dir)
    assert main(["pareto", str(fake_runs), "--out", str(tmp_path / "fig.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"elastic-reset: error: {run_dir}/") and needle in err and len(err.splitlines()) == 1


def test_pareto_reads_no_summary_or_done_marker_so_damaged_ones_do_not_matter(fake_runs, tmp_path, capsys):
    (fake_runs / "summary.json").write_bytes(b"\xff\xfe not json")
    for run_dir in fake_runs.glob("*/seed*"):
        (run_dir / "done").write_bytes(b"\xff{")
    assert main(["pareto", str(fake_runs), "--out", str(tmp_path / "fig.png")]) == 0
    assert "Final evaluation" in capsys.readouterr().out


def test_compare_over_damaged_done_markers_and_summary_trusts_the_checkpoints(grid, tmp_path, monkeypatch, capsys):
    def no_training(*args, **kwargs):
        raise AssertionError("a finished run was trained again")

    copy = tmp_path / "grid"
    shutil.copytree(grid, copy)
    (copy / "summary.json").write_bytes(b"\xff\xfe not json")
    for method, seed in RUNS:
        (copy / method / f"seed{seed}" / "done").write_bytes(b"\xff{")
    monkeypatch.setattr(RLTrainer, "__init__", no_training)
    assert main(compare_argv(copy)) == 0
    assert {r["action"] for r in json.loads((copy / "summary.json").read_text())["runs"]} == {"skipped"}


# ------------------------------------------------------------------------------- NaN in a final evaluation
def test_a_nan_final_evaluation_is_tabled_as_n_a_with_a_warning_naming_run_step_and_metric(fake_runs, tmp_path,
                                                                                        capsys):
    from elastic_reset.evaluation.summary import NonFiniteResultWarning

    run_dir = fake_runs / "bad" / "seed1"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    records[-1]["eval/perplexity"] = float("nan")  # the last evaluation, step 8
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.warns(NonFiniteResultWarning, match=rf"^{re.escape(str(run_dir))}: the final evaluation \(step 8\) "
                                                    r"has eval/perplexity = nan; the table shows n/a for the mean "
                                                    "of 'kl'") as caught:
        assert main(["pareto", str(fake_runs), "--out", str(tmp_path / "fig.png")]) == 0
    assert len([w for w in caught if issubclass(w.category, NonFiniteResultWarning)]) == 1
    table = capsys.readouterr().out.split("Final evaluation")[1]
    kl_row = next(line for line in table.splitlines() if line.startswith("kl "))
    assert kl_row.rstrip().endswith("n/a")


def test_one_seed_has_no_standard_error_in_the_table(fake_runs):
    groups = group_runs([load_run(d) for d in sorted(fake_runs.glob("*/seed0"))])
    table = format_table(summarize(groups))
    assert "30 ± n/a" in table and "± 0" not in table  # elastic_reset seed 0: final perplexity 30


def test_dominance_says_where_the_frontiers_are_equal(tmp_path):
    # Equal drift up to reward 0.5, then `b` is better: the three parts of the range add up to 100 %.
    for label, ppl in (("a", [20, 25, 30, 40, 50]), ("b", [20, 25, 30, 35, 40])):
        write_run(tmp_path / label / "seed0", "kl", 0, [(2 * i, r, p) for i, (r, p) in
                                                        enumerate(zip([0.0, 0.25, 0.5, 0.75, 1.0], ppl))])
    runs = [load_run(tmp_path / label / "seed0", method=label) for label in ("a", "b")]
    (row,) = dominance_summary(group_runs(runs))
    text = format_dominance([row])
    assert row["a_better"] == 0.0 and row["b_better"] == pytest.approx(0.5, abs=0.01)
    assert "a has the better perplexity on the reference texts on 0% of the range, b on 50%, equal on 50%" in text
    # each frontier is the least drift reaching a level: b is 5 better over [0.5, 0.75), 10 over [0.75, 1]
    assert row["area"] == pytest.approx(-(5 * 0.25 + 10 * 0.25), abs=0.05)
