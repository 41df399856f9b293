"""Bring your own task: prompts from a file or a ``datasets`` dataset, rewarded by TRL-style reward functions.

The options (``task.options`` of a run; every one but ``reward`` and one source is optional)::

    task:
      name: prompts
      options:
        path: prompts.jsonl          # .jsonl / .json (objects), .csv, anything else: one prompt per line;
                                     # a folder: a save_to_disk dataset, or one datasets.load_dataset reads
        # dataset: user/name         # instead of path: a datasets hub name or local path (split: train)
        column: prompt               # the prompt column (not for plain-text files): text, or chat messages
        reward: rewards.py:my_reward # module:function or path/to/file.py:function, a reward model's folder
                                     # (or Hub name), or a list of them
        reward_weights: [1.0]        # one per reward (TRL's reward_weights); default all 1
        eval_path: held_out.jsonl    # or eval_split: test, or eval_fraction: 0.1 (seeded by seed: 0)
        reference: texts.txt         # held-out human text for the perplexity drift (default: drift is kl_init)
        pretrain: more_texts.txt     # supervised text for the multitask / S2P methods
        chat_template: null          # null: applied when the tokenizer has one; true / false: always / never;
                                     # conversations: chat messages only, text as it is (TRL's rendering, the
                                     # default of --trl recipes)
        chat_template_kwargs: {}     # for apply_chat_template (TRL's chat_template_kwargs): {enable_thinking: false}

``eval_path``, ``reference`` and ``pretrain`` each have a ``…_dataset`` twin (a hub name too) and ``reference`` /
``pretrain`` a ``…_split`` (train) and ``…_column`` (text); a relative path is relative to the working directory.

A reward is called as TRL calls it: ``reward(prompts=[...], completions=[...], **columns)``, where ``columns`` holds
every other column of the prompts' rows, each a list aligned with the completions, and what else TRL passes where
the reward takes it by name or takes ``**kwargs``: ``completion_ids`` (each completion's token ids, EOS included),
``trainer_state``, ``log_metric`` and ``log_extra`` (:class:`~elastic_reset.rl.reward.CheckedReward`). An ``async``
reward runs concurrently with the other async ones, as in TRL. It returns one float per completion, or None for "no
reward": with several rewards the weighted sum skips a None (TRL's ``nansum``), and a completion with no reward at
all gets NaN, which the run's ``bad_reward`` setting stops on or drops. A reward model, as in TRL's
``reward_funcs``: a sequence-classification model with one output scores prompt + completion
(:mod:`elastic_reset.rewards.sequence_score`); a folder of ``elastic-reset reward-model train`` (Bradley–Terry or
Advantage Model) scores them as in its training.

The chat template needs the policy's tokenizer, which is loaded after the task: the engine calls
:meth:`PromptsTask.bind_tokenizer` once it has one. The reward always sees the prompt as written in the file.

Conversational prompts, as TRL has them: a prompt column whose values are lists of ``{"role", "content"}``
messages (a system turn, earlier turns, the user's) is rendered with the policy's chat template (which it then
needs), the generation prompt added after a user or tool turn and a final assistant turn continued, as TRL renders
a prompt-only conversation. The reward then gets, as from TRL's ``GRPOTrainer``, ``prompts`` as those message lists
and each completion as ``[{"role": "assistant", "content": text}]``.
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
import math
import os
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from elastic_reset.data.prompts import TRL_KWARGS, read_texts
from elastic_reset.errors import ConfigError, DataFileError, first_line
from elastic_reset.rewards.calling import call_rewards, takes_keyword
from elastic_reset.tasks.base import Task, load_object, register_task


# ------------------------------------------------------------------------------------------------ options
def _source(path: str | None, dataset: Any, path_key: str, dataset_key: str) -> tuple[Any, str, bool] | None:
    """(value, option key, may be a hub name) of whichever of the two options is set, or None; a ``Path`` as
    its text."""
    if path is not None and dataset is not None:
        raise ConfigError(f"task.options.{path_key}: set {path_key} or {dataset_key}, not both")
    if path is not None:
        return os.fspath(path) if isinstance(path, os.PathLike) else path, f"task.options.{path_key}", False
    if dataset is not None:
        return os.fspath(dataset) if isinstance(dataset, os.PathLike) else dataset, f"task.options.{dataset_key}", True
    return None


def source_option(name: str) -> str:
    """The option that names the prompts ``name`` stands for: ``path`` for a file or folder here (or a name like a
    file's), ``dataset`` for a ``datasets`` name (TRL's ``dataset_name``, the CLI's ``--prompts``)."""
    local = os.path.exists(name) or name.lower().endswith((".jsonl", ".json", ".csv", ".tsv", ".txt"))
    return "path" if local else "dataset"


# ------------------------------------------------------------------------------------------------ rewards
class TRLReward:
    """The task's reward: TRL-style reward functions called with the columns of each prompt's row, summed with
    weights. Called by the engine as ``(prompts, completions)``, with prompts as the policy saw them."""

    def __init__(self, specs: list[Any], weights: list[float], lookup: dict[str, dict[str, Any]],
                 columns: list[str], chat: bool = False, chat_template_kwargs: dict[str, Any] | None = None):
        self.functions = [reward_function(spec, chat, chat_template_kwargs) for spec in specs]
        self.weights = weights
        self.lookup = lookup
        self.columns = columns
        self.takes = [{name for name in TRL_KWARGS if takes_keyword(fn, name)} for _, fn in self.functions]
        self.names = _short_names([spec for spec, _ in self.functions])
        self.components: dict[str, list[float | None]] = {}
        """Each reward's values of the latest call, by its short name (what the engine logs as ``rewards/…``)."""
        for (spec, fn), takes in zip(self.functions, self.takes):
            try:
                inspect.signature(fn).bind(prompts=[], completions=[], **dict.fromkeys(takes),
                                           **{c: [] for c in columns})
            except TypeError as err:
                raise ConfigError(f"task.options.reward: {spec} cannot be called as TRL calls a reward "
                                  f"(prompts=, completions=, {', '.join(f'{c}=' for c in columns) or 'no columns'}"
                                  f"; add **kwargs): {err}") from None
            except ValueError:
                pass  # no signature to check: the call will say

    def __call__(self, prompts: list[str], completions: list[str], **trl: Any) -> list[float]:
        """``trl``: what TRL passes a reward besides its columns (:data:`TRL_KWARGS`); each function gets those it
        takes."""
        rows = [self.lookup.get(p) for p in prompts]
        originals = [row["__prompt__"] if row else p for row, p in zip(rows, prompts)]
        columns = {c: [row.get(c) if row else None for row in rows] for c in self.columns}
        if originals and isinstance(originals[0], list):  # conversational: completions as TRL passes them
            completions = [[{"role": "assistant", "content": c}] for c in completions]
            originals = copy.deepcopy(originals)  # a reward may edit them in place (TRL's own code pops from them)
        calls = [(functools.partial(fn, prompts=originals, completions=list(completions), **columns,
                                    **{k: v for k, v in trl.items() if k in takes}),
                  f"task.options.reward: {spec}", f"task.options.reward {spec}")
                 for (spec, fn), takes in zip(self.functions, self.takes)]
        total = [0.0] * len(completions)
        seen = [False] * len(completions)
        self.components = {}
        for values, weight, name in zip(call_rewards(calls, len(completions)), self.weights, self.names):
            self.components[name] = values
            for i, v in enumerate(values):
                if v is not None:  # TRL's None: this reward does not apply to this sample
                    total[i] += weight * v
                    seen[i] = True
        return [t if s else math.nan for t, s in zip(total, seen)]


def _short_names(specs: list[str]) -> list[str]:
    """A name per reward for the logs: a function's own, a model folder's last part (TRL's names), a repeated one
    numbered."""
    names = [spec.rsplit(":", 1)[-1] if ":" in spec else spec.rstrip("/").rsplit("/", 1)[-1] for spec in specs]
    return [f"{n}_{names[:i].count(n) + 1}" if names.count(n) > 1 else n for i, n in enumerate(names)]


_HUB_NAME = re.compile(r"[\w.-]+/[\w.-]+")
TRL_REWARDS = ("accuracy_reward", "reasoning_accuracy_reward", "think_format_reward", "get_soft_overlong_punishment")
"""The names TRL's scripts' ``reward_funcs`` takes for functions of ``trl.rewards`` (their
``reward_funcs_registry``); a ``reward`` entry takes them too."""

SOFT_OVERLONG = {"max_completion_len": 1280, "soft_punish_cache": 256}
"""What TRL's ``grpo`` / ``rloo`` scripts build ``get_soft_overlong_punishment`` with (DAPO's eq. 13)."""


def reward_function(spec: Any, chat: bool = False,
                    chat_template_kwargs: dict[str, Any] | None = None) -> tuple[str, Any]:
    """(name, function) of one ``reward`` entry: a function (from Python); ``module:function`` or
    ``path/to/file.py:function``; a name of :data:`TRL_REWARDS` (``think_format_reward``: TRL's function;
    ``get_soft_overlong_punishment``: the reward TRL's scripts build with :data:`SOFT_OVERLONG`); or a
    reward model, as TRL's ``reward_funcs`` takes one: a folder (or a Hub name)
    of a sequence-classification model with one output, or a folder ``elastic-reset reward-model train`` wrote.
    ``chat``: the prompts are conversations; ``chat_template_kwargs``: for a reward model's template, as TRL."""
    if callable(spec):
        return getattr(spec, "__name__", repr(spec)), spec
    if spec == "get_soft_overlong_punishment":  # a factory: the scripts' reward, logged under TRL's name
        fn = load_object(f"trl.rewards:{spec}", "task.options.reward")(**SOFT_OVERLONG)
        return fn.__name__, fn
    if spec in TRL_REWARDS:
        return spec, load_object(f"trl.rewards:{spec}", "task.options.reward")
    folder = Path(spec).expanduser() if isinstance(spec, str) else None
    if folder is None or not (folder.is_dir() or (_HUB_NAME.fullmatch(spec) and not folder.exists())):
        return spec, load_object(spec, "task.options.reward")
    if (folder / "reward_model.json").is_file():
        if chat:
            raise ConfigError(f"task.options.reward: {spec} is a reward model `reward-model train` wrote, which "
                              "scores text; these prompts are chat messages")
        from elastic_reset.reward_models.reward import PreferenceModelReward

        model = PreferenceModelReward(folder)
        return spec, lambda prompts, completions, **columns: model(prompts, completions)
    from elastic_reset.rewards.sequence_score import SequenceScoreReward

    try:
        return spec, SequenceScoreReward(spec, chat_template_kwargs=chat_template_kwargs)
    except (OSError, ValueError) as err:
        raise ConfigError(f"task.options.reward: {spec} is not module:function, and no reward model loads from "
                          f"it ({first_line(err)})") from None


# ------------------------------------------------------------------------------------------------ the task
@dataclass
class PromptsTask(Task):
    """A :class:`Task` whose prompts are rendered with the policy's chat template once the tokenizer is known."""

    chat_template: bool | Literal["conversations"] | None = None
    """None: apply the tokenizer's chat template if it has one; True: apply it (an error if none); False: never;
    ``"conversations"``: to chat messages only, a text prompt as it is, as TRL's trainers render prompts."""
    cut_prompts: bool = False
    """The user's prompts are theirs: one longer than ``model.max_prompt_tokens`` is warned about."""
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """More variables for the template (TRL's ``chat_template_kwargs``), e.g. ``enable_thinking: false``."""
    _raw: dict[str, list[str]] = field(default_factory=dict, repr=False)

    conversations: dict[str, list[dict[str, Any]]] = field(default_factory=dict, repr=False)
    """Conversational prompts by their placeholder text (:func:`conversation_key`), which the prompt lists hold
    until :meth:`bind_tokenizer` renders them."""
    rendering: str | None = None
    """How :meth:`bind_tokenizer` rendered the prompts, in words (``elastic-reset train`` says it at start)."""

    def bind_tokenizer(self, tokenizer) -> None:
        """Render the train / eval / test prompts with ``tokenizer``'s chat template (a text prompt as one user
        turn), with the generation prompt, as ``chat_template`` says; conversations always, so they need one.
        Idempotent: a second call renders the file's prompts again."""
        has = bool(getattr(tokenizer, "chat_template", None))
        if self.chat_template is True and not has:
            raise ConfigError("task.options.chat_template: true, but the policy's tokenizer has no chat template")
        if self.conversations and not (has and self.chat_template is not False):
            raise ConfigError("task.options.chat_template: the prompts are chat messages, which need the policy's "
                              "tokenizer to have a chat template, and it " + ("is switched off (false)" if has else
                                                                              "has none"))
        if not self._raw:
            self._raw = {k: list(getattr(self, k)) for k in ("train_prompts", "eval_prompts", "test_prompts")}
        render = self.chat_template is not False and has
        if self.chat_template == "conversations":  # TRL's maybe_apply_chat_template: text stays text
            render = False
            self.rendering = ("as TRL's trainers render them (task.options.chat_template: conversations): chat "
                              "messages through the policy's chat template, text prompts as they are")
        elif render:
            self.rendering = "through the policy's chat template, a text prompt as one user turn"
        else:
            self.rendering = "as they are, without a chat template (" + (
                "task.options.chat_template: false)" if has else "the policy's tokenizer has none)")
        reward = self.reward_fn if isinstance(self.reward_fn, TRLReward) else None
        for key, prompts in self._raw.items():
            shown = [_render(tokenizer, self.conversations.get(p, [{"role": "user", "content": p}]),
                             self.chat_template_kwargs) if render or p in self.conversations else p
                     for p in prompts]
            setattr(self, key, shown)
            if reward is not None:
                for raw, text in zip(prompts, shown):
                    reward.lookup.setdefault(text, reward.lookup.get(raw, {"__prompt__": raw}))


def conversation_key(messages: list[dict[str, Any]]) -> str:
    """The text that stands for a conversational prompt until the chat template renders it."""
    return json.dumps(messages, ensure_ascii=False, sort_keys=True)


def _render(tokenizer, messages: list[dict[str, Any]], kwargs: dict[str, Any]) -> str:
    # As TRL renders a prompt-only conversation: a final assistant turn is continued, any other answered.
    cont = messages[-1]["role"] == "assistant"
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=not cont,
                                         continue_final_message=cont, **kwargs)
    bos = tokenizer.bos_token
    if bos and text.startswith(bos) and tokenizer("").input_ids[:1] == [tokenizer.bos_token_id]:
        text = text[len(bos):]  # the tokenizer adds it when the policy encodes the prompt: once, not twice
    return text


