"""``elastic-reset compare``: train a grid of methods × seeds from one config, then report on it.

Each cell is an ordinary run directory, ``GRID_DIR/<label>/seed<i>/``, trained with ``--set method.name=<method>
--set seed=<i>`` on top of the user's overrides; the label is the method's name, or the name given to a variant
(``--methods er_paper=elastic_reset``), and is also written to the cell's ``label`` file. The grid is *resumable*:
it can be killed at any moment and started again with the same command (in another session, days later), and it
continues where it stopped:

- a cell with a ``done`` marker (written atomically after ``train()`` returns) is skipped, and so is a cell whose
  latest checkpoint is already at ``steps`` (killed between its last checkpoint and its marker);
- a cell with a ``config.yaml`` but no marker was cut short: it is continued with ``resume=True``, from its latest
  checkpoint (the trainer drops the metrics written after it);
- any other cell is trained from scratch.

Raising ``steps`` and re-running continues every finished cell to the new length (the trainer allows ``steps``,
and only ``steps``, to change on resume). At the end, and at every re-run, the report is rewritten:
``summary.json`` (final evaluation mean ± SE per method, frontiers, dominance, the command), ``pareto.png`` and
``pareto_curves.png``.

``--jobs N`` trains N cells at once, each an ``elastic-reset train`` child process with the CPU cores shared out
(its output in ``<run>/train.log``); the cells, their markers and the report are the same as one after the other.
On a GPU the N cells share it: each method's peak memory is measured first by a one-iteration probe, and a grid
whose N cells would not fit in the free memory is refused before any cell trains (:func:`check_gpu_room`).

``--prune-finished`` deletes a finished cell's checkpoints (its config, metrics, done marker and ``final/`` policy
stay): a grid of a 135M model otherwise keeps ~5 GB per cell (two checkpoints of weights, optimizer and EMA). A
pruned cell cannot be continued to more ``steps``; the grid says so rather than train it again from scratch.

This module drives the RL engine from the outside; the engine and the algorithm core never import it.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from elastic_reset.errors import GridError
from elastic_reset.evaluation.figures import report
from elastic_reset.evaluation.runs import LABEL_FILE, drift_metric, group_runs, load_run, score_label
from elastic_reset.evaluation.summary import to_jsonable
from elastic_reset.io import DirectoryLock, atomic_write_text
from elastic_reset.lm.device import resolve_device
from elastic_reset.rl.checkpoint import latest_step
from elastic_reset.rl.config import METHODS, ConfigError, TrainConfig, check_same_run
from elastic_reset.rl.distributed import is_main_process
from elastic_reset.rl.from_trl import load_run_config

DONE = "done"
"""Name of the marker file of a finished cell (JSON: the steps it finished at, and when)."""

# Keys the grid sets itself: a user override of them would silently relabel runs.
_GRID_KEYS = {"seed": "--seeds", "method.name": "--methods"}


@dataclass(frozen=True)
class GridConfig:
    """The file a grid's cells are built from: a YAML config of this engine's, or a TRL command-line recipe
    (``trl``: ``grpo`` or ``rloo``, :func:`~elastic_reset.rl.from_trl.load_run_config`)."""

    path: Path
    trl: str | None = None
    dataset: str | None = None
    """A recipe's ``dataset_name`` replaced (``--prompts`` with ``--trl``), its rewards kept."""

    def load(self, overrides: list[str]) -> TrainConfig:
        return load_run_config(self.path, self.trl, overrides, self.dataset)

    def train_command(self) -> list[str]:
        """``elastic-reset train`` on this file, as a child process runs it (``--out`` and ``--set`` to add)."""
        return [sys.executable, "-m", "elastic_reset.cli", "train", str(self.path),
                *(["--trl", self.trl] if self.trl else []),
                *(["--prompts", self.dataset] if self.dataset is not None else [])]


ConfigPath = str | Path | GridConfig
"""A grid's config: a YAML file's path, or a :class:`GridConfig`."""


def _grid_config(config: ConfigPath) -> GridConfig:
    return config if isinstance(config, GridConfig) else GridConfig(Path(config))


@dataclass
class Cell:
    """One run of the grid."""

    method: str
    """The cell's label: its method's name, or the name given to a variant (``LABEL=METHOD`` in ``--methods``)."""
    seed: int
    run_dir: Path
    overrides: list[str]
    """Exactly the ``--set`` list this run is built from (global, then per-method, then the grid's own)."""
    config: TrainConfig


