"""What lets a grid span sessions on new machines (``experiments/grid_cells.sh``): a rebuilt artefact that differs
from the one the committed cells used is refused, and only finished cells' small files go into results/ and back."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "grid_cells.sh"


def bash(call: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f"set -euo pipefail; source {SCRIPT}; {call}"], cwd=cwd, text=True,
                          capture_output=True, env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_same_build_records_the_first_build_then_accepts_the_same_one(tmp_path):
    built = write(tmp_path / "cache/metrics.json", json.dumps({"test": {"log_loss": 0.5717}}))
    recorded = tmp_path / "results/proxy.json"
    assert bash(f"same_build {built} {recorded} test.log_loss", tmp_path).returncode == 0
    assert json.loads(recorded.read_text()) == {"test": {"log_loss": 0.5717}}
    assert bash(f"same_build {built} {recorded} test.log_loss", tmp_path).returncode == 0


def test_same_build_refuses_another_build_and_keeps_the_record(tmp_path):
    built = write(tmp_path / "cache/metrics.json", json.dumps({"test": {"log_loss": 0.5718}}))
    recorded = write(tmp_path / "results/proxy.json", json.dumps({"test": {"log_loss": 0.5717}}))
    done = bash(f"same_build {built} {recorded} test.log_loss", tmp_path)
    assert done.returncode != 0
    assert f"{built}: test.log_loss 0.571800, but this grid's build had 0.571700 ({recorded})" in done.stderr
    assert json.loads(recorded.read_text()) == {"test": {"log_loss": 0.5717}}


def test_cells_go_to_results_without_checkpoints_and_come_back_only_where_missing(tmp_path):
    grid, results, grid2 = tmp_path / "runs/grid", tmp_path / "results/grid", tmp_path / "runs/grid2"
    finished = grid / "rm/kl/seed0"
    for name in ("config.yaml", "metrics.jsonl", "label", "task.json", "done", "machines.jsonl"):
        write(finished / name, name)
    write(finished / "checkpoints/step50/model.safetensors", "weights")
    write(grid / "rm/kl/seed1/config.yaml", "running")  # not finished: no done marker
    assert bash(f"collect_cells {grid} {results}", tmp_path).returncode == 0
    kept = results / "runs/rm/kl/seed0"
    assert sorted(p.name for p in kept.iterdir()) == sorted(
        ["config.yaml", "metrics.jsonl", "label", "task.json", "done", "machines.jsonl"])
    assert not (results / "runs/rm/kl/seed1").exists()

    write(grid2 / "rm/kl/seed0/config.yaml", "this session's own")  # a cell already there is not overwritten
    assert bash(f"restore_cells {results} {grid2}", tmp_path).returncode == 0
    assert (grid2 / "rm/kl/seed0/config.yaml").read_text() == "this session's own"
    assert not (grid2 / "rm/kl/seed0/done").exists()
    grid3 = tmp_path / "runs/grid3"
    assert bash(f"restore_cells {results} {grid3}", tmp_path).returncode == 0
    assert (grid3 / "rm/kl/seed0/done").read_text() == "done"


def test_same_build_without_an_interpreter_says_so_and_is_not_another_build(tmp_path):
    built, recorded = tmp_path / "built.json", tmp_path / "recorded.json"
    built.write_text(json.dumps({"test": {"log_loss": 0.5}}))
    done = bash(f"PYTHON={tmp_path / 'no-python'} same_build {built} {recorded} test.log_loss", tmp_path)
    assert done.returncode == 2 and "same_build: no Python at" in done.stderr and not recorded.exists()


def test_run_arms_gives_compare_each_arms_method_and_settings_then_the_callers_arguments(tmp_path):
    stub = write(tmp_path / "er", '#!/bin/bash\nprintf "%s\\n" "$@" > "$(dirname "$0")/called"\n')
    stub.chmod(0o755)
    call = (f"declare -A METHOD=([a]=kl [b]=elastic_reset) SETS=([a]='kl.coef=0.01 kl.target=null' [b]=''); "
            f"ER={stub} GRID={tmp_path / 'grid'} RESULTS={tmp_path / 'results'} JOBS=2 "
            f"run_arms c.yaml 3 a b -- --set progress=false")
    assert bash(call, tmp_path).returncode == 0
    assert (tmp_path / "called").read_text().split("\n")[:-1] == [
        "compare", "c.yaml", "--out", str(tmp_path / "grid"), "--seeds", "3", "--jobs", "2", "--prune-finished",
        "--methods", "a=kl,b=elastic_reset", "--method-set", "a:kl.coef=0.01", "--method-set", "a:kl.target=null",
        "--set", "progress=false"]
