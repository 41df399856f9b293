"""What a task gives the RL engine. A task is data plus callables; the engine never imports a concrete task."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elastic_reset.errors import ConfigError, DataFileError
from elastic_reset.rewards.learned import LearnedReward

RewardFn = Callable[[list[str], list[str]], Sequence[float]]
"""``reward_fn(prompts, completions) -> one float per completion`` (TRL's reward-function convention)."""


@dataclass
class Task:
    name: str
    """Registry name."""
    train_prompts: list[str]
    """Prompts the policy is trained on (cycled through in a seeded order)."""
    eval_prompts: list[str]
    """Validation prompts (the first ``eval.num_prompts`` are used at every evaluation, so points are comparable)."""
    reward_fn: RewardFn | LearnedReward
    """The reward the policy maximises. A :class:`~elastic_reset.rewards.learned.LearnedReward` also trains on
    every batch, and its state is checkpointed with the run."""
    reference_texts: list[str]
    """Held-out human-written text: drift is the policy's perplexity on it. May be empty only for a task whose
    drift is another metric (``drift_key``)."""
    pretrain_texts: list[str] | list[tuple[str, str]] = field(default_factory=list)
    """Supervised data for the multitask / S2P loss: text for a decoder-only policy, (source, target) pairs for an
    encoder-decoder one. Must not be the held-out reference text."""
    metrics_fn: Callable[[list[str], list[str]], dict[str, float]] | None = None
    """Extra task metrics on validation samples, ``(prompts, completions) -> {name: value}``."""
    test_prompts: list[str] = field(default_factory=list)
    """Prompts evaluated once, after the last iteration (``test/...`` metrics); none by default."""
    score_key: str = "reward"
    """The evaluation metric that is the task score in reports and Pareto figures (``eval/<score_key>``)."""
    drift_key: str = "perplexity"
    """The evaluation metric that measures drift in reports (``eval/<drift_key>``; ``perplexity`` is the
    engine's, anything else comes from ``metrics_fn``)."""
    eval_sets: dict[str, list[str]] = field(default_factory=dict)
    """Further held-out prompt sets, evaluated beside ``eval_prompts`` (their first ``eval.num_prompts`` each) as
    ``eval_<name>/...``: reward, KL to the initial model, the task's metrics and the win rate, without perplexity.
    E.g. ``forget``: prompts unlike the training prompts, where forgetting shows (paper 2 §4.3)."""
    eval_set_texts: dict[str, list[str]] = field(default_factory=dict)
    """Held-out human-written text for an eval set's own perplexity (``eval_<name>/perplexity``, on its first
    ``eval.num_texts``), disjoint from ``reference_texts``: checkpoints selected on ``eval/*`` are then reported on
    text the selection never saw. Each name must be one of ``eval_sets``."""
    judge_fn: RewardFn | None = None
    """A second scorer, ``(prompts, completions) -> floats``, for ``.../win_rate``: the share of prompts where the
    policy's completion scores higher than the initial policy's (drawn once with the evaluation's noise; ties count
    half). The gold-vs-proxy testbed's gold judges a policy trained on a proxy."""
    reference_lm: str | None = None
    """A decoder-only LM (a Hugging Face folder) sharing the policy's tokenizer, for ``kl.reference: lm``: the KL
    penalty to a language model of the output language (the Translation Game's English LM, paper §4)."""
    cut_prompts: bool = True
    """Whether cutting a prompt to its last ``model.max_prompt_tokens`` tokens is part of the task's design (IMDB's
    prompts, as RL4LMs'); False: a prompt that long is warned about before the run (the prompts task's)."""

    def __post_init__(self) -> None:
        keys = ["train_prompts", "eval_prompts"] + (["reference_texts"] if self.drift_key == "perplexity" else [])
        for key in keys:
            items = getattr(self, key)
            if not items:
                raise DataFileError(f"task {self.name!r}: {key} is empty")
            bad = [i for i, t in enumerate(items) if not isinstance(t, str) or not t.strip()]
            if bad:
                raise DataFileError(f"task {self.name!r}: {key}[{bad[0]}] is empty or not a string "
                                 f"({len(bad)} such item(s))")
        for name, prompts in self.eval_sets.items():
            if not (isinstance(name, str) and name.isidentifier()):
                raise DataFileError(f"task {self.name!r}: eval_sets name {name!r} is not an identifier")
            if not prompts or not all(isinstance(t, str) and t.strip() for t in prompts):
                raise DataFileError(f"task {self.name!r}: eval_sets[{name!r}] is empty or holds an empty prompt")
        for name, texts in self.eval_set_texts.items():
            if name not in self.eval_sets:
                raise DataFileError(f"task {self.name!r}: eval_set_texts[{name!r}] names no eval set "
                                    f"(eval_sets: {sorted(self.eval_sets)})")
            if not texts or not all(isinstance(t, str) and t.strip() for t in texts):
                raise DataFileError(f"task {self.name!r}: eval_set_texts[{name!r}] is empty or holds an empty text")


_REGISTRY: dict[str, Callable[..., Task]] = {}


def register_task(name: str):
    """Decorator: ``@register_task("imdb")`` on a factory ``(data_dir=None, **options) -> Task``."""
    def wrap(factory):
        if name in _REGISTRY and _REGISTRY[name] is not factory:
            raise ValueError(f"task {name!r} is registered twice ({_REGISTRY[name].__module__}, {factory.__module__})")
        _REGISTRY[name] = factory
        return factory
    return wrap


def load_object(spec: str, key: str) -> Any:
    """The object named ``spec``: ``package.module:name`` (imported; the working directory is searched too, as
    ``python -m`` would) or ``path/to/file.py:name`` (loaded from that file). Errors name the config ``key``;
    an exception raised while the user's module runs keeps its own traceback."""
    if not isinstance(spec, str) or ":" not in spec.strip(":"):
        raise ConfigError(f"{key}: expected module:name or path/to/file.py:name, got {spec!r}")
    where, name = spec.rsplit(":", 1)
    if where.endswith(".py") or os.sep in where or "/" in where:
        path = Path(where).expanduser()
        if not path.is_file():
            raise ConfigError(f"{key}: no such file {str(path)!r} (from {spec!r})")
        # One module per file, named by its resolved path, so loading a file twice runs it once.
        module_name = f"_elastic_reset_user_{abs(hash(str(path.resolve())))}"
        module = sys.modules.get(module_name)
        if module is None:
            loader_spec = importlib.util.spec_from_file_location(module_name, path)
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[module_name] = module
            try:
                loader_spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[module_name]
                raise
    else:
        added = os.getcwd() not in sys.path
        if added:  # a console script does not search the working directory; the user's module is usually there
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(where)
        except ModuleNotFoundError as err:
            if err.name is None or not (where == err.name or where.startswith(err.name + ".")):
                raise  # the user's module imports something missing: its own traceback says what
            raise ConfigError(f"{key}: no module named {err.name!r} (from {spec!r})") from None
        finally:
            if added:
                sys.path.remove(os.getcwd())
    if not hasattr(module, name):
        raise ConfigError(f"{key}: {where} has no attribute {name!r} (from {spec!r})")
    obj = getattr(module, name)
    if not callable(obj):
        raise ConfigError(f"{key}: {spec!r} is a {type(obj).__name__}, not a callable")
    return obj


def get_task(name: str, data_dir: str | None = None, **options: Any) -> Task:
    """Build the registered task ``name``, or the task a factory named by import path returns
    (``my_module:make_task`` or ``path/to/tasks.py:make_task``, called as ``(data_dir=None, **options)``). The
    tasks that ship with the package register themselves when :mod:`elastic_reset.tasks` is imported; a task of
    your own registers when its module is imported."""
    if name in _REGISTRY:
        factory = _REGISTRY[name]
    elif ":" in name:
        factory = load_object(name, "task.name")
    else:
        raise ConfigError(f"task.name: unknown task {name!r} (known: {', '.join(sorted(_REGISTRY))}, or "
                          "module:factory / path/to/file.py:factory)")
    try:
        inspect.signature(factory).bind(data_dir=data_dir, **options)
    except TypeError as err:
        raise ConfigError(f"task.options: {err} (task {name!r})") from None
    except ValueError:
        pass  # no signature to check (a builtin or C callable): the call itself will say
    task = factory(data_dir=data_dir, **options)
    if not isinstance(task, Task):
        raise ConfigError(f"task.name: {name!r} returned a {type(task).__name__}, not an elastic_reset.tasks.Task")
    return task
