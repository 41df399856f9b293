"""The run's experiment trackers (``report_to``): accelerate's tracker classes, opened by rank 0 only.

Each metrics record reaches them at its ``step``: its finite numbers as scalars, a reset event (the record's
``reset`` mapping) as ``reset/index`` and ``reset/distance``, an evaluation's text sample (``eval/sample``,
``eval_ema/sample``, ``test/sample``) as text where the tracker has text (TensorBoard's ``add_text``, a W&B or
ClearML table). The run's config, flattened, is each tracker's hyperparameters. TensorBoard writes into
``RUN/tensorboard``; W&B keeps its files in the run directory too.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

PROJECT = "elastic-reset"
"""The project (W&B, Comet, Trackio…) or experiment (MLflow, Aim) the runs are filed under, unless the run's
``project`` or the tracker's own variable (:data:`PROJECT_VARIABLES`) names another."""
PROJECT_VARIABLES = {"wandb": "WANDB_PROJECT", "comet_ml": "COMET_PROJECT_NAME", "mlflow": "MLFLOW_EXPERIMENT_NAME",
                     "clearml": "CLEARML_PROJECT", "swanlab": "SWANLAB_PROJECT"}
"""The environment variable each tracker's users set for its project, read as transformers' callbacks read them."""
SUBFOLDER = {"tensorboard": "tensorboard"}
"""The folder of the run directory a tracker that writes files locally writes into (none: the run directory)."""
RESET_SCALARS = ("index", "distance")
"""The numbers of a reset event that become ``reset/…`` scalars."""


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, bool | int | float | str | None]:
    """``{"algo": {"lr": 1e-5}}`` → ``{"algo.lr": 1e-5}``; a list or other value becomes its text (hyperparameters
    take only plain values)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            plain = value is None or isinstance(value, (bool, int, float, str))
            flat[f"{prefix}{key}"] = value if plain else str(value)
    return flat


def tag(key: str) -> str:
    """A ``metrics.jsonl`` key as a tracker's tag, as transformers' integrations name TRL's metrics: an evaluation's
    (``eval/...``, ``eval_ema/...``, ``test/...``) as it is, a training iteration's under ``train/``."""
    return key if key.split("/", 1)[0].startswith(("eval", "test")) else f"train/{key}"


class Trackers:
    """The trackers named by ``names`` (``TrainConfig.trackers()``) for the run in ``run_dir``; create and use it on
    rank 0 only. ``config``: the run's config as a mapping, stored as hyperparameters. ``project``: where the run is
    filed (None: the tracker's variable, else :data:`PROJECT`); ``run_name``: its name in W&B (None: the run
    directory's)."""

    def __init__(self, names: list[str], run_dir: str | Path, config: dict[str, Any], project: str | None = None,
                 run_name: str | None = None):
        from accelerate import PartialState
        from accelerate.tracking import LOGGER_TYPE_TO_CLASS, filter_trackers

        PartialState()  # accelerate's trackers log through its logger, which needs its state; a no-op once it exists
        run_dir = Path(run_dir)
        self.trackers: list[Any] = []
        try:
            for kind in filter_trackers(names, run_dir):
                name = str(kind)
                cls = LOGGER_TYPE_TO_CLASS[name]
                filed = project or os.environ.get(PROJECT_VARIABLES.get(name, "")) or PROJECT
                if cls.requires_logging_directory:
                    tracker = cls(SUBFOLDER.get(name, filed), run_dir)
                elif name == "wandb":  # named after the run, its files beside the run's rather than in the cwd
                    tracker = cls(filed, name=run_name or run_dir.name, dir=str(run_dir))
                else:
                    tracker = cls(filed)
                tracker.main_process_only = False  # the trainer already calls on rank 0 only
                tracker.start()
                self.trackers.append(tracker)
                tracker.store_init_configuration(flatten(config))
        except BaseException:
            self.close()
            raise

    def log(self, record: dict[str, Any]) -> None:
        """Send one metrics record to every tracker at its ``step``, under TRL's tags (:func:`tag`)."""
        step = record["step"]
        scalars = {tag(key): value for key, value in record.items()
                   if key != "step" and isinstance(value, (int, float)) and math.isfinite(value)}
        reset = record.get("reset")
        if isinstance(reset, dict):
            scalars.update({tag(f"reset/{key}"): reset[key] for key in RESET_SCALARS
                            if isinstance(reset.get(key), (int, float)) and math.isfinite(reset[key])})
        texts = {key: value for key, value in record.items() if key.endswith("/sample") and isinstance(value, str)}
        for tracker in self.trackers:
            if scalars:
                tracker.log(scalars, step=step)
            for key, text in texts.items():
                _log_text(tracker, key, text, step)

    def log_rows(self, name: str, rows: list[dict[str, Any]]) -> None:
        """``rows`` (dicts with the same keys, ``step`` among them) as a table ``name`` at their step, to every
        tracker that takes tables (W&B, Comet, ...; TensorBoard takes none)."""
        if not rows:
            return
        columns = list(rows[0])
        data = [[row.get(c) for c in columns] for row in rows]
        for tracker in self.trackers:
            if hasattr(tracker, "log_table"):
                tracker.log_table(table_name=name, columns=columns, data=data, step=rows[0]["step"])

    def close(self) -> None:
        """Finish every tracker (flushes TensorBoard's files, ends a W&B run). Idempotent."""
        trackers, self.trackers = self.trackers, []
        for tracker in trackers:
            tracker.finish()


def _log_text(tracker: Any, key: str, text: str, step: int) -> None:
    """``text`` under ``key`` at ``step``, where ``tracker`` has a way to show text; nothing otherwise."""
    if tracker.name == "tensorboard":
        tracker.writer.add_text(key, text, global_step=step)
    elif hasattr(tracker, "log_table"):
        tracker.log_table(table_name=key, columns=["step", "sample"], data=[[step, text]], step=step)
