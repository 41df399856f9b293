"""A run's directory: who may write it, what it holds, and how a resumed run finds its place in it.

``RunDirectory`` refuses what would overwrite or mix runs, holds the directory's lock for as long as the run
lives (a second writer is refused, naming the holder's PID), writes ``config.yaml`` and ``task.json``, and on
``--resume`` finds the checkpoint to continue from and cuts ``metrics.jsonl`` (and ``completions.jsonl``) back to
it; every start appends the machine it runs on to ``machines.jsonl``. It never restarts
from step 0 over results that a checkpoint once covered. Under data parallelism rank 0 alone locks and writes.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch

from elastic_reset.errors import ConfigError, RunFileError, RunRecoveryWarning
from elastic_reset.evaluation.runs import TASK_FILE
from elastic_reset.io import POINTER, DirectoryLock, MetricsLog, atomic_write_text, remove_stale_temps
from elastic_reset.lm.device import describe_machine
from elastic_reset.rl.checkpoint import checkpoint_dir, list_checkpoints, load_latest
from elastic_reset.rl.config import TrainConfig, check_same_run, config_to_yaml

MACHINES_FILE = "machines.jsonl"
"""One line per start of the run: where it trained, from which step."""


class RunDirectory:
    """The run directory ``path`` of a run of ``config``; ``is_main``: this process writes it (rank 0)."""

    def __init__(self, path: str | Path, config: TrainConfig, *, is_main: bool = True):
        self.path = Path(path)
        self.config = config
        self.is_main = is_main
        self.metrics = MetricsLog(self.path / "metrics.jsonl")
        self.completions = MetricsLog(self.path / "completions.jsonl")  # log_completions: each sample, by step
        self._lock = DirectoryLock(self.path, "run")
        self._created = False

    def claim(self, resume: bool) -> None:
        """Check that the directory may take this run (a new one, or ``resume`` of the same one) and lock it."""
        if self.path.exists() and not self.path.is_dir():
            raise FileExistsError(f"{self.path}: exists and is not a directory; choose another --out")
        if self.is_main:
            self._created = not self.path.exists()
            self.path.mkdir(parents=True, exist_ok=True)
            self._lock.acquire()  # before looking inside: another process may be writing it
        config_path = self.path / "config.yaml"
        holds_run = config_path.exists() or self.metrics.path.exists() or bool(list_checkpoints(self.path))
        if holds_run and not resume:
            raise FileExistsError(f"{self.path}: already holds a run; pass --resume to continue it, or choose "
                                  "another --out")
        if not holds_run:
            return
        if not config_path.is_file():
            raise RunFileError(f"{config_path}: missing, but {self.path} holds a run (metrics.jsonl or "
                               "checkpoints), so it cannot be checked that --resume continues the same run; "
                               "restore the file, or start again in another --out")
        check_same_run(config_path, self.config)

    def abandon(self) -> None:
        """After a failed set-up: release the lock and remove the directory if this run created it and left it
        empty, so that a set-up error leaves no run behind."""
        self.release()
        if self._created and self.path.is_dir() and not any(self.path.iterdir()):
            self.path.rmdir()

    def release(self) -> None:
        if self.is_main:
            self._lock.release()

    def write_config(self, task_name: str, score_key: str, drift_key: str) -> None:
        if not self.is_main:
            return
        atomic_write_text(self.path / "config.yaml", config_to_yaml(self.config))
        # Reports read a run's own task score and drift metric from here (BLEU for the Translation Game), so
        # `elastic-reset pareto` needs no --score/--drift for a task that is not scored by reward and perplexity.
        atomic_write_text(self.path / TASK_FILE, json.dumps(
            {"name": task_name, "score": score_key, "drift": drift_key}) + "\n")

    def record_machine(self, step: int, device) -> None:
        """Append where this start of the run trains (:func:`~elastic_reset.lm.device.describe_machine`) and from
        which step to ``machines.jsonl``: a run resumed on another machine, or a grid spread over sessions, says
        which machine trained which steps."""
        if not self.is_main:
            return
        record = {"from_step": step, **describe_machine(device), "device": str(device),
                  "threads": torch.get_num_threads()}
        with open(self.path / MACHINES_FILE, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def read_json(self, name: str) -> Any | None:
        """A JSON file the run wrote for itself (None when absent); a damaged one is a one-line error."""
        path = self.path / name
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise RunFileError(f"{path}: damaged ({type(err).__name__}: {str(err)[:80]}); restore it, or start the "
                               "run again in another --out") from None

    def checkpoint_to_resume(self) -> tuple[Path, dict[str, Any]] | None:
        """The checkpoint a resumed run continues from, checked against ``metrics.jsonl`` and ``steps``; None when
        the run starts again from step 0 (no checkpoint ever completed). Cuts ``metrics.jsonl`` back to it."""
        stale = (remove_stale_temps(self.path) + remove_stale_temps(checkpoint_dir(self.path))
                 if self.is_main else [])
        if stale:
            warnings.warn(f"{self.path}: removed {len(stale)} temporary file(s) left by a killed save "
                          f"({', '.join(p.name for p in stale)})", RunRecoveryWarning, stacklevel=3)
        records = self.metrics.records()
        last = max((r["step"] for r in records), default=None)
        found = load_latest(self.path)
        if found is None:
            first = self.config.checkpoint_every or self.config.steps
            # The pointer is written only once a checkpoint is complete: without it, none ever was, and a run killed
            # during its first save has records up to that save's step at most.
            ever_saved = (checkpoint_dir(self.path) / POINTER).exists()
            if ever_saved or (last is not None and last > first):
                raise RunFileError(
                    f"{checkpoint_dir(self.path)}: no checkpoint, but {self.metrics.path} has records up to step "
                    f"{last}" + (" and a checkpoint was once written" if ever_saved else
                                 f" and the first checkpoint is written at step {first}")
                    + f": the checkpoints were lost. Start again in another --out (or delete {self.path} to train "
                    "it again from step 0)")
            if records and self.is_main:
                warnings.warn(f"{self.path}: stopped before its first checkpoint (step {first}) was complete; "
                              f"starting again from step 0 and dropping the {len(records)} record(s) written so far",
                              RunRecoveryWarning, stacklevel=3)
            self._truncate_metrics(-1)
            return None
        path, state = found
        step = int(state["step"])
        if step > self.config.steps:
            raise ConfigError(f"steps: {self.config.steps} is below the step of the checkpoint to resume ({step}, "
                              f"{path}); a resumed run can only continue to as many steps or more")
        if last is None or last < step:
            raise RunFileError(
                f"{self.metrics.path}: " + ("missing" if last is None else f"ends at step {last}")
                + f", behind the checkpoint {path.name}: the records up to step {step} are lost and a resumed "
                "run would not rewrite them. Restore the file, or start again in another --out")
        self._truncate_metrics(step)
        return path, state

    def _truncate_metrics(self, step: int) -> None:
        if self.is_main:
            self.metrics.truncate_after(step)
            self.completions.truncate_after(step)

