"""Atomic checkpoints and the metrics log: a crash at any moment (even SIGKILL) never loses or corrupts a run.

A checkpoint is one ``torch.save`` file written to a temporary name, fsynced, then renamed (``os.replace`` is
atomic on POSIX); ``latest`` is replaced the same way only after the checkpoint is complete. ``metrics.jsonl`` is
append-only; on resume, lines after the checkpoint's step are cut so the resumed run writes them again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, write) -> None:
    """Call ``write(file)`` on a temporary sibling of ``path``, fsync, then rename it over ``path``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def save_checkpoint(run_dir: Path, step: int, state: dict[str, Any], keep: int = 2) -> Path:
    ckpt_dir = Path(run_dir) / "checkpoints"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    path = ckpt_dir / f"step_{step:07d}.pt"
    atomic_write_bytes(path, lambda f: torch.save(state, f))
    atomic_write_bytes(ckpt_dir / "latest", lambda f: f.write(path.name.encode()))
    for old in sorted(ckpt_dir.glob("step_*.pt"))[:-keep]:
        old.unlink(missing_ok=True)
    return path


def latest_checkpoint(run_dir: Path) -> Path | None:
    pointer = Path(run_dir) / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    path = pointer.parent / pointer.read_text().strip()
    if not path.is_file():
        raise FileNotFoundError(f"{pointer}: points to {path.name}, which does not exist")
    return path


def load_checkpoint(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=False)


class MetricsLog:
    """``metrics.jsonl``: one JSON object per line, each with ``step``; flushed line by line."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._file = None

    def truncate_after(self, step: int) -> None:
        """Keep only the records with ``step <= step`` (and drop a torn last line from a crash)."""
        if not self.path.exists():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("step", 0) <= step:
                kept.append(line)
        atomic_write_bytes(self.path, lambda f: f.write("".join(k + "\n" for k in kept).encode()))

    def write(self, record: dict[str, Any]) -> None:
        if self._file is None:
            self._file = open(self.path, "a", encoding="utf-8")
        self._file.write(json.dumps(record, sort_keys=True) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
