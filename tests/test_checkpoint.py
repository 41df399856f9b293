"""Checkpoints a resume can trust: loaded as tensors and plain data only (a pickle planted in a run directory never
runs), every method's real checkpoint loading that way and resuming exactly; only regular files opened (a FIFO
named like a checkpoint never hangs a resume); and a save that fails (a full disk) stops the run with one line
naming the file. On the tiny config: a few steps per test."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from elastic_reset.cli import main
from elastic_reset.errors import RunFileError, RunRecoveryWarning
from elastic_reset.io import read_metrics, read_pointer, write_pointer
from elastic_reset.rl import checkpoint
from elastic_reset.rl.checkpoint import checkpoint_dir, list_checkpoints, load_latest, save_checkpoint
from elastic_reset.rl.trainer import RLTrainer
from helpers import RUN_SETTINGS as SETTINGS
from helpers import TINY, step_file, without_times
from helpers import run_config as cfg

SETS = [a for s in SETTINGS for a in ("--set", s)]


class Blocked(BaseException):
    """Not an Exception: code that treats a failed read as "does not load, try the next" cannot swallow it."""


@contextmanager
def deadline(seconds: int):
    """Fail, instead of hanging the suite, if the block is still blocked (e.g. opening a FIFO) after ``seconds``."""
    def expire(signum, frame):
        raise Blocked(f"still blocked after {seconds} s")

    def watchdog():
        # Sent to the test's own thread (a process-wide SIGALRM may land on a torch thread and interrupt nothing),
        # and again every second, until the block is left.
        if not stop.wait(seconds):
            while not stop.is_set():
                signal.pthread_kill(target, signal.SIGALRM)
                stop.wait(1)

    target, stop = threading.get_ident(), threading.Event()
    previous = signal.signal(signal.SIGALRM, expire)
    thread = threading.Thread(target=watchdog, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        signal.signal(signal.SIGALRM, previous)




# ------------------------------------------------------------------------------ no pickle of a planted file
class Payload:
    """What an attacker plants: unpickling it calls os.mkdir(marker), standing in for any code."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (str(self.marker),)


def plant(path: Path, step: int, marker: Path) -> None:
    path.unlink(missing_ok=True)
    torch.save({"step": step, "trainable": {}, "payload": Payload(marker)}, path)


def test_a_planted_pickle_never_runs_and_the_run_resumes_from_the_older_checkpoint(finished, run, tmp_path):
    marker = tmp_path / "payload-ran"
    plant(step_file(run, 4), 4, marker)  # `latest` still names it: it is tried first
    try:
        with pytest.warns(RunRecoveryWarning, match=r"step_0000004\.pt: does not load \(it holds a pickled object"):
            RLTrainer(cfg(), run, resume=True).train()
    finally:
        assert not marker.exists(), "the planted pickle ran on --resume"
    assert without_times(read_metrics(run / "metrics.jsonl")) == without_times(read_metrics(finished / "metrics.jsonl"))


def test_a_planted_pickle_as_the_only_checkpoint_stops_the_resume_unrun(run, tmp_path, capsys):
    marker = tmp_path / "payload-ran"
    step_file(run, 2).unlink()
    plant(step_file(run, 4), 4, marker)
    try:
        with pytest.warns(RunRecoveryWarning, match="does not load"):
            assert main(["train", str(TINY), "--out", str(run), "--resume", *SETS]) == 2
    finally:
        assert not marker.exists(), "the planted pickle ran on --resume"
    err = capsys.readouterr().err
    assert "no checkpoint loads (step_0000004.pt (refused: it holds a pickled" in err and len(err.splitlines()) == 1


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


METHODS = ["none", "kl", "elastic_reset", "reset_to_init", "reset_to_ema", "ema_only", "nlpo", "multitask", "frozen",
           "gradient_reg"]
VARIANTS = {f"method={m}": [f"method.name={m}"] for m in METHODS} | {
    "rloo": ["algo.name=rloo"],
    "cosine-schedule+warmup": ["algo.lr_scheduler=cosine", "algo.warmup_steps=1"],
    "reinforce+adaptive-kl": ["algo.name=reinforce", "kl.target=1.0"],
    "rloo+adaptive-entropy": ["algo.name=rloo", "algo.entropy_coef=0.01", "algo.entropy_target=100",
                              "algo.entropy_coef_delta=0.01"],
    "lora+ema-epoch+reset-optimizer": ["model.lora.r=4", "model.lora.alpha=8", "method.ema_update=epoch",
                                       "method.reset_optimizer=true"],
}


@pytest.mark.parametrize("overrides", list(VARIANTS.values()), ids=list(VARIANTS))
def test_every_methods_checkpoint_loads_weights_only_and_resumes_exactly(tmp_path, overrides):
    full = tmp_path / "full"
    RLTrainer(cfg(*overrides), full).train()
    for path in list_checkpoints(full):
        assert isinstance(torch.load(path, map_location="cpu", weights_only=True), dict)
    resumed = tmp_path / "resumed"
    shutil.copytree(full, resumed)
    step_file(resumed, 4).unlink()
    write_pointer(checkpoint_dir(resumed), step_file(resumed, 2).name)
    RLTrainer(cfg(*overrides), resumed, resume=True).train()
    assert without_times(read_metrics(resumed / "metrics.jsonl")) == without_times(read_metrics(full / "metrics.jsonl"))
    assert same(torch.load(step_file(resumed, 4), weights_only=True), torch.load(step_file(full, 4), weights_only=True))


