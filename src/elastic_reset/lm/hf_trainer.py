"""Resuming transformers' ``Trainer`` across processes: the newest checkpoint whose save finished, and the training
seconds summed over the processes (the reward models and the builds that train on the ``Trainer``)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from transformers import TrainerCallback

from elastic_reset.io import atomic_write_text


class TrainingClock(TrainerCallback):
    """The seconds a training took, over every process of a resumed run: each checkpoint keeps the seconds up to it
    in ``training_seconds.json``, and a resumed run counts on from the one it starts from. What ran after the last
    checkpoint of an interrupted process is done again, so it is not counted. (The Trainer's own ``train_runtime``
    is the last process's alone: a SmolLM2 reward model on 2 CPU cores takes several processes.)"""

    FILE = "training_seconds.json"

    def __init__(self, checkpoint: str | Path | None = None):
        path = None if checkpoint is None else Path(checkpoint) / self.FILE
        # A checkpoint written before this clock existed has no file: its time is unknown, so it counts as 0.
        self.before = json.loads(path.read_text())["seconds"] if path is not None and path.is_file() else 0.0
        self.start = time.perf_counter()

    def seconds(self) -> float:
        return self.before + time.perf_counter() - self.start

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_save(self, args, state, control, **kwargs):
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if folder.is_dir():
            atomic_write_text(folder / self.FILE, json.dumps({"seconds": self.seconds()}) + "\n")


def last_complete_checkpoint(folder: str | Path, log=print, command: str = "train") -> str | None:
    """The newest checkpoint in ``folder`` whose save finished, or None. transformers' ``get_last_checkpoint`` takes
    the newest folder as it is, so after a process killed while saving, ``--resume`` would stop at a missing or
    half-written file (transformers 5.23: ``FileNotFoundError`` / ``JSONDecodeError`` on ``trainer_state.json``),
    or load half-written weights. ``Trainer._save_checkpoint`` writes the weights, the optimizer, scheduler and RNG
    states, and the trainer state last (none atomically), so a readable ``trainer_state.json`` marks a finished
    save. (Its rotation deletes old checkpoints only after a newer one is saved, so a half-deleted one is never the
    newest finished.) Newer, unfinished checkpoints are removed, each named in the log, so that the rotation cannot
    later keep one of them in place of a good one."""
    found = []
    for path in Path(folder).glob("checkpoint-*"):
        step = path.name.removeprefix("checkpoint-")
        if path.is_dir() and step.isdigit():
            found.append((int(step), path))
    for _, path in sorted(found, reverse=True):
        try:
            json.loads((path / "trainer_state.json").read_text())
            return str(path)
        except (OSError, ValueError):
            log(f"{command}: {path} was not saved to the end (no readable trainer_state.json): removed")
            shutil.rmtree(path)
    return None
