"""The files a run must never lose: atomic writes, the metrics log, and the pointer to the latest checkpoint.

Every file the project writes for later (checkpoints, ``metrics.jsonl`` rewrites, markers, figures, model
folders) goes through :func:`atomic_write` or :func:`save_folder_atomically`: the bytes go to a temporary sibling,
are fsynced, and are renamed over the target (``os.replace`` is atomic on POSIX). A crash at any moment, SIGKILL
included, leaves either the old file or the new one, never a torn one; what it can leave is a temporary sibling,
which :func:`remove_stale_temps` deletes on the next start. The module needs nothing but the standard library,
so every layer of the package may use it (it imports only :mod:`elastic_reset.errors`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from elastic_reset.errors import RunFileError

# Every temporary name starts with "." and contains this marker, so stale ones can be found (and only they).
_TMP = ".tmp-"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | Path, write: Callable[[BinaryIO], Any]) -> None:
    """Call ``write(file)`` on a temporary sibling of ``path``, fsync, then rename it over ``path``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}{_TMP}", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def save_folder_atomically(out: Path, write: Callable[[Path], None]) -> None:
    """``write(tmp)`` into a temporary sibling folder of ``out``, then swap it in by renames: a crash never leaves
    a half-written model where a loader looks for it (at worst the old one sits in a temporary sibling)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}{_TMP}", dir=out.parent))
    old = None
    try:
        write(tmp)
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}{_TMP}old-", dir=out.parent))
            os.replace(out, old / "model")
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def remove_stale_temps(folder: str | Path) -> list[Path]:
    """Delete the temporary siblings that killed writes left in ``folder`` (not recursive); returns them.
    Call it only where no other process is writing (a run's own directory when it starts)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    stale = sorted(p for p in folder.iterdir() if p.name.startswith(".") and _TMP in p.name)
    for p in stale:
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)
    return stale


# -------------------------------------------------------------------------------------------- metrics.jsonl
def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl``. A torn *last* line is what a crash (or a run still being written)
    leaves, and is skipped; a bad line anywhere else means the file was damaged, and raises naming the line."""
    path = Path(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    records = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines):
                break
            raise RunFileError(f"{path}:{i}: not a JSON record (the file is damaged; restore it from a copy, or "
                               "start the run again in a new directory)") from None
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise RunFileError(f"{path}:{i}: expected a JSON object with an integer 'step', got {line[:80]!r}")
        records.append(record)
    return records


class MetricsLog:
    """``metrics.jsonl``: one JSON object per line, each with ``step``; appended and flushed line by line."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._file = None

    def records(self) -> list[dict[str, Any]]:
        return read_metrics(self.path) if self.path.exists() else []

    def truncate_after(self, step: int) -> int:
        """Keep only the records with ``step <= step`` (a resumed run writes the later ones again); returns how
        many were dropped. A torn last line is dropped; damage elsewhere raises (see :func:`read_metrics`)."""
        if not self.path.exists():
            return 0
        records = read_metrics(self.path)
        kept = [r for r in records if r["step"] <= step]
        atomic_write_text(self.path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
        return len(records) - len(kept)

    def write(self, record: dict[str, Any]) -> None:
        if self._file is None:
            self._file = open(self.path, "a", encoding="utf-8")
        self._file.write(json.dumps(record, sort_keys=True) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


# ------------------------------------------------------------------------------------- checkpoint pointers
POINTER = "latest"


def write_pointer(folder: str | Path, name: str) -> None:
    """Point ``folder/latest`` at ``name`` (a file in ``folder``), atomically."""
    atomic_write_text(Path(folder) / POINTER, name)


def read_pointer(folder: str | Path) -> str | None:
    """The file name ``folder/latest`` points to, if the pointer exists and the file it names does; else None."""
    pointer = Path(folder) / POINTER
    try:
        name = pointer.read_text(encoding="utf-8").strip()
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    if not name or "/" in name or not (pointer.parent / name).is_file():
        return None
    return name
