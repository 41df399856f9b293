"""Experiment trackers (``report_to``, rl/tracking.py): what a run sends to TensorBoard, and the config's refusals."""

from __future__ import annotations

import pytest

from elastic_reset.rl import config as config_module
from elastic_reset.rl.config import ConfigError, config_from_dict
from elastic_reset.rl.tracking import flatten
from helpers import evals, run_config


def read_events(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return events


@pytest.mark.parametrize("setting", ["report_to=[tensorboard]", "tensorboard=true"])
def test_a_run_reports_scalars_resets_and_samples_to_tensorboard(tmp_path, setting):
    pytest.importorskip("tensorboard")
    from elastic_reset.rl.trainer import RLTrainer

    records = RLTrainer(run_config(setting), tmp_path / "run").train()
    events = read_events(tmp_path / "run" / "tensorboard")
    tags = events.Tags()

    assert [e.step for e in events.Scalars("train/reward")] == [1, 2, 3, 4]
    assert [e.step for e in events.Scalars("eval/reward")] == sorted(evals(records)) == [0, 2, 4]
    rewards = {r["step"]: r["reward"] for r in records if "reward" in r}
    assert {e.step: e.value for e in events.Scalars("train/reward")} == pytest.approx(rewards)
    assert [e.step for e in events.Scalars("train/reset/index")] == [3]
    assert [e.step for e in events.Scalars("train/reset/distance")] == [3]
    assert "eval/sample/text_summary" in tags["tensors"]  # how the reader names add_text's summaries
    sample = events.Tensors("eval/sample/text_summary")[0]
    assert sample.step == 0 and sample.tensor_proto.string_val[0].decode() == evals(records)[0]["eval/sample"]


def test_a_run_without_a_tracker_writes_no_tensorboard_folder(tmp_path):
    from elastic_reset.rl.trainer import RLTrainer

    config = run_config()
    assert config.report_to == [] and config.trackers() == []
    RLTrainer(config, tmp_path / "run").train()
    assert not (tmp_path / "run" / "tensorboard").exists()


def test_report_to_takes_a_single_name_and_folds_in_the_tensorboard_flag():
    assert config_from_dict({"report_to": "tensorboard"}).report_to == ["tensorboard"]
    assert config_from_dict({"report_to": ["none"]}).trackers() == []
    assert config_from_dict({"report_to": ["tensorboard"], "tensorboard": True}).trackers() == ["tensorboard"]


def one_line_error(data):
    with pytest.raises(ConfigError) as err:
        config_from_dict(data)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_an_unknown_tracker_is_refused_naming_report_to():
    message = one_line_error({"report_to": ["tensorbord"]})
    assert message.startswith("report_to[0]: expected one of ") and "'tensorboard'" in message


def test_none_with_a_tracker_is_refused():
    assert one_line_error({"report_to": ["none", "tensorboard"]}).startswith("report_to: ")


def test_a_tracker_whose_package_is_missing_is_refused_naming_the_package(monkeypatch):
    monkeypatch.setitem(config_module.TRACKER_PACKAGES, "wandb", ("no_such_tracker_package",))
    message = one_line_error({"report_to": ["wandb"]})
    assert message.startswith("report_to: ") and "pip install no-such-tracker-package" in message


def test_the_tracker_names_are_accelerates():
    import typing

    from accelerate.utils import LoggerType

    names = set(typing.get_args(config_module.Tracker))
    assert names - {"none"} == set(LoggerType.list())
    assert set(config_module.TRACKER_PACKAGES) == names - {"none", "all"}


def test_the_config_is_flattened_into_plain_hyperparameters():
    flat = flatten({"seed": 0, "algo": {"lr": 1e-3, "name": "ppo"}, "model": {"lora": None, "x": [1, 2]}})
    assert flat == {"seed": 0, "algo.lr": 1e-3, "algo.name": "ppo", "model.lora": None, "model.x": "[1, 2]"}


class StubTracker:
    """A tracker with scalars only (``log``); ``tables`` adds a W&B-style ``log_table``."""

    name = "stub"

    def __init__(self):
        self.logged, self.finished = [], False

    def log(self, values, step=None):
        self.logged.append((step, values))

    def finish(self):
        self.finished = True


class StubTableTracker(StubTracker):
    def log_table(self, table_name, columns=None, data=None, step=None):
        self.logged.append((step, {table_name: (columns, data)}))


def test_records_reach_each_tracker_as_scalars_reset_scalars_and_tables_where_it_has_them(tmp_path):
    from elastic_reset.rl.tracking import Trackers

    trackers = Trackers([], tmp_path, {})
    plain, tables = StubTracker(), StubTableTracker()
    trackers.trackers = [plain, tables]
    trackers.log({"step": 3, "reward": 0.5, "kl": float("nan"), "method": "elastic_reset",
                  "reset": {"index": 1, "mode": "ema", "distance": 2.5}})
    trackers.log({"step": 4, "eval/reward": 0.25, "eval/sample": "a text"})
    trackers.close()

    scalars = [(3, {"train/reward": 0.5, "train/reset/index": 1, "train/reset/distance": 2.5}),
               (4, {"eval/reward": 0.25})]  # TRL's tags: a training iteration's under train/
    assert plain.logged == scalars and plain.finished
    assert tables.logged == [*scalars, (4, {"eval/sample": (["step", "sample"], [[4, "a text"]])})]
    assert trackers.trackers == []


def test_completion_rows_reach_trackers_that_take_tables_as_one_table(tmp_path):
    from elastic_reset.rl.tracking import Trackers

    trackers = Trackers([], tmp_path, {})
    plain, tables = StubTracker(), StubTableTracker()
    trackers.trackers = [plain, tables]
    trackers.log_rows("completions", [{"step": 2, "prompt": "p", "completion": "a", "reward": 1.0},
                                      {"step": 2, "prompt": "q", "completion": "b", "reward": None}])
    assert plain.logged == []
    assert tables.logged == [(2, {"completions": (["step", "prompt", "completion", "reward"],
                                                  [[2, "p", "a", 1.0], [2, "q", "b", None]])})]


class FakeWandB(StubTracker):
    """accelerate's W&B tracker as Trackers builds one, recording its arguments."""

    name = "wandb"
    requires_logging_directory = False
    made: list = []

    def __init__(self, project, **kwargs):
        super().__init__()
        FakeWandB.made.append((project, kwargs.get("name")))

    def start(self):
        pass

    def store_init_configuration(self, values):
        pass


@pytest.mark.parametrize("env, project, run_name, expected", [
    (None, None, None, ("elastic-reset", "run")),
    ("mine", None, None, ("mine", "run")),  # WANDB_PROJECT, as a W&B user sets it
    ("mine", "theirs", "er-beta-0.1", ("theirs", "er-beta-0.1")),  # the run's own settings win
])
def test_a_wandb_run_is_filed_under_the_users_project_and_name(tmp_path, monkeypatch, env, project, run_name,
                                                                   expected):
    import accelerate.tracking

    from elastic_reset.rl.tracking import Trackers

    monkeypatch.setitem(accelerate.tracking.LOGGER_TYPE_TO_CLASS, "wandb", FakeWandB)
    monkeypatch.setattr(accelerate.tracking, "filter_trackers", lambda names, run_dir: names)
    if env is None:
        monkeypatch.delenv("WANDB_PROJECT", raising=False)
    else:
        monkeypatch.setenv("WANDB_PROJECT", env)
    FakeWandB.made = []
    Trackers(["wandb"], tmp_path / "run", {}, project=project, run_name=run_name).close()
    assert FakeWandB.made == [expected]


def test_a_continued_run_may_add_a_tracker_but_not_change_a_number(tmp_path):
    from elastic_reset.errors import ConfigError
    from elastic_reset.rl.trainer import RLTrainer

    RLTrainer(run_config(), tmp_path / "run").train()
    RLTrainer(run_config("steps=5", "report_to=[tensorboard]"), tmp_path / "run", resume=True).train()
    assert (tmp_path / "run" / "tensorboard").is_dir()
    with pytest.raises(ConfigError, match=r"^algo: differs from the run"):
        RLTrainer(run_config("steps=6", "algo.lr=0.5"), tmp_path / "run", resume=True)


def test_tags_are_trls_an_evaluations_as_they_are_an_iterations_under_train():
    from elastic_reset.rl.tracking import tag

    assert [tag(k) for k in ("reward", "rewards/letters", "time/sample", "eval/reward", "eval_ema/perplexity",
                             "eval_report/reward", "test/reward")] == [
        "train/reward", "train/rewards/letters", "train/time/sample", "eval/reward", "eval_ema/perplexity",
        "eval_report/reward", "test/reward"]