_LABEL = re.compile(r"[A-Za-z0-9_.-]+")
_REPORT_FILES = ("summary.json", "pareto.png", "pareto_curves.png")


def parse_methods(text: str) -> dict[str, str]:
    """``--methods`` into ``{label: method}``, in order. An entry is a method (its own label) or ``LABEL=METHOD``,
    which runs a second variant of a method under its own name, e.g. ``kl,elastic_reset,er_paper=elastic_reset``
    with ``--method-set er_paper:method.ema_update=step``. The label names the runs' folder and the figures' legend."""
    methods: dict[str, str] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        label, sep, method = (part.strip() for part in entry.partition("="))
        if not sep:
            method = label
        if method not in METHODS:
            raise ConfigError(f"--methods: unknown method {method!r} in {entry!r} (known: {', '.join(METHODS)})")
        if not _LABEL.fullmatch(label) or label.startswith(".") or label in _REPORT_FILES:
            raise ConfigError(f"--methods: label {label!r} in {entry!r} must be letters, digits, '_', '.' or '-', "
                              f"not start with '.', and not be one of the report's files ({', '.join(_REPORT_FILES)})")
        if label.lower() in {m.lower() for m in methods}:
            raise ConfigError(f"--methods: {label!r} is listed twice, perhaps in another case (name a second "
                              "variant LABEL=METHOD)")
        methods[label] = method
    if not methods:
        raise ConfigError("--methods: expected a comma-separated list, e.g. kl,elastic_reset")
    return methods


def _as_labels(methods: list[str] | dict[str, str]) -> dict[str, str]:
    return dict(methods) if isinstance(methods, dict) else {m: m for m in methods}


def parse_method_overrides(items: list[str], methods: list[str] | dict[str, str]) -> dict[str, list[str]]:
    """``LABEL:KEY=VALUE`` items (``--method-set elastic_reset:kl.coef=0.001``) into per-label ``--set`` lists."""
    out: dict[str, list[str]] = {m: [] for m in methods}
    for item in items:
        method, sep, override = item.partition(":")
        if not sep or "=" not in override:
            raise ConfigError(f"--method-set {item!r}: expected LABEL:KEY=VALUE, e.g. elastic_reset:kl.coef=0.001")
        if method not in out:
            raise ConfigError(f"--method-set {item!r}: {method!r} is not one of --methods ({', '.join(methods)})")
        out[method].append(override)
    return out


def _check_not_grid_keys(overrides: list[str], flag: str) -> None:
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if key in _GRID_KEYS:
            raise ConfigError(f"{key}: set by the grid ({_GRID_KEYS[key]}); remove {flag} {item!r}")


def plan_grid(config_path: ConfigPath, out_dir: str | Path, methods: list[str] | dict[str, str], seeds: int,
              overrides: list[str] = (), method_overrides: dict[str, list[str]] | None = None) -> list[Cell]:
    """Every cell's config, built and validated before anything trains: a typo fails now, not hours in.
    ``methods``: method names, or ``{label: method}`` (:func:`parse_methods`); a cell is named by its label."""
    if seeds < 1:
        raise ConfigError(f"--seeds: expected >= 1, got {seeds}")
    method_overrides = method_overrides or {}
    overrides = list(overrides)
    _check_not_grid_keys(overrides, "--set")
    for items in method_overrides.values():
        _check_not_grid_keys(items, "--method-set")
    cells = []
    for label, method in _as_labels(methods).items():
        for seed in range(seeds):
            cell_overrides = [*overrides, *method_overrides.get(label, []), f"method.name={method}",
                              f"seed={seed}"]
            config = _grid_config(config_path).load(cell_overrides)
            if config.eval.every < 1:
                raise ConfigError("eval.every: compare needs evaluation records to report on; expected >= 1")
            cells.append(Cell(label, seed, Path(out_dir) / label / f"seed{seed}", cell_overrides, config))
    return cells


