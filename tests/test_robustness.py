"""Nothing lost, nothing silent: every run directory that is not a clean run either resumes from what is intact,
saying so, or stops with an error naming the file; set-up errors leave no run; a non-finite update stops the run;
CLI errors are one line. One test per case, on the tiny config (a few steps each)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import yaml

from elastic_reset.cli import main
from elastic_reset.errors import ConfigError, NonFiniteError, ReportError, RunFileError, RunRecoveryWarning
from elastic_reset.io import read_metrics, write_pointer
from elastic_reset.rl import ops
from elastic_reset.rl.checkpoint import list_checkpoints, load_latest
from elastic_reset.rl.config import config_from_dict
from elastic_reset.rl.trainer import RLTrainer

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yaml"
STEPS = 4
# 4 iterations, a checkpoint at 2 and 4 (both kept), evaluations at 0, 2 and 4.
SETTINGS = [f"steps={STEPS}", "checkpoint_every=2", "eval.every=2", "progress=false"]


def cfg(*overrides: str):
    return config_from_dict(yaml.safe_load(TINY.read_text()), [*SETTINGS, *overrides])


def without_times(records):
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records]


def step_file(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"step_{step:07d}.pt"


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """One uninterrupted run, trained once; each test damages its own copy."""
    run = tmp_path_factory.mktemp("finished") / "run"
    RLTrainer(cfg(), run).train()
    return run


@pytest.fixture
def run(finished, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(finished, copy)
    return copy


def resume(run: Path, *overrides: str) -> list[dict]:
    """Resume ``run`` to the end, returning its metrics; RunRecoveryWarnings are left to the caller."""
    RLTrainer(cfg(*overrides), run, resume=True).train()
    return read_metrics(run / "metrics.jsonl")


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def cli(*args, env=None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "elastic_reset.cli", *map(str, args)], capture_output=True,
                          text=True, env=full_env)


# ------------------------------------------------------------------------------------------ lost pointer
def test_resume_without_latest_pointer_continues_from_newest_checkpoint(finished, run):
    # A run killed after step 2's checkpoint whose pointer is gone: it continues from step_0000002.pt.
    step_file(run, 4).unlink()
    (run / "checkpoints" / "latest").unlink()
    with pytest.warns(RunRecoveryWarning, match="latest"):
        records = resume(run)
    assert without_times(records) == without_times(read_metrics(finished / "metrics.jsonl"))


def test_resume_with_dangling_latest_pointer_continues_from_newest_checkpoint(finished, run):
    step_file(run, 4).unlink()  # `latest` still names it
    with pytest.warns(RunRecoveryWarning, match="latest"):
        records = resume(run)
    assert without_times(records) == without_times(read_metrics(finished / "metrics.jsonl"))


def test_finished_run_without_latest_pointer_resumes_from_its_last_checkpoint(run):
    (run / "checkpoints" / "latest").unlink()
    with pytest.warns(RunRecoveryWarning, match="step_0000004.pt"):
        trainer = RLTrainer(cfg(), run, resume=True)
    assert trainer.step == STEPS


# ------------------------------------------------------------------------------------ damaged checkpoints
def test_garbage_newest_checkpoint_falls_back_to_the_older_one(run):
    step_file(run, 4).write_bytes(step_file(run, 4).read_bytes()[:100])  # torn
    with pytest.warns(RunRecoveryWarning, match="step_0000004.pt"):
        trainer = RLTrainer(cfg(), run, resume=True)
    assert trainer.step == 2


def test_metrics_after_falling_back_are_complete_and_consistent(finished, run):
    step_file(run, 4).write_bytes(b"garbage")
    with pytest.warns(RunRecoveryWarning):
        records = resume(run)
    train_steps = [r["step"] for r in records if "reward" in r]
    eval_steps = [r["step"] for r in records if "eval/reward" in r]
    assert (train_steps, eval_steps) == ([1, 2, 3, 4], [0, 2, 4])
    assert without_times(records) == without_times(read_metrics(finished / "metrics.jsonl"))


def test_all_checkpoints_garbage_is_an_error_naming_the_folder(run):
    for path in list_checkpoints(run):
        path.write_bytes(b"garbage")
    with pytest.warns(RunRecoveryWarning), pytest.raises(RunFileError, match=r"checkpoints: no checkpoint loads"):
        RLTrainer(cfg(), run, resume=True)


def test_all_checkpoints_garbage_leaves_metrics_untouched(run):
    before = (run / "metrics.jsonl").read_bytes()
    for path in list_checkpoints(run):
        path.write_bytes(b"garbage")
    with warnings.catch_warnings(), pytest.raises(RunFileError):
        warnings.simplefilter("ignore")
        RLTrainer(cfg(), run, resume=True)
    assert (run / "metrics.jsonl").read_bytes() == before


def test_lost_checkpoints_folder_is_an_error_naming_it(run):
    shutil.rmtree(run / "checkpoints")
    with pytest.raises(RunFileError, match=r"checkpoints: no checkpoint, but .*metrics\.jsonl has records"):
        RLTrainer(cfg(), run, resume=True)


def test_lost_checkpoints_folder_never_empties_metrics(run):
    before = (run / "metrics.jsonl").read_bytes()
    shutil.rmtree(run / "checkpoints")
    with pytest.raises(RunFileError):
        RLTrainer(cfg(), run, resume=True)
    assert (run / "metrics.jsonl").read_bytes() == before


def test_run_killed_before_its_first_checkpoint_restarts_saying_so(finished, run):
    # Killed during step 2 (before its checkpoint): only records of steps 0 and 1 and no checkpoint.
    shutil.rmtree(run / "checkpoints")
    kept = [line for line in (run / "metrics.jsonl").read_text().splitlines(keepends=True)
            if yaml.safe_load(line)["step"] < 2]
    (run / "metrics.jsonl").write_text("".join(kept))
    with pytest.warns(RunRecoveryWarning, match="before its first checkpoint"):
        records = resume(run)
    assert without_times(records) == without_times(read_metrics(finished / "metrics.jsonl"))


# ------------------------------------------------------------------------------------------ metrics.jsonl
def test_missing_metrics_is_an_error_naming_it(run):
    (run / "metrics.jsonl").unlink()
    with pytest.raises(RunFileError, match=r"metrics\.jsonl: missing"):
        RLTrainer(cfg(), run, resume=True)


def test_missing_metrics_leaves_the_checkpoints_unchanged(run):
    before = snapshot(run / "checkpoints")
    (run / "metrics.jsonl").unlink()
    with pytest.raises(RunFileError):
        RLTrainer(cfg(), run, resume=True)
    assert snapshot(run / "checkpoints") == before


def test_damaged_metrics_line_is_an_error_naming_the_line(run):
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    lines[2] = '{"step": 2, "rew\n'
    (run / "metrics.jsonl").write_text("".join(lines))
    with pytest.raises(RunFileError, match=r"metrics\.jsonl:3: "):
        RLTrainer(cfg(), run, resume=True)


def test_torn_last_metrics_line_is_tolerated_on_resume(finished, run):
    # Killed while writing step 4's record, after step 2's checkpoint (step 4's never written).
    step_file(run, 4).unlink()
    write_pointer(run / "checkpoints", step_file(run, 2).name)
    text = (run / "metrics.jsonl").read_text()
    cut = text.index('"step": 4')  # the first record of step 4 (its training record), torn in the middle
    (run / "metrics.jsonl").write_text(text[:cut])
    records = resume(run)
    assert without_times(records) == without_times(read_metrics(finished / "metrics.jsonl"))


# ------------------------------------------------------------------------------------------ config.yaml
def test_missing_config_refuses_resume_naming_it(run):
    (run / "config.yaml").unlink()
    with pytest.raises(RunFileError, match=r"config\.yaml: missing"):
        RLTrainer(cfg(), run, resume=True)


def test_missing_config_refuses_a_new_run_in_the_directory(run):
    (run / "config.yaml").unlink()
    with pytest.raises(FileExistsError, match="already holds a run"):
        RLTrainer(cfg(), run)


@pytest.mark.parametrize("damage", [b"algo: [\n  lr: : :\n", b"\xff\xfe\x00\x80garbage", b"- 1\n"],
                         ids=["not-yaml", "binary", "not-a-mapping"])
def test_damaged_config_is_an_error_naming_it(run, damage):
    (run / "config.yaml").write_bytes(damage)
    with pytest.raises(ConfigError, match=r"config\.yaml"):
        RLTrainer(cfg(), run, resume=True)


# ------------------------------------------------------------------------------------------ temp files
def test_stale_temp_files_are_removed_on_resume(run):
    stale = [run / "checkpoints" / ".step_0000006.pt.tmp-abc", run / ".metrics.jsonl.tmp-xyz"]
    for path in stale:
        path.write_bytes(b"half a save")
    with pytest.warns(RunRecoveryWarning, match="temporary file"):
        RLTrainer(cfg(), run, resume=True)
    assert not any(path.exists() for path in stale)


# ------------------------------------------------------------------------------------------ set-up errors
@pytest.mark.parametrize("override", ["task.name=no_such_task", "model.name={tmp}/no-such-model"])
def test_setup_error_leaves_no_run_behind(tmp_path, override):
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=override.split("=")[0]):
        RLTrainer(cfg(override.format(tmp=tmp_path)), out)
    assert not out.exists()


def test_setup_error_in_an_empty_directory_leaves_it_empty(tmp_path):
    with pytest.raises(ConfigError, match="task.name"):
        RLTrainer(cfg("task.name=no_such_task"), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_corrected_command_succeeds_after_a_setup_error(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ConfigError):
        RLTrainer(cfg("task.name=no_such_task"), out)
    records = RLTrainer(cfg("steps=1"), out).train()  # no --resume needed: nothing was left behind
    assert [r["step"] for r in records if "reward" in r] == [1]


# ------------------------------------------------------------------------------------------ non-finite
def _nan_loss_at_step_3(monkeypatch, trainer):
    original = ops.ppo_policy_loss

    def loss(*args, **kwargs):
        value, stats = original(*args, **kwargs)
        return (value * float("nan") if trainer.step == 2 else value), stats

    monkeypatch.setattr(ops, "ppo_policy_loss", loss)


def test_nan_loss_stops_the_run_naming_the_step(tmp_path, monkeypatch):
    trainer = RLTrainer(cfg(), tmp_path / "run")
    _nan_loss_at_step_3(monkeypatch, trainer)
    with pytest.raises(NonFiniteError, match=r"^step 3: the loss .* is nan"):
        trainer.train()


def test_nan_gradient_stops_the_run_naming_it(tmp_path):
    trainer = RLTrainer(cfg(), tmp_path / "run")
    trainer.trainable_params[0].register_hook(lambda g: g * float("nan") if trainer.step == 2 else g)
    with pytest.raises(NonFiniteError, match=r"^step 3: the gradient norm .* is nan"):
        trainer.train()


def test_nan_loss_keeps_the_last_good_checkpoint_loadable_and_finite(tmp_path, monkeypatch):
    trainer = RLTrainer(cfg(), tmp_path / "run")
    _nan_loss_at_step_3(monkeypatch, trainer)
    with pytest.raises(NonFiniteError):
        trainer.train()
    path, state = load_latest(tmp_path / "run")
    assert state["step"] == 2 and all(torch.isfinite(t).all() for t in state["trainable"].values())


def test_nan_loss_is_never_applied_to_the_weights(tmp_path, monkeypatch):
    trainer = RLTrainer(cfg(), tmp_path / "run")
    _nan_loss_at_step_3(monkeypatch, trainer)
    with pytest.raises(NonFiniteError):
        trainer.train()
    assert all(torch.isfinite(p).all() for p in trainer.trainable_params)


# (algo.max_grad_norm=0 / -1 refused naming the key: tests/test_config.py, test_meaningless_setting_is_refused_...)


# ------------------------------------------------------------------------------------------ CLI
def test_pareto_refuses_to_write_over_metrics(run, capsys):
    before = (run / "metrics.jsonl").read_bytes()
    code = main(["pareto", str(run), "--out", str(run / "metrics.jsonl")])
    err = capsys.readouterr().err
    assert (code, err.count("\n"), err.startswith("elastic-reset: error: --out")) == (2, 1, True)
    assert (run / "metrics.jsonl").read_bytes() == before


def _bad_commands(tmp_path: Path) -> dict[str, tuple[list, str]]:
    (tmp_path / "empty").mkdir(exist_ok=True)
    return {
        "task": (["train", TINY, "--out", tmp_path / "a", "--set", "task.name=no_such_task"], "task.name"),
        "model": (["train", TINY, "--out", tmp_path / "b", "--set", f"model.name={tmp_path}/no-model"],
                  "model.name"),
        "pareto": (["pareto", tmp_path / "empty", "--out", tmp_path / "fig.png"], "metrics.jsonl"),
    }


@pytest.mark.parametrize("case", ["task", "model", "pareto"])
def test_cli_error_is_one_line_naming_the_key_or_file(tmp_path, case):
    args, named = _bad_commands(tmp_path)[case]
    result = cli(*args)
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith("elastic-reset: error:") and named in lines[0] and "Traceback" not in result.stderr


@pytest.mark.parametrize("case", ["task", "model", "pareto"])
def test_cli_debug_raises_the_error_itself(tmp_path, case):
    args, named = _bad_commands(tmp_path)[case]
    with pytest.raises((ConfigError, ReportError), match=named):
        main(["--debug", *map(str, args)])


def test_cli_debug_shows_the_traceback(tmp_path):
    args, _ = _bad_commands(tmp_path)["pareto"]
    result = cli("--debug", *args)
    assert result.returncode != 0 and "Traceback" in result.stderr


# ------------------------------------------------------------------------------------------ compare grid
def test_compare_cell_without_latest_pointer_is_resumed_not_retrained(tmp_path):
    from elastic_reset.compare import DONE, plan_grid, train_cell

    (cell,) = plan_grid(TINY, tmp_path, ["kl"], 1, SETTINGS)
    train_cell(cell, log=lambda line: None)
    # Killed after step 2's checkpoint, with the pointer lost.
    (cell.run_dir / DONE).unlink()
    step_file(cell.run_dir, 4).unlink()
    (cell.run_dir / "checkpoints" / "latest").unlink()
    before = [r for r in read_metrics(cell.run_dir / "metrics.jsonl") if r["step"] <= 2]
    with pytest.warns(RunRecoveryWarning):
        action = train_cell(cell, log=lambda line: None)
    after = [r for r in read_metrics(cell.run_dir / "metrics.jsonl") if r["step"] <= 2]
    assert action == "resumed" and after == before  # records up to step 2 kept, timings included: not retrained
