"""The files a run must never lose: atomic writes, the metrics log, and the pointer to the latest checkpoint.

Every file the project writes for later (checkpoints, ``metrics.jsonl`` rewrites, markers, figures, model
folders) goes through :func:`atomic_write` or :func:`save_folder_atomically`: the bytes go to a temporary sibling,
are fsynced, and are renamed over the target (``os.replace`` is atomic on POSIX). A crash at any moment, SIGKILL
included, leaves either the old file or the new one, never a torn one; what it can leave is a temporary sibling,
which :func:`remove_stale_temps` deletes on the next start. The module needs nothing but the standard library,
so every layer of the package may use it (it imports only :mod:`elastic_reset.errors`).
"""

from __future__ import annotations

import fcntl
import json
import os
import pickle
import re
import shutil
import stat
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from elastic_reset.errors import DirectoryInUseError, RunFileError, RunRecoveryWarning, TornRecordWarning

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


# -------------------------------------------------------------------------------------------- regular files
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISLNK, "a symbolic link"))


def _kind(mode: int) -> str | None:
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def not_regular(path: str | Path) -> str | None:
    """What ``path`` is when it is not a regular file (``"a FIFO"``, ``"a symbolic link to a character device"``,
    ...); None for a regular file or a symbolic link to one. Raises FileNotFoundError when nothing is there."""
    kind = _kind(os.lstat(path).st_mode)
    if kind != "a symbolic link":
        return kind
    try:
        target = _kind(os.stat(path).st_mode)
    except OSError:
        return "a broken symbolic link"
    return None if target is None else f"a symbolic link to {target}"


def open_regular(path: str | Path) -> BinaryIO:
    """``path`` opened for binary reading if it is a regular file; else :class:`RunFileError` naming what it is.
    Reading a FIFO (or a device) named like a run's file would block forever or never end, so it is never read."""
    kind = not_regular(path)
    if kind is None:
        # Non-blocking, and checked again on the open file: something swapped in since the check cannot hang us.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        try:
            kind = _kind(os.fstat(fd).st_mode)
            if kind is None:
                os.set_blocking(fd, True)
                return os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    raise RunFileError(f"{path}: expected a regular file, found {kind}; move it out of the way")


# -------------------------------------------------------------------------------------------- metrics.jsonl
def load_failure(err: Exception) -> tuple[str, str]:
    """(a short reason, a one-line reason) of a ``torch.load(..., weights_only=True)`` that failed: a file holding a
    pickled object is named as that (refused, never run), not with torch's advice to allow-list it."""
    text = " ".join(str(err).split())
    if isinstance(err, pickle.UnpicklingError) and text.startswith("Weights only load failed"):
        found = re.search(r"GLOBAL ([\w.]+)", text)
        if found:
            return (f"refused: it holds a pickled {found.group(1)}",
                    f"it holds a pickled object ({found.group(1)}), not only tensors and plain data; refused "
                    "without running it")
        return "not a checkpoint", "not a file torch.save wrote, or a damaged one"
    return type(err).__name__, text[:200]


def read_metrics(path: str | Path, warn_torn: bool = False) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl``. A torn *last* line is what a crash (or a run still being written)
    leaves, and is skipped (``warn_torn``: with a :class:`TornRecordWarning` naming file and line, for a reader
    that reports the run); a bad line anywhere else means the file was damaged, and raises naming the line."""
    path = Path(path)

    def torn(i: int) -> None:
        if warn_torn:
            warnings.warn(f"{path}:{i}: the last line is not a whole JSON record (a run still writing it, or one "
                          "stopped mid-line); it is left out", TornRecordWarning, stacklevel=3)

    with open_regular(path) as f:
        lines = f.read().splitlines()
    records = []
    for i, raw in enumerate(lines, start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            if i == len(lines):
                torn(i)
                break
            raise RunFileError(f"{path}:{i}: not UTF-8 text (the file is damaged; restore it from a copy, or "
                               "start the run again in a new directory)") from None
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            if i == len(lines):
                torn(i)
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
        with open_regular(pointer) as f:
            name = f.read().decode("utf-8").strip()
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    except RunFileError as err:  # a FIFO or a directory named latest: never read, and said so
        warnings.warn(f"{err}; ignoring it", RunRecoveryWarning, stacklevel=2)
        return None
    if not name or "/" in name or "\0" in name:
        return None
    try:
        return name if not_regular(pointer.parent / name) is None else None
    except OSError:
        return None


# ------------------------------------------------------------------------------------------- directory locks
LOCK = ".lock"


class DirectoryLock:
    """An exclusive lock on a run or grid directory: ``DIR/.lock``, held with ``flock`` and naming its holder's PID.

    A second writer (another process, or a second trainer in this one) is refused with
    :class:`DirectoryInUseError` naming the holder. The kernel drops a ``flock`` when its holder dies, however it
    dies, so a lock file left by a killed process is taken over, with a warning naming that process.
    """

    def __init__(self, folder: str | Path, what: str = "run"):
        self.folder = Path(folder)
        self.path = self.folder / LOCK
        self.what = what
        self._fd: int | None = None

    def acquire(self) -> None:
        while self._fd is None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_pid(fd)
                os.close(fd)
                raise DirectoryInUseError(
                    f"{self.folder}: in use by another {self.what} (process {holder or 'unknown'}, lock file "
                    f"{self.path}); wait for it to finish, or stop it first") from None
            # The holder we waited on may have removed the file as it released it: lock the file at the path.
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            stale = _read_pid(fd)
            if stale is not None and stale != os.getpid():
                warnings.warn(f"{self.path}: process {stale} was killed while it held this {self.what}; taking "
                              "its lock over", RunRecoveryWarning, stacklevel=3)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            self._fd = fd

    def release(self) -> None:
        """Remove the lock file and drop the lock (idempotent)."""
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)
        os.close(self._fd)  # closing drops the flock
        self._fd = None

    def __enter__(self) -> "DirectoryLock":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None