def cell_status(cell: Cell) -> str:
    """``done`` (nothing to train), ``partial`` (continue with resume=True) or ``new``. A cell trained from another
    config (a changed ``--method-set``, a label given to another method) is refused, naming the key: its results
    would otherwise be reported under the new command."""
    if (cell.run_dir / "config.yaml").is_file():
        check_same_run(cell.run_dir / "config.yaml", cell.config)
    marker = cell.run_dir / DONE
    if marker.is_file():
        try:
            info = json.loads(marker.read_text())
            finished_at = int(info["steps"])
        except (ValueError, KeyError, TypeError):
            info, finished_at = {}, -1  # an unreadable marker proves nothing; the checkpoint decides below
        if finished_at >= cell.config.steps:
            return "done"
        if info.get("pruned") and not (cell.run_dir / "checkpoints").exists():
            raise GridError(f"{cell.run_dir}: finished at step {finished_at} and its checkpoints were pruned "
                            f"(--prune-finished), so it cannot be continued to step {cell.config.steps}; delete "
                            "the cell to train it again from the start")
    if not (cell.run_dir / "config.yaml").is_file():
        return "new"
    step = latest_step(cell.run_dir)
    if step is not None and step >= cell.config.steps:
        return "done"
    return "partial"


def write_label(cell: Cell) -> None:
    """``<run>/label``: the cell's label, so that ``elastic-reset pareto GRID`` groups a named variant under its
    own name rather than its method's (:func:`elastic_reset.evaluation.runs.load_run` reads it)."""
    cell.run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(cell.run_dir / LABEL_FILE, cell.method + "\n")


