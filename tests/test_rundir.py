"""The run directory (rl/rundir.py) and the directory lock (io.DirectoryLock): one writer at a time, a stale lock
taken over, a resume that never goes backwards in steps, a first save cut short restarts from step 0, and a
damaged file of the run's own is a one-line error."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest
import yaml

from elastic_reset.cli import main
from elastic_reset.errors import ConfigError, DirectoryInUseError, RunFileError, RunRecoveryWarning
from elastic_reset.io import LOCK, DirectoryLock, read_metrics
from elastic_reset.rl.config import config_from_dict
from elastic_reset.rl.trainer import RLTrainer
from helpers import RUN_SETTINGS as SETTINGS
from helpers import TINY, without_times
from helpers import run_config as cfg



def _hold_lock_in_another_process(folder: Path) -> subprocess.Popen:
    """A second process that takes ``folder``'s lock, says so on stdout, and holds it until killed."""
    code = textwrap.dedent(f"""
        import time
        from elastic_reset.io import DirectoryLock
        DirectoryLock({str(folder)!r}).acquire()
        print("locked", flush=True)
        time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


# ------------------------------------------------------------------------------------------------ the lock
def test_a_second_trainer_on_a_live_run_directory_is_refused(tmp_path):
    first = RLTrainer(cfg(), tmp_path / "run")
    with pytest.raises(DirectoryInUseError, match=rf"run: in use by another run \(process {os.getpid()}"):
        RLTrainer(cfg(), tmp_path / "run", resume=True)
    first.train()  # the refused one changed nothing the first needs
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [0, 1, 2, 2, 3, 4, 4]


def test_the_lock_is_released_when_training_ends_and_after_a_setup_error(tmp_path):
    RLTrainer(cfg(), tmp_path / "run").train()
    assert not (tmp_path / "run" / LOCK).exists()
    with pytest.raises(ConfigError):
        RLTrainer(cfg("task.name=no_such_task"), tmp_path / "run", resume=True)
    assert not (tmp_path / "run" / LOCK).exists()
    RLTrainer(cfg("steps=5"), tmp_path / "run", resume=True).train()  # nobody holds it


def test_train_into_a_directory_another_process_holds_is_one_line_naming_its_pid(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    holder = _hold_lock_in_another_process(tmp_path / "run")
    try:
        code = main(["train", str(TINY), "--out", str(tmp_path / "run"), "--set", "progress=false"])
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert f"in use by another run (process {holder.pid}" in err
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [LOCK]  # nothing of a run written


def test_a_lock_left_by_a_killed_process_is_taken_over_with_a_warning(tmp_path):
    (tmp_path / "run").mkdir()
    holder = _hold_lock_in_another_process(tmp_path / "run")
    holder.kill()  # SIGKILL: the lock file stays, naming a dead process; the kernel dropped its flock
    holder.wait()
    assert (tmp_path / "run" / LOCK).read_text().strip() == str(holder.pid)
    with pytest.warns(RunRecoveryWarning, match=rf"process {holder.pid} was killed while it held this run"):
        RLTrainer(cfg(), tmp_path / "run").train()


def test_the_lock_refuses_a_second_holder_in_the_same_process(tmp_path):
    with DirectoryLock(tmp_path):
        with pytest.raises(DirectoryInUseError, match=str(os.getpid())):
            DirectoryLock(tmp_path).acquire()
    with DirectoryLock(tmp_path):  # released: free again
        pass


def test_a_second_compare_on_a_live_grid_is_refused(tmp_path, capsys):
    (tmp_path / "grid").mkdir()
    holder = _hold_lock_in_another_process(tmp_path / "grid")
    try:
        code = main(["compare", str(TINY), "--out", str(tmp_path / "grid"), "--methods", "kl", "--seeds", "1",
                     *[a for s in SETTINGS for a in ("--set", s)]])
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err
    assert code == 2 and f"in use by another compare grid (process {holder.pid}" in err
    assert not (tmp_path / "grid" / "kl").exists()  # no cell trained


# ------------------------------------------------------------------------------------------------ resume
def test_resume_with_fewer_steps_than_the_checkpoint_is_refused_and_changes_nothing(run):
    before = {p: p.read_bytes() for p in (run / "config.yaml", run / "metrics.jsonl")}
    with pytest.raises(ConfigError, match=r"^steps: 3 is below the step of the checkpoint to resume \(4, "):
        RLTrainer(cfg("steps=3"), run, resume=True)
    assert {p: p.read_bytes() for p in before} == before


def test_resume_of_a_finished_run_to_the_same_steps_trains_nothing(finished, run):
    assert RLTrainer(cfg(), run, resume=True).train() == []
    assert read_metrics(run / "metrics.jsonl") == read_metrics(finished / "metrics.jsonl")


def test_a_run_killed_during_its_first_checkpoint_save_restarts_from_step_0(finished, run):
    # Killed while writing step 2's checkpoint: records up to step 2, a temporary file, no checkpoint, no pointer.
    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / ".step_0000002.pt.tmp-abc123").write_bytes(b"torn")
    kept = [r for r in read_metrics(run / "metrics.jsonl") if r["step"] <= 2]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        RLTrainer(cfg(), run, resume=True).train()
    messages = [str(w.message) for w in caught if issubclass(w.category, RunRecoveryWarning)]
    assert any("before its first checkpoint (step 2) was complete" in m for m in messages)
    assert without_times(read_metrics(run / "metrics.jsonl")) == without_times(read_metrics(finished / "metrics.jsonl"))


def test_checkpoints_lost_after_one_was_written_are_still_an_error(run):
    # The pointer proves a checkpoint once existed: never restart over results it covered.
    for path in (run / "checkpoints").glob("step_*.pt"):
        path.unlink()
    kept = [r for r in read_metrics(run / "metrics.jsonl") if r["step"] <= 2]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    with pytest.raises(RunFileError, match="a checkpoint was once written: the checkpoints were lost"):
        RLTrainer(cfg(), run, resume=True)


@pytest.mark.parametrize("damage", [b'["a", "b"', b"\xff\xfe not utf-8", b'{"not": "a list"}'])
def test_damaged_reference_texts_is_one_line_naming_the_file(tmp_path, damage, capsys):
    overrides = ["eval.reference=initial_samples", "eval.num_texts=2", "steps=2"]
    RLTrainer(cfg(*overrides), tmp_path / "run").train()
    (tmp_path / "run" / "reference_texts.json").write_bytes(damage)
    args = ["train", str(TINY), "--out", str(tmp_path / "run"), "--resume"]
    code = main([*args, *[a for s in [*SETTINGS, *overrides] for a in ("--set", s)]])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "reference_texts.json" in err


def test_lock_file_names_the_live_holder(tmp_path):
    trainer = RLTrainer(cfg(), tmp_path / "run")
    assert (tmp_path / "run" / LOCK).read_text().strip() == str(os.getpid())
    trainer.close()
    assert not (tmp_path / "run" / LOCK).exists()


def test_a_killed_training_process_leaves_a_lock_the_next_resume_takes_over(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "elastic_reset.cli", "train", str(TINY), "--out", str(out),
                             "--set", "steps=200", "--set", "progress=false"],
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not any((out / "checkpoints").glob("step_*.pt")):
        time.sleep(0.2)
    proc.kill()
    proc.wait()
    assert (out / LOCK).read_text().strip() == str(proc.pid)
    with pytest.warns(RunRecoveryWarning, match=f"process {proc.pid} was killed"):
        trainer = RLTrainer(config_from_dict(yaml.safe_load(TINY.read_text()), ["steps=200", "progress=false"]),
                            out, resume=True)
    assert trainer.step >= 2
    trainer.close()


def test_every_start_of_a_run_records_its_machine_and_first_step(tmp_path):
    RLTrainer(cfg("steps=2"), tmp_path).train()
    RLTrainer(cfg("steps=4"), tmp_path, resume=True).train()
    starts = [json.loads(line) for line in (tmp_path / "machines.jsonl").read_text().splitlines()]
    assert [s["from_step"] for s in starts] == [0, 2]  # the resumed start says where it took over
    assert all(s["cpu"] and s["cores"] >= 1 and s["device"] == "cpu" and s["gpu"] is None and s["torch"]
               for s in starts)
