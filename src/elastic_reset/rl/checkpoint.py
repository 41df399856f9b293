"""Training checkpoints: one ``torch.save`` file per saved step, written atomically, and a ``latest`` pointer.

``checkpoints/step_0000040.pt`` is complete before ``checkpoints/latest`` names it (both through
:mod:`elastic_reset.io`), so a crash at any moment leaves a loadable checkpoint. If the pointer or the newest file
is damaged anyway (a disk fault, a hand edit), :func:`load_latest` falls back to the newest file that loads and
says so; it never pretends a run has no checkpoint when it has files.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import torch

from elastic_reset.errors import RunRecoveryWarning
from elastic_reset.io import RunFileError, atomic_write, read_pointer, write_pointer

_NAME = re.compile(r"^step_(\d+)\.pt$")


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def checkpoint_step(path: Path) -> int:
    match = _NAME.match(Path(path).name)
    if match is None:
        raise RunFileError(f"{path}: not a checkpoint file name (expected step_NNNNNNN.pt)")
    return int(match.group(1))


def list_checkpoints(run_dir: Path) -> list[Path]:
    """The run's checkpoint files, oldest first."""
    folder = checkpoint_dir(run_dir)
    if not folder.is_dir():
        return []
    return sorted((p for p in folder.iterdir() if _NAME.match(p.name)), key=checkpoint_step)


def save_checkpoint(run_dir: Path, step: int, state: dict[str, Any], keep: int = 2) -> Path:
    folder = checkpoint_dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step_{step:07d}.pt"
    atomic_write(path, lambda f: torch.save(state, f))
    write_pointer(folder, path.name)
    for old in list_checkpoints(run_dir)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def latest_step(run_dir: Path) -> int | None:
    """The step a resume would start from, without loading a checkpoint (a big model's takes seconds): the one
    ``latest`` points to, else the newest file (as :func:`load_latest` does); None when there is no checkpoint."""
    name = read_pointer(checkpoint_dir(run_dir))
    if name is not None:
        return checkpoint_step(Path(name))
    files = list_checkpoints(run_dir)
    return checkpoint_step(files[-1]) if files else None


def load_latest(run_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that loads, and its state; None when the run has no checkpoint file at all.

    The pointer's file is tried first. A missing or dangling pointer, or a file that does not load, is reported
    with a warning and the next older file is tried; if files exist and none loads, :class:`RunFileError` says
    which, instead of letting the run start over from step 0."""
    files = list_checkpoints(run_dir)
    if not files:
        return None
    pointed = read_pointer(checkpoint_dir(run_dir))
    order = sorted(files, key=lambda p: (p.name == pointed, checkpoint_step(p)), reverse=True)
    if pointed is None:  # a save killed between its file and the pointer leaves the pointer one behind: fine
        warnings.warn(f"{checkpoint_dir(run_dir) / 'latest'}: missing or naming no checkpoint file; using the "
                      f"newest, {order[0].name}", RunRecoveryWarning, stacklevel=2)
    failures = []
    for path in order:
        try:
            state = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as err:  # a torn or foreign file: any unpickling error
            failures.append(f"{path.name} ({type(err).__name__})")
            warnings.warn(f"{path}: does not load ({err}); trying an older checkpoint", RunRecoveryWarning,
                          stacklevel=2)
            continue
        if not isinstance(state, dict) or state.get("step") != checkpoint_step(path):
            failures.append(f"{path.name} (not this project's checkpoint of step {checkpoint_step(path)})")
            continue
        return path, state
    raise RunFileError(f"{checkpoint_dir(run_dir)}: no checkpoint loads ({', '.join(failures)}); the run cannot be "
                       "continued. Start it again in a new --out directory.")