def _write_done(cell: Cell) -> None:
    payload = json.dumps({"steps": cell.config.steps, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    atomic_write_text(cell.run_dir / DONE, payload)


def prune_finished(cell: Cell) -> bool:
    """Delete a finished cell's checkpoints, marking its done file ``pruned``; True when there were any."""
    checkpoints = cell.run_dir / "checkpoints"
    if cell_status(cell) != "done" or not checkpoints.exists():
        return False
    marker = json.loads((cell.run_dir / DONE).read_text())
    atomic_write_text(cell.run_dir / DONE, json.dumps({**marker, "pruned": True}))  # first: never unmarked and gone
    shutil.rmtree(checkpoints)
    return True


def _start_cell(cell: Cell, main: bool = True) -> str:
    """The cell's :func:`cell_status`, after what every start does on the main process: the label written (every
    cell, finished ones too: grids from before label files get theirs here) and a finished cell's done marker."""
    status = cell_status(cell)
    if main:
        write_label(cell)
        if status == "done" and not (cell.run_dir / DONE).is_file():
            _write_done(cell)
    return status


def train_cell(cell: Cell, log: Callable[[str], None] = print) -> str:
    """Bring one cell to ``steps``; returns what was done: ``skipped``, ``resumed`` or ``trained``."""
    from elastic_reset.rl.trainer import RLTrainer

    main = is_main_process()  # under `accelerate launch` every rank trains the cell; rank 0 writes its files
    status = _start_cell(cell, main)
    if status == "done":
        return "skipped"
    resume = status == "partial"
    step = latest_step(cell.run_dir) if resume else None
    log(f"compare: {cell.method} seed {cell.seed}: "
        + (f"resuming from step {step or 0}" if resume else "training") + f" to step {cell.config.steps} "
        f"({cell.run_dir})")
    trainer = RLTrainer(cell.config, cell.run_dir, resume=resume)  # a refusal here says what to change instead
    try:
        trainer.train()
    except BaseException:
        log(f"compare: {cell.method} seed {cell.seed} stopped ({cell.run_dir}); run the same command again "
            "to continue the grid")
        raise
    if main:
        _write_done(cell)
    # A big model's weights, optimizer state and EMA are freed before the next cell builds its own.
    del trainer
    gc.collect()
    return "resumed" if resume else "trained"


def cpu_count() -> int:
    """The cores this process may use (a container's limit, not the host's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def train_cell_process(cell: Cell, config_path: ConfigPath, threads: int, log: Callable[[str], None] = print) -> str:
    """:func:`train_cell` in a child process (``elastic-reset train``), its output appended to ``<run>/train.log``;
    ``threads``: its torch threads when the config leaves them to torch (``OMP_NUM_THREADS``). Raises
    :class:`GridError` naming the log when the child fails."""
    status = _start_cell(cell)
    if status == "done":
        return "skipped"
    resume = status == "partial"
    argv = [*_grid_config(config_path).train_command(), "--out", str(cell.run_dir)]
    for item in [*cell.overrides, "progress=false"]:  # progress is a resumable setting: the cell stays the same
        argv += ["--set", item]
    argv += ["--resume"] if resume else []
    log(f"compare: {cell.method} seed {cell.seed}: " + ("resuming" if resume else "training")
        + f" in a child process (log: {cell.run_dir / 'train.log'})")
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    with open(cell.run_dir / "train.log", "a") as out:
        code = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    if code != 0:
        raise GridError(f"{cell.method} seed {cell.seed} failed (exit code {code}); see {cell.run_dir / 'train.log'}")
    _write_done(cell)
    return "resumed" if resume else "trained"


GPU_CONTEXT_GIB = 0.5
"""What a process's CUDA context holds on the GPU besides its tensors (not in PyTorch's own peak)."""


def probe_gpu_peak_gib(cell: Cell, config_path: ConfigPath) -> float:
    """The GPU memory a run of ``cell``'s config peaks at, measured: one iteration (with its step-0 evaluation) in
    a child process, in a temporary directory, read back from ``memory/gpu_peak_gib``."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="gpu-probe-") as tmp:
        argv = [*_grid_config(config_path).train_command(), "--out", f"{tmp}/run"]
        for item in [*cell.overrides, "steps=1", "checkpoint_every=0", "progress=false"]:
            argv += ["--set", item]
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise GridError(f"{cell.method}: the one-iteration GPU memory probe failed (exit code "
                            f"{done.returncode}): {last}")
        peaks = [r["memory/gpu_peak_gib"] for r in map(json.loads, Path(f"{tmp}/run/metrics.jsonl").open())
                 if "memory/gpu_peak_gib" in r]
    if not peaks:
        raise GridError(f"{cell.method}: the GPU memory probe recorded no memory/gpu_peak_gib (did it run on CUDA?)")
    return max(peaks)


def check_gpu_room(pending: list[Cell], config_path: ConfigPath, jobs: int,
                   log: Callable[[str], None] = print) -> None:
    """Before ``jobs`` of the ``pending`` cells (those not finished) share one GPU: each label's peak is measured by
    :func:`probe_gpu_peak_gib` (the largest stands for all), and ``jobs`` of them, a CUDA context each, must fit in
    the GPU's free memory. Refused otherwise, naming how many fit. Nothing to check off CUDA or for a single job."""
    devices = {str(resolve_device(cell.config.model.device)) for cell in pending}
    at_once = min(jobs, len(pending))
    if at_once < 2 or not any(d.startswith("cuda") for d in devices):
        return
    if len(devices) > 1:
        raise ConfigError(f"--jobs {jobs}: the cells run on several devices ({', '.join(sorted(devices))}); "
                          "compare shares one GPU among its cells: set model.device once for the grid")
    first_of = {cell.method: cell for cell in reversed(pending)}
    with ThreadPoolExecutor(len(first_of)) as pool:  # each probe is a child process: side by side, not in turn
        peak = max(pool.map(lambda cell: probe_gpu_peak_gib(cell, config_path), first_of.values()))
    free, total = (b / 2**30 for b in torch.cuda.mem_get_info(torch.device(devices.pop())))
    need = at_once * (peak + GPU_CONTEXT_GIB)
    fit = int(free // (peak + GPU_CONTEXT_GIB))
    log(f"compare: one cell peaks at {peak:.2f} GiB on the GPU (a one-iteration probe per method); {at_once} at "
        f"once need {need:.1f} GiB with their CUDA contexts, {free:.1f} of {total:.1f} GiB are free")
    if need > free:
        raise ConfigError(f"--jobs {jobs}: {at_once} cells at once need {need:.1f} GiB of GPU memory ({peak:.2f} "
                          f"GiB each, measured, + {GPU_CONTEXT_GIB} GiB of CUDA context), but {free:.1f} GiB are "
                          f"free: at most {fit} fit (--jobs {max(fit, 1)})")


def grid_report(out_dir: str | Path, cells: list[Cell], drift: str | None = None,
                extra: dict[str, Any] | None = None, score: str | None = None) -> dict[str, Any]:
    """Write summary.json, pareto.png and pareto_curves.png for the cells' runs; returns the summary. ``drift``
    and ``score`` default to the task's own (:func:`~elastic_reset.evaluation.runs.task_metrics`)."""
    out_dir = Path(out_dir)
    runs = [load_run(cell.run_dir, method=cell.method, drift=drift, score=score) for cell in cells]
    groups = group_runs(runs)
    summary, rows = report(groups, out_dir / "pareto.png")
    # Paths relative to the grid, so that the grid directory can be moved or shared as a whole.
    for entry in summary["methods"].values():
        entry["runs"] = [os.path.relpath(p, out_dir) for p in entry["runs"]]
    summary = {**summary, "dominance": rows, **(extra or {})}
    payload = json.dumps(to_jsonable(summary), indent=2) + "\n"
    atomic_write_text(out_dir / "summary.json", payload)
    return summary


def run_grid(config_path: ConfigPath, out_dir: str | Path, methods: list[str] | dict[str, str], seeds: int,
             overrides: list[str] = (), method_overrides: dict[str, list[str]] | None = None,
             drift: str | None = None, command: list[str] | None = None,
             log: Callable[[str], None] = print, score: str | None = None, jobs: int = 1,
             prune: bool = False) -> dict[str, Any] | None:
    """Train every cell that is not finished, then write the report (see module docs).

    ``jobs`` = 1: one cell after the other, in this process. ``jobs`` > 1: that many cells at once, each in its own
    process (:func:`train_cell_process`) with the cores shared out (a GPU is shared by all); a failed cell stops
    nothing else, and the grid then raises :class:`GridError` naming every failed cell. ``command`` is the command
    line recorded in summary.json (argv list). Under ``accelerate launch`` every process trains each cell as one
    rank of it, and rank 0 alone writes the report (the others return None). ``prune``: each finished cell's
    checkpoints are deleted once it is done (:func:`prune_finished`), cells finished earlier included.
    """
    if jobs < 1:
        raise ConfigError(f"--jobs: expected >= 1, got {jobs}")
    if jobs > 1 and not is_main_process():
        raise ConfigError("--jobs: runs cells side by side in one process; under accelerate launch use --jobs 1")
    if not is_main_process():
        log = lambda message: None  # noqa: E731  one progress log, rank 0's
    if drift is not None:  # an unknown drift or score fails before hours of training, not after
        drift_metric(drift)
    if score is not None:
        score_label(score)
    out_dir, source = Path(out_dir), _grid_config(config_path)
    cells = plan_grid(source, out_dir, methods, seeds, overrides, method_overrides)
    out_dir.mkdir(parents=True, exist_ok=True)
    # One grid process at a time (each cell's run directory is locked by its trainer too); rank 0 holds it.
    with DirectoryLock(out_dir, "compare grid") if is_main_process() else contextlib.nullcontext():
        # A cell trained from another config is refused now, before any other cell trains.
        pending = [cell for cell in cells if cell_status(cell) != "done"]
        if jobs > 1:
            check_gpu_room(pending, source, jobs, log)
        threads = max(1, cpu_count() // jobs)

        def one(i: int, cell: Cell) -> dict[str, Any]:
            start = time.perf_counter()
            action = train_cell(cell, log) if jobs == 1 else train_cell_process(cell, source, threads, log)
            wall = round(time.perf_counter() - start, 1)
            if prune and is_main_process() and prune_finished(cell):
                log(f"compare: {cell.method} seed {cell.seed}: checkpoints pruned ({cell.run_dir / 'checkpoints'})")
            if action == "skipped":
                log(f"compare: [{i}/{len(cells)}] {cell.method} seed {cell.seed}: finished earlier, skipped")
            else:
                log(f"compare: [{i}/{len(cells)}] {cell.method} seed {cell.seed}: {action} in {wall:.0f} s")
            return {"method": cell.method, "seed": cell.seed, "dir": os.path.relpath(cell.run_dir, out_dir),
                    "action": action, "wall_s": wall, "overrides": cell.overrides}

        if jobs == 1:
            actions = [one(i, cell) for i, cell in enumerate(cells, 1)]
        else:
            with ThreadPoolExecutor(jobs) as pool:
                futures = [pool.submit(one, i, cell) for i, cell in enumerate(cells, 1)]
            failed = [str(f.exception()) for f in futures if f.exception() is not None]
            if failed:
                raise GridError(f"{len(failed)} of {len(cells)} cells failed: " + "; ".join(failed)
                                + "; run the same command again to continue the grid")
            actions = [f.result() for f in futures]
        extra = {
            "command": shlex.join(command) if command else None,
            "argv": list(command) if command else None,
            "grid": {"config": str(source.path), **({"trl": source.trl} if source.trl else {}),
                     **({"dataset": source.dataset} if source.dataset is not None else {}),
                     "methods": _as_labels(methods), "seeds": seeds,
                     "overrides": list(overrides), "method_overrides": method_overrides or {}},
            "runs": actions,
        }
        return grid_report(out_dir, cells, drift, extra, score) if is_main_process() else None