@register_task("prompts")
def prompts_task(data_dir: str | None = None, path: str | None = None, dataset: Any = None,
                 split: str = "train", column: str = "prompt", reward: Any = None,
                 reward_weights: list[float] | None = None, eval_path: str | None = None,
                 eval_dataset: Any = None, eval_split: str | None = None, eval_fraction: float = 0.1,
                 seed: int = 0, reference: str | None = None, reference_dataset: Any = None,
                 reference_split: str = "train", reference_column: str = "text", pretrain: str | None = None,
                 pretrain_dataset: Any = None, pretrain_split: str = "train", pretrain_column: str = "text",
                 chat_template: bool | Literal["conversations"] | None = None,
                 chat_template_kwargs: dict[str, Any] | None = None) -> PromptsTask:
    """Prompts from a file or dataset, a reward named by import path (see the module's docstring). From Python,
    as TRL's trainers take them: the ``…dataset`` options may be ``datasets`` objects (a ``DatasetDict`` split by
    the ``…split`` options) or lists of row dicts, and ``reward`` a function or a list of them."""
    prompts_source = _source(path, dataset, "path", "dataset")
    if prompts_source is None:
        raise ConfigError("task.options.path: the prompts task needs prompts: a file or folder (path) or a "
                          "datasets name or folder (dataset)")
    source, key, hub = prompts_source
    if reward is None:
        raise ConfigError("task.options.reward: the prompts task needs a reward: module:function or "
                          "path/to/file.py:function (or a list of them)")
    specs = [reward] if isinstance(reward, str) or callable(reward) else reward
    if not isinstance(specs, list) or not specs or not all(isinstance(s, str) or callable(s) for s in specs):
        raise ConfigError(f"task.options.reward: expected module:function (from Python, a function too) or a "
                          f"list of them, got {reward!r}")
    weights = [1.0] * len(specs) if reward_weights is None else reward_weights
    if (not isinstance(weights, list) or len(weights) != len(specs)
            or not all(isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) for w in weights)):
        raise ConfigError(f"task.options.reward_weights: expected {len(specs)} finite number(s), one per reward, "
                          f"got {reward_weights!r}")
    if chat_template not in (None, True, False, "conversations") or chat_template in (0, 1) and \
            not isinstance(chat_template, bool):
        raise ConfigError(f"task.options.chat_template: expected null, true, false or conversations, got "
                          f"{chat_template!r}")
    template_kwargs = {} if chat_template_kwargs is None else chat_template_kwargs
    if not isinstance(template_kwargs, dict) or not all(isinstance(k, str) for k in template_kwargs):
        raise ConfigError(f"task.options.chat_template_kwargs: expected a mapping of template variables "
                          f"(e.g. {{enable_thinking: false}}), got {chat_template_kwargs!r}")
    if eval_split is not None and not isinstance(eval_split, str):
        raise ConfigError(f"task.options.eval_split: expected a split name, got {eval_split!r}")

    rows = read_texts(source, key, column, "task.options.column", split=split, dataset=hub, chat=True)
    eval_source = _source(eval_path, eval_dataset, "eval_path", "eval_dataset")
    if eval_source is not None or eval_split is not None:
        e_value, e_key, e_hub = eval_source or (source, key, hub)
        train = rows
        held_out = read_texts(e_value, e_key, column, "task.options.column", split=eval_split or split, dataset=e_hub,
                              chat=True)
        if isinstance(held_out[0][0], list) != isinstance(rows[0][0], list):
            kinds = ("chat messages", "text") if isinstance(held_out[0][0], list) else ("text", "chat messages")
            raise ConfigError(f"{e_key}: its prompts are {kinds[0]}, the training prompts {kinds[1]}: one format "
                              "for both")
    else:
        if not (isinstance(eval_fraction, (int, float)) and 0 < eval_fraction < 1):
            raise ConfigError(f"task.options.eval_fraction: expected in (0, 1), got {eval_fraction!r}")
        if len(rows) < 2:
            raise DataFileError(f"{source}: {len(rows)} prompt(s); a held-out fraction needs at least 2 "
                                "(or give eval_path / eval_split)")
        order = list(range(len(rows)))
        random.Random(seed).shuffle(order)
        eval_ids = set(order[:min(len(rows) - 1, max(1, round(len(rows) * eval_fraction)))])
        # File order within each part: the first eval.num_prompts are then the same for every seed of a comparison.
        train = [r for i, r in enumerate(rows) if i not in eval_ids]
        held_out = [r for i, r in enumerate(rows) if i in eval_ids]

    conversations = {conversation_key(p): p for p, _ in train + held_out if isinstance(p, list)}
    train = [(conversation_key(p) if isinstance(p, list) else p, extra) for p, extra in train]
    held_out = [(conversation_key(p) if isinstance(p, list) else p, extra) for p, extra in held_out]
    lookup: dict[str, dict[str, Any]] = {}
    columns: dict[str, None] = {}
    for prompt, extra in train + held_out:
        columns.update(dict.fromkeys(extra))
        # a repeated prompt keeps its first row; the reward sees a conversation as its messages
        lookup.setdefault(prompt, {**extra, "__prompt__": conversations.get(prompt, prompt)})

    def texts_of(name: str, path_: str | None, dataset_: str | None, split_: str, column_: str) -> list[str]:
        src = _source(path_, dataset_, name, f"{name}_dataset")
        if src is None:
            return []
        value, k, h = src
        return [t for t, _ in read_texts(value, k, column_, f"task.options.{name}_column", split=split_, dataset=h)]

    reference_texts = texts_of("reference", reference, reference_dataset, reference_split, reference_column)
    return PromptsTask(
        name="prompts",
        train_prompts=[p for p, _ in train],
        eval_prompts=[p for p, _ in held_out],
        reward_fn=TRLReward(specs, [float(w) for w in weights], lookup, list(columns), chat=bool(conversations),
                            chat_template_kwargs=template_kwargs),
        reference_texts=reference_texts,
        pretrain_texts=texts_of("pretrain", pretrain, pretrain_dataset, pretrain_split, pretrain_column),
        drift_key="perplexity" if reference_texts else "kl_init",
        chat_template=chat_template,
        chat_template_kwargs=template_kwargs,
        conversations=conversations,
    )
