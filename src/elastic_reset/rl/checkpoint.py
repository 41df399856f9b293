"""Training checkpoints: one ``torch.save`` file per saved step, written atomically, and a ``latest`` pointer.

``checkpoints/step_0000040.pt`` is complete before ``checkpoints/latest`` names it (both through
:mod:`elastic_reset.io`), so a crash at any moment leaves a loadable checkpoint. If the pointer or the newest file
is damaged anyway (a disk fault, a hand edit), :func:`load_latest` falls back to the newest file that loads and
says so; it never pretends a run has no checkpoint when it has files.

A checkpoint is loaded with ``weights_only=True``: tensors and plain data only, never arbitrary pickled objects, so
a file planted in a run directory cannot run code on ``--resume`` or ``compare``. Only regular files are read as
checkpoints (a FIFO named like one would block forever).
"""

from __future__ import annotations

import errno
import os
import re
import warnings
from pathlib import Path
from typing import Any

import torch

from elastic_reset.errors import RunRecoveryWarning
from elastic_reset.io import (RunFileError, atomic_write, load_failure, not_regular, open_regular, read_pointer,
                              write_pointer)

_NAME = re.compile(r"^step_(\d+)\.pt$")


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def checkpoint_step(path: Path) -> int:
    match = _NAME.match(Path(path).name)
    if match is None:
        raise RunFileError(f"{path}: not a checkpoint file name (expected step_NNNNNNN.pt)")
    return int(match.group(1))


def _scan(run_dir: Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    """(the regular checkpoint files, oldest first; the other entries named like one, with what they are)."""
    folder = checkpoint_dir(run_dir)
    if not folder.is_dir():
        return [], []
    files, others = [], []
    for path in sorted((p for p in folder.iterdir() if _NAME.match(p.name)), key=checkpoint_step):
        try:
            kind = not_regular(path)
        except FileNotFoundError:  # removed since the listing (an old checkpoint pruned by a save)
            continue
        if kind is None:
            files.append(path)
        else:
            others.append((path, kind))
    return files, others


def _warn_not_regular(others: list[tuple[Path, str]]) -> None:
    for path, kind in others:
        warnings.warn(f"{path}: {kind}, not a regular file: not read as a checkpoint, left alone",
                      RunRecoveryWarning, stacklevel=3)


def list_checkpoints(run_dir: Path) -> list[Path]:
    """The run's checkpoint files, oldest first: regular files (or links to one) only. Anything else named like a
    checkpoint (a FIFO, a directory, a link to a device) is never opened; a warning names it."""
    files, others = _scan(run_dir)
    _warn_not_regular(others)
    return files


def _write_failure(err: BaseException) -> str:
    """The OS's reason a write failed, in one line: the first OSError of the exception chain, else the message."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno:
            return f"[Errno {seen.errno}] {os.strerror(seen.errno)}"
        seen = seen.__cause__ or seen.__context__
    return " ".join(str(err).split())[:200] or type(err).__name__


def save_checkpoint(run_dir: Path, step: int, state: dict[str, Any], keep: int = 2) -> Path:
    folder = checkpoint_dir(run_dir)
    path = folder / f"step_{step:07d}.pt"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda f: torch.save(state, f))  # a failed write removes its temporary file
        write_pointer(folder, path.name)
    except (OSError, RuntimeError) as err:  # torch.save can report a failed write as a RuntimeError
        reason = _write_failure(err)
        full = os.strerror(errno.ENOSPC) in reason
        raise RunFileError(f"{path}: the checkpoint could not be written ({reason}); "
                           + ("free space on that disk, then " if full else "")
                           + "continue the run with --resume from its last checkpoint") from err
    for old in list_checkpoints(run_dir)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def _read(path: Path) -> Any:
    with open_regular(path) as f:
        # Tensors and plain data only: unpickling anything else could run code planted in the file.
        return torch.load(f, map_location="cpu", weights_only=True)


def _is_state_of(state: Any, path: Path) -> bool:
    """Whether ``state`` is this project's checkpoint of the step ``path``'s name says."""
    return isinstance(state, dict) and state.get("step") == checkpoint_step(path)


def read_state(path: Path) -> dict[str, Any]:
    """The state of one checkpoint file (a step chosen by name, not the latest): tensors and plain data only; a
    file that does not load, or is not this project's checkpoint of its step, is a :class:`RunFileError`."""
    try:
        state = _read(path)
    except Exception as err:  # a torn or foreign file: any unpickling error
        raise RunFileError(f"{path}: does not load ({load_failure(err)[1]})") from None
    if not _is_state_of(state, path):
        raise RunFileError(f"{path}: not this project's checkpoint of step {checkpoint_step(path)}")
    return state


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
    which, instead of letting the run start over from step 0. Entries named like a checkpoint that are not regular
    files are never opened; they count as checkpoints that do not load."""
    files, others = _scan(run_dir)
    _warn_not_regular(others)
    if not files and not others:
        return None
    failures = [f"{path.name} ({kind})" for path, kind in others]
    pointed = read_pointer(checkpoint_dir(run_dir))
    order = sorted(files, key=lambda p: (p.name == pointed, checkpoint_step(p)), reverse=True)
    if pointed is None and order:  # a save killed between its file and the pointer leaves the pointer behind: fine
        warnings.warn(f"{checkpoint_dir(run_dir) / 'latest'}: missing or naming no checkpoint file; using the "
                      f"newest, {order[0].name}", RunRecoveryWarning, stacklevel=2)
    for path in order:
        try:
            state = _read(path)
        except Exception as err:  # a torn or foreign file: any unpickling error
            short, why = load_failure(err)
            failures.append(f"{path.name} ({short})")
            warnings.warn(f"{path}: does not load ({why}); trying an older checkpoint", RunRecoveryWarning,
                          stacklevel=2)
            continue
        if not _is_state_of(state, path):
            failures.append(f"{path.name} (not this project's checkpoint of step {checkpoint_step(path)})")
            continue
        return path, state
    raise RunFileError(f"{checkpoint_dir(run_dir)}: no checkpoint loads ({', '.join(failures)}); the run cannot be "
                       "continued. Start it again in a new --out directory.")