# ------------------------------------------------------------------------------------ only regular files
def make_fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def make_directory(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.mkdir()


def make_link_to_dev_zero(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.symlink_to("/dev/zero")


def make_socket(path: Path) -> None:
    path.unlink(missing_ok=True)
    cwd = os.getcwd()
    os.chdir(path.parent)  # a relative name: a socket's path must be shorter than 108 bytes
    try:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(path.name)
        sock.close()
    finally:
        os.chdir(cwd)


KINDS = {"a FIFO": make_fifo, "a directory": make_directory,
         "a symbolic link to a character device": make_link_to_dev_zero, "a socket": make_socket}


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_non_regular_newest_checkpoint_is_named_and_never_opened(run, kind):
    KINDS[kind](step_file(run, 4))  # `latest` still names it
    with (deadline(60), pytest.warns(RunRecoveryWarning, match=r"using the newest, step_0000002\.pt"),
          pytest.warns(RunRecoveryWarning, match=rf"step_0000004\.pt: {kind}, not a regular file")):
        path, state = load_latest(run)
    assert path == step_file(run, 2) and state["step"] == 2
    with deadline(60), pytest.warns(RunRecoveryWarning, match="step_0000004.pt"):
        assert list_checkpoints(run) == [step_file(run, 2)]


def test_only_non_regular_checkpoints_are_an_error_naming_them(run):
    for step in (2, 4):
        make_fifo(step_file(run, step))
    with deadline(60), pytest.warns(RunRecoveryWarning), pytest.raises(
            RunFileError, match=r"no checkpoint loads \(step_0000002\.pt \(a FIFO\), step_0000004\.pt \(a FIFO\)\)"):
        load_latest(run)


def test_a_fifo_as_the_latest_pointer_or_the_metrics_is_never_read(run):
    make_fifo(checkpoint_dir(run) / "latest")
    with deadline(60), pytest.warns(RunRecoveryWarning, match="latest: expected a regular file, found a FIFO"):
        assert read_pointer(checkpoint_dir(run)) is None
    make_fifo(run / "metrics.jsonl")
    with deadline(60), pytest.raises(RunFileError, match="metrics.jsonl: expected a regular file, found a FIFO"):
        read_metrics(run / "metrics.jsonl")


def test_a_link_to_a_regular_checkpoint_still_loads(run, tmp_path):
    moved = tmp_path / "elsewhere.pt"
    step_file(run, 4).rename(moved)
    step_file(run, 4).symlink_to(moved)
    assert load_latest(run)[0] == step_file(run, 4)


def test_resume_past_a_fifo_checkpoint_finishes_instead_of_hanging(finished, run):
    # The whole command, in a process of its own: a regression fails on the timeout instead of hanging the suite.
    make_fifo(step_file(run, 4))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "elastic_reset.cli", "train", str(TINY), "--out", str(run),
                           "--resume", *SETS], capture_output=True, text=True, env=env, timeout=180)
    assert done.returncode == 0, done.stderr
    assert "step_0000004.pt: a FIFO, not a regular file" in done.stderr
    assert without_times(read_metrics(run / "metrics.jsonl")) == without_times(read_metrics(finished / "metrics.jsonl"))
    assert not step_file(run, 4).is_fifo()  # the resumed run's own save replaced it


# -------------------------------------------------------------------------------------------- a full disk
FAILURES = {
    "OSError": lambda: OSError(errno.ENOSPC, "No space left on device"),
    "RuntimeError": lambda: RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed "
                                         "writing file data/0: file write failed: No space left on device"),
}


@pytest.mark.parametrize("failure", list(FAILURES))
def test_a_save_on_a_full_disk_is_one_line_naming_the_checkpoint(tmp_path, monkeypatch, failure):
    save_checkpoint(tmp_path, 2, {"step": 2, "x": torch.ones(3)})
    before = {p.name: p.read_bytes() for p in checkpoint_dir(tmp_path).iterdir()}

    def full_disk(state, f):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise FAILURES[failure]()

    monkeypatch.setattr(checkpoint.torch, "save", full_disk)
    with pytest.raises(RunFileError) as caught:
        save_checkpoint(tmp_path, 4, {"step": 4, "x": torch.ones(3)})
    message = str(caught.value)
    assert message.startswith(f"{step_file(tmp_path, 4)}: the checkpoint could not be written (")
    assert "No space left on device" in message and "free space on that disk" in message and "\n" not in message
    # No temporary file left, the older checkpoint and the pointer as they were.
    assert {p.name: p.read_bytes() for p in checkpoint_dir(tmp_path).iterdir()} == before


def test_a_run_whose_save_hits_a_full_disk_stops_with_one_line(tmp_path, monkeypatch, capsys):
    def full_disk(state, f):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", full_disk)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["train", str(TINY), "--out", str(tmp_path / "run"), *SETS]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"elastic-reset: error: {step_file(tmp_path / 'run', 2)}: the checkpoint could not be "
                          "written ([Errno 28] No space left on device)") and len(err.splitlines()) == 1
