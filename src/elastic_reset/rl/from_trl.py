"""A TRL ``GRPOConfig`` or ``RLOOConfig`` as this engine's :class:`~elastic_reset.rl.config.TrainConfig`: the
settings a TRL user already has, carried over as docs/trl.md's table maps them.

What TRL counts in optimizer steps (``max_steps``, ``save_steps``, ``eval_steps``, ``warmup_steps``) becomes
iterations here (one generation batch each, ``num_iterations`` × its optimizer steps); the batch sizes become
``prompts_per_step`` × ``samples_per_prompt`` and ``minibatch_size`` (completions per optimizer step). The
algorithm is ``rloo``: with GRPO's baseline (the group's mean), ``scale_rewards`` and its clipped ratio
(``algo.ratio``, ``clip_range``, ``clip_range_high``, ``loss_aggregation``) for a ``GRPOConfig``, β then going
into the reward (papers' eq. 1), not the loss; as ``RLOOTrainer`` has it for an ``RLOOConfig``. A setting this
engine cannot honour is refused in one line naming it, never dropped; ``use_vllm`` and the other settings of *how*
TRL generates or stores are not about the method and are ignored. ``trl`` itself is not imported."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import importlib
import json
import math
import os
import warnings
from pathlib import Path
from typing import Any

from elastic_reset.errors import ConfigError, first_line
from elastic_reset.rl.config import SCHEDULERS, TrainConfig, config_from_dict, load_config
from elastic_reset.rl.config_yaml import read_yaml_mapping
from elastic_reset.tasks.prompts import TRL_REWARDS, source_option

DEFAULT_PROJECT = "huggingface"
"""transformers' default ``project``: left to the trackers' own default here."""
LOSS_TYPES = {"dapo": "batch_token", "bnpo": "token", "grpo": "sequence", "dr_grpo": "constant",
              "cispo": "batch_token", "sapo": "sequence", "luspo": "sum", "vespo": "batch_token"}
"""TRL's ``loss_type`` values, as ``algo.loss_aggregation`` (``cispo``, ``sapo`` and ``vespo`` with that
``algo.surrogate``, the others with the clipped ratio)."""
SURROGATES = ("cispo", "sapo", "vespo")
"""The ``loss_type`` values that are an ``algo.surrogate`` of their own name."""
IGNORED = frozenset({
    # how TRL generates, batches, loads or logs: not about the method
    "model_init_kwargs", "trust_remote_code", "cast_lm_head_to_fp32", "ds3_gather_for_generation",
    "pad_to_multiple_of", "cache_implementation", "use_transformers_continuous_batching",
    "transformers_continuous_batching_config", "use_transformers_paged", "log_multimodal", "num_completions_to_print",
    "log_unique_prompts", "log_completions_hub_repo", "router_aux_loss_coef", "num_generations_eval",
    # vLLM's, and the correction of its sampling mismatch: this engine samples with the policy itself
    "use_vllm", "vllm_mode", "vllm_model_impl", "vllm_enable_sleep_mode", "vllm_structured_outputs_regex",
    "vllm_server_base_url", "vllm_server_host", "vllm_server_port", "vllm_server_timeout", "vllm_group_port",
    "vllm_gpu_memory_utilization", "vllm_max_model_length", "vllm_tensor_parallel_size",
    "vllm_importance_sampling_correction", "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max",
    "vllm_importance_sampling_clip_min", "vllm_importance_sampling_cap",
    # dropout is always off here (PPO's ratio compares the same weights); the KL is in the reward, not the loss
    "disable_dropout", "use_bias_correction_kl",
})
"""``GRPOConfig``'s and ``RLOOConfig``'s own settings that make no difference here. Any other one that is not read
(one a newer TRL added) is refused unless it is at its default."""
MODEL_IGNORED = frozenset({"attn_implementation", "lora_dropout", "bnb_4bit_quant_type", "use_bnb_nested_quant",
                           "bnb_4bit_quant_storage", "ignore_bias_buffers"})
"""``ModelConfig``'s and the scripts' settings that make no difference here: the attention kernel, LoRA dropout
(dropout is always off here), quantisation's details (quantisation is refused), a DPO setting."""
RECIPES = {"grpo": ("trl.scripts.grpo", "GRPOScriptArguments", "GRPOConfig"),
           "rloo": ("trl.scripts.rloo", "RLOOScriptArguments", "RLOOConfig")}
"""The TRL scripts whose ``--config`` YAML :func:`config_from_recipe` reads: module, script settings, config."""


_REFUSALS: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("refusals", default=None)
"""The refusals of the conversion under way (:func:`_all_refusals`): a recipe's are said together, not one a run."""


@contextlib.contextmanager
def _all_refusals():
    """Collect every refusal of the conversion inside (an outer one's list if nested) and raise them as one
    ConfigError at its end, or in place of an error that a refused setting caused further on."""
    if _REFUSALS.get() is not None:
        yield
        return
    refusals: list[str] = []
    token = _REFUSALS.set(refusals)
    try:
        yield
    except Exception:
        if refusals:
            raise ConfigError("; ".join(refusals)) from None
        raise
    finally:
        _REFUSALS.reset(token)
    if refusals:
        raise ConfigError("; ".join(refusals))


class _Reader:
    """A TRL config's settings, read by name (transformers' enums as their values), each read remembered so that
    :func:`_refuse_unread` can find the rest; a refusal names the config's class and the setting."""

    def __init__(self, args: Any, kind: str):
        self.args, self.kind, self.read = args, kind, set()

    def __call__(self, name: str, default: Any = None) -> Any:
        self.read.add(name)
        value = getattr(self.args, name, default)
        return getattr(value, "value", value)  # transformers' enums (SchedulerType, IntervalStrategy)

    def number(self, name: str, default: Any = None, kind: type = float) -> Any:
        """The setting as ``kind`` (``float`` or ``int``); None stays None; anything else is refused naming it."""
        value = self(name, default)
        if value is None:
            return None
        try:
            number = kind(value)
            if isinstance(value, bool) or (kind is int and number != float(value)):
                raise ValueError
        except (TypeError, ValueError):
            self.refuse(name, f"expected {'an integer' if kind is int else 'a number'}, got {value!r}")
            return default
        return number

    def refuse(self, name: str, why: str) -> None:
        """Refuse the setting: raised at once, or at the end of the conversion under way with the others."""
        refusals = _REFUSALS.get()
        if refusals is None:
            raise ConfigError(f"{self.kind}.{name}: {why}")
        refusals.append(f"{self.kind}.{name}: {why}")

    def check(self, rules: list[tuple[str, bool, str]]) -> None:
        for name, ok, why in rules:
            if not ok:
                self.refuse(name, f"{self(name)!r}: {why}")


@_all_refusals()
def config_from_grpo(args: Any, overrides: list[str] = (), *, train_prompts: int | None = None) -> TrainConfig:
    """The :class:`TrainConfig` that trains as ``args`` (a ``trl.GRPOConfig``) says, then ``overrides`` (``--set``
    items: the model, the task, the drift-control method, ...). Without ``args.max_steps``, the run is
    ``num_train_epochs`` over ``train_prompts`` prompts, counted as transformers counts TRL's steps."""
    get = _Reader(args, "GRPOConfig")
    loss_type = get("loss_type", "dapo")
    get.check([
        ("loss_type", loss_type in LOSS_TYPES, f"one of {', '.join(LOSS_TYPES)} here"),
        ("importance_sampling_level", get("importance_sampling_level", "token") in ("token", "sequence"),
         "token or sequence"),
        ("multi_objective_aggregation", get("multi_objective_aggregation", "sum_then_normalize") in
         ("sum_then_normalize", "normalize_then_sum"), "sum_then_normalize or normalize_then_sum"),
        ("max_tool_calling_iterations", get("max_tool_calling_iterations") is None, "no tool calls here"),
    ])
    scale = get("scale_rewards", "group")
    scale = {True: "group", False: "none"}.get(scale, scale)
    if scale not in ("group", "batch", "none"):
        get.refuse("scale_rewards", f"{scale!r}: expected group, batch or none")
    algo = {"ratio": get("importance_sampling_level", "token"),
            "ratio_max": get.number("delta"),
            "loss_aggregation": LOSS_TYPES[loss_type],
            "surrogate": loss_type if loss_type in SURROGATES else "clip",
            **{name: get.number(name, default) for name, default in (
                ("sapo_temperature_pos", 1.0), ("sapo_temperature_neg", 1.05), ("vespo_k_pos", 2.0),
                ("vespo_lambda_pos", 3.0), ("vespo_k_neg", 3.0), ("vespo_lambda_neg", 2.0))},
            "top_entropy_quantile": get.number("top_entropy_quantile", 1.0),
            "entropy_coef": get.number("entropy_coef", 0.0),
            **{f"entropy_{name}": get.number(f"entropy_{name}", default) for name, default in (
                ("target", 0.2), ("coef_delta", 0.005), ("coef_min", 0.0), ("coef_max", 1.0))},
            "off_policy_mask": get.number("off_policy_mask_threshold"),
            "baseline": "group_mean",  # GRPO's advantage is r − mean of the group, the sample's own r included
            "scale_rewards": "group" if scale == "group" else "none", "whiten_advantages": scale == "batch"}
    if not get("use_adaptive_entropy"):
        algo["entropy_target"] = None  # a fixed entropy_coef
    if get("multi_objective_aggregation", "sum_then_normalize") == "normalize_then_sum":  # GDPO: then over the batch
        algo.update(reward_aggregation="normalize_then_sum", scale_rewards="none", whiten_advantages=True)
    return _carried_over(get, overrides, algo, beta=get.number("beta", 0.0), estimator="k3",
                         train_prompts=train_prompts)


@_all_refusals()
def config_from_rloo(args: Any, overrides: list[str] = (), *, train_prompts: int | None = None) -> TrainConfig:
    """The :class:`TrainConfig` that trains as ``args`` (a ``trl.RLOOConfig``) says, then ``overrides``, as
    :func:`config_from_grpo`. ``RLOOTrainer``'s method is this engine's ``rloo`` as the papers have it: β·Σ log
    π/π_ref in the reward (``kl.estimator: k1``), the leave-one-out baseline, the whole sequence's probability ratio
    clipped (``algo.ratio: sequence_sum``), one loss per completion averaged (``loss_aggregation: sequence``)."""
    get = _Reader(args, "RLOOConfig")
    clip = get("reward_clip_range")
    try:
        clip = None if clip is None else [float(v) for v in clip]
    except (TypeError, ValueError):
        get.refuse("reward_clip_range", f"expected [low, high], got {clip!r}")
    algo = {"ratio": "sequence_sum", "loss_aggregation": "sequence", "scale_rewards": "none",
            "whiten_advantages": bool(get("normalize_advantages", False)), "reward_clip_range": clip}
    return _carried_over(get, overrides, algo, beta=get.number("beta", 0.05), estimator="k1",
                         train_prompts=train_prompts)


def load_run_config(path: str | Path, trl: str | None, overrides: list[str] = (),
                    dataset: str | None = None) -> TrainConfig:
    """A run's config from ``path``: a YAML config of this engine's, or with ``trl`` (``grpo``, ``rloo``) a TRL
    command-line recipe (:func:`config_from_recipe`, its ``dataset_name`` replaced by ``dataset`` if given, as
    ``trl grpo --dataset_name``); then ``overrides``."""
    if not trl:
        return load_config(path, overrides)
    return config_from_recipe(path, trl, overrides, {"dataset_name": dataset} if dataset is not None else None)


def recipe_output_dir(path: str | Path) -> str | None:
    """A TRL recipe's ``output_dir``, where ``trl grpo --config path`` would write: the run directory when no
    ``--out`` is given."""
    value = read_yaml_mapping(path).get("output_dir")
    if value is not None and not (isinstance(value, str) and value.strip()):
        raise ConfigError(f"{path}: output_dir: expected a folder name, got {value!r}")
    return value


class LauncherSettingsWarning(UserWarning):
    """A recipe holds settings of ``accelerate launch`` (``num_processes``, ``accelerate_config``, ...), which
    ``trl grpo`` passes to the launcher and this command does not launch."""


def _recipe_classes(trainer: str) -> tuple[type, type, type]:
    """The script's settings, the trainer's config and ``ModelConfig``: the classes ``trl <trainer>`` parses."""
    import trl

    module, script_class, config_class = RECIPES[trainer]
    return getattr(importlib.import_module(module), script_class), getattr(trl, config_class), trl.ModelConfig


def _launcher_settings(data: dict[str, Any], classes: tuple[type, ...]) -> list[str]:
    """Remove from ``data`` and name the keys that no class of ``classes`` knows and ``accelerate launch`` does
    (``accelerate_config``: TRL's name for its ``--config_file``); others stay, for the parser to refuse."""
    from accelerate.commands.launch import launch_command_parser

    known = {f.name for cls in classes for f in dataclasses.fields(cls)}
    launch = {action.dest for action in launch_command_parser()._actions} | {"accelerate_config"}
    found = [key for key in data if key not in known and key in launch]
    for key in found:
        del data[key]
    return found


@_all_refusals()
def config_from_recipe(path: str | Path, trainer: str, overrides: list[str] = (),
                       settings: dict[str, Any] | None = None) -> TrainConfig:
    """What ``trl <trainer> --config path`` trains (``trainer``: ``grpo`` or ``rloo``), then ``overrides``: the
    trainer's settings carried over by :func:`config_from_grpo` / :func:`config_from_rloo`, ``ModelConfig``'s as
    the model and its LoRA, the script's (``dataset_name``, ``reward_funcs``, ``reward_model_name_or_path``) with
    ``reward_weights`` and ``chat_template_kwargs`` as the prompts task. ``env:`` sets environment variables, as
    TRL's parser does. ``settings`` replace the recipe's, as ``trl grpo``'s command-line flags do. Needs TRL."""
    if trainer not in RECIPES:
        raise ConfigError(f"--trl: expected one of {', '.join(RECIPES)}, got {trainer!r}")
    data = {**read_yaml_mapping(path), **(settings or {})}
    try:
        import trl  # noqa: F401  (the settings' classes: _recipe_classes)
        from transformers import HfArgumentParser
    except ImportError:
        raise ConfigError(f"{path}: a TRL recipe is read with TRL's own settings: pip install 'elastic-reset[trl]'"
                          ) from None
    env = data.pop("env", None) or {}
    if not isinstance(env, dict):
        raise ConfigError(f"{path}: env: expected a mapping of environment variables, got {env!r}")
    os.environ.update({str(key): str(value) for key, value in env.items()})
    if "datasets" in data:
        raise ConfigError(f"{path}: datasets: TRL's dataset mixtures are not read here; give dataset_name")
    task_options = {name: data.pop(name) for name in ("reward_weights", "chat_template_kwargs")
                    if data.get(name) is not None}  # the trainer's in TRL, the prompts task's here
    launcher = _launcher_settings(data, classes := _recipe_classes(trainer))
    if launcher:  # `trl grpo` hands the keys its parser does not know to `accelerate launch`
        warnings.warn(f"{path}: {', '.join(launcher)}: settings of `accelerate launch`, which `trl {trainer}` "
                      "passes to it; not this command's: run it under `accelerate launch` with them",
                      LauncherSettingsWarning, stacklevel=2)
    stated = set(data)
    if "use_cpu" not in data and not _cuda():
        data["use_cpu"] = True  # else TrainingArguments refuses TRL's default bf16 on a CPU
    script_class = RECIPES[trainer][1]
    try:
        with warnings.catch_warnings():  # transformers' deprecation of a setting TRL's config sets itself
            warnings.filterwarnings("ignore", ".*gradient_checkpointing.*", FutureWarning)
            script, args, model = HfArgumentParser(classes).parse_dict(data, allow_extra_keys=False)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"{path}: {first_line(err)}") from None
    m = _Reader(model, "ModelConfig")
    items = _model_items(m, bf16_stated="bf16" in stated)
    script_get = _Reader(script, script_class)
    items += _task_items(script_get, task_options, eval_split=args.eval_strategy != "no")
    for reader in (m, script_get):
        _refuse_unread(reader, MODEL_IGNORED)
    carry = config_from_grpo if trainer == "grpo" else config_from_rloo
    return carry(args, items + list(overrides), train_prompts=_train_prompts(script_get, args))


def _train_prompts(get: _Reader, args: Any) -> int | None:
    """The rows of the recipe's training split, for ``num_train_epochs`` when ``max_steps`` is not set (else
    None: not read)."""
    dataset = get("dataset_name")
    if (getattr(args, "max_steps", -1) or -1) > 0 or not isinstance(dataset, str):
        return None
    from elastic_reset.data.prompts import read_rows

    key = source_option(dataset)
    return len(read_rows(dataset, f"task.options.{key}", split=get("dataset_train_split", "train"),
                         dataset=key == "dataset"))


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _model_items(m: _Reader, bf16_stated: bool) -> list[str]:
    """``--set`` items for ``ModelConfig``'s settings: the model, LoRA (``use_peft``), the precision."""
    m.check([
        ("model_revision", m("model_revision", "main") == "main", "only the default revision here"),
        ("dtype", m("dtype") in (None, "auto", "float32", "bfloat16"), "float32, bfloat16 (here bf16 autocast "
                                                                        "over float32 weights) or auto"),
        ("load_in_8bit", not m("load_in_8bit"), "quantised models are not built here"),
        ("load_in_4bit", not m("load_in_4bit"), "quantised models are not built here"),
        ("use_rslora", not m("use_rslora"), "plain LoRA only here"),
        ("use_dora", not m("use_dora"), "plain LoRA only here"),
        ("lora_target_parameters", not m("lora_target_parameters"), "give lora_target_modules"),
        ("lora_modules_to_save", not m("lora_modules_to_save"), "only the adapters train here"),
        ("lora_task_type", m("lora_task_type", "CAUSAL_LM") == "CAUSAL_LM", "causal LMs here"),
    ])
    items = [f"model.name={json.dumps(m('model_name_or_path'))}"] if m("model_name_or_path") else []
    lora = {"r": m.number("lora_r", 16, int), "alpha": m.number("lora_alpha", 32, int)}  # read, used or not
    targets = m("lora_target_modules")
    targets = [targets] if isinstance(targets, str) else targets
    if m("use_peft"):
        items.append(f"model.lora={json.dumps({**lora, **({'target_modules': list(targets)} if targets else {})})}")
    if not bf16_stated:  # TRL's default is bf16; here bf16 where the hardware has it
        items.append(f"model.autocast={'bf16' if m('dtype') == 'bfloat16' else 'auto'}")
    return items


def _task_items(get: _Reader, options: dict[str, Any], eval_split: bool) -> list[str]:
    """``--set`` items for the prompts task the script's settings describe (none without ``dataset_name``)."""
    get.check([
        ("dataset_config", get("dataset_config") is None, "a dataset's configuration is not read here: give its "
                                                          "folder (save_to_disk) as dataset_name"),
        ("dataset_streaming", not get("dataset_streaming"), "prompts are read whole here"),
    ])
    rewards = [get("reward_model_name_or_path")] if get("reward_model_name_or_path") else []
    funcs = get("reward_funcs") or []
    for name in [funcs] if isinstance(funcs, str) else funcs:  # one name given without a list
        if name in TRL_REWARDS:
            rewards.append(name)
        elif isinstance(name, str) and "." in name:
            rewards.append(":".join(name.rsplit(".", 1)))
        else:
            get.refuse("reward_funcs", f"{name!r}: expected one of {', '.join(TRL_REWARDS)} or a dotted import "
                                       "path (my_lib.rewards.custom_reward)")
    if rewards:
        options["reward"] = rewards
    dataset, train, test = get("dataset_name"), get("dataset_train_split", "train"), get("dataset_test_split", "test")
    if not dataset:
        return [f"task.options.{key}={json.dumps(value)}" for key, value in options.items()]
    if not isinstance(dataset, str):
        get.refuse("dataset_name", f"expected a dataset's name or folder, got {dataset!r}")
    # TRL's rendering: chat messages through the template, a text prompt as it is
    options = {source_option(dataset): dataset, "split": train, "chat_template": "conversations", **options}
    if eval_split and not os.path.isfile(dataset):  # TRL evaluates on it only with an eval_strategy; a file has
        # no splits: a held-out share of it here, as without one
        options["eval_split"] = test
    return ["task.name=prompts", f"task.options={json.dumps(options)}"]


def _carried_over(get: _Reader, overrides: list[str], algo: dict[str, Any], beta: float,
                  estimator: str, train_prompts: int | None = None) -> TrainConfig:
    """What ``GRPOConfig`` and ``RLOOConfig`` share (batches, schedule, sampling, saving, logging), with ``algo``
    (the trainer's own loss settings) on top, as a :class:`TrainConfig`."""
    k = get.number("num_generations", None, int)
    per_step = (get.number("per_device_train_batch_size", None, int) * get.number("gradient_accumulation_steps", 1, int)
                * get.number("world_size", 1, int))
    steps_per_generation = get.number("steps_per_generation", None, int) or 1  # folded into generation_batch_size
    generation = get.number("generation_batch_size", None, int) or per_step * steps_per_generation
    if generation % k:
        get.refuse("generation_batch_size", f"{generation} completions are not whole groups of num_generations={k}")
    if generation % per_step:
        get.refuse("steps_per_generation", f"a generation batch of {generation} completions is not a whole number "
                                           f"of optimizer steps of {per_step}")
    epochs = get.number("num_iterations", 1, int)
    updates = epochs * generation // per_step  # optimizer steps an iteration
    max_steps = get.number("max_steps", -1, int)
    if max_steps <= 0 and train_prompts is None:
        get.refuse("max_steps", "set the number of optimizer steps, or give the prompts' count (train_prompts=; "
                                "a recipe's dataset_name is counted) for num_train_epochs")
    elif max_steps <= 0:  # as transformers counts TRL's epochs: every prompt once an epoch, in whole generation
        per_epoch = train_prompts // (generation // k)  # batches (TRL's sampler drops the last, partial one)
        if per_epoch == 0:
            get.refuse("num_train_epochs", f"{train_prompts} training prompts, fewer than a generation batch's "
                                           f"{generation // k}: set max_steps")
        max_steps = math.ceil(get.number("num_train_epochs", 3.0) * per_epoch * updates)

    def iterations(name: str, value: float | None) -> int:
        """Optimizer steps (transformers: a value under 1 is that fraction of max_steps, rounded up) as
        iterations."""
        optimizer_steps = math.ceil(value * max_steps) if value is not None and 0 < value < 1 else int(value or 0)
        if optimizer_steps % updates:
            get.refuse(name, f"{optimizer_steps} optimizer steps are not whole iterations of {updates}")
        return optimizer_steps // updates
    get.check([
        ("adam_beta1", get("adam_beta1", 0.9) == 0.9, "only 0.9 here"),
        ("optim", str(get("optim", "adamw_torch")).startswith("adamw_torch"), "only AdamW (adamw_torch) here"),
        ("lr_scheduler_type", get("lr_scheduler_type", "linear") in SCHEDULERS, f"one of {', '.join(SCHEDULERS)}"),
        ("generation_kwargs", not get("generation_kwargs"), "set the sampling.* settings instead"),
        ("reward_weights", get("reward_weights") is None, "give it to the prompts task: get_task('prompts', ..., "
                                                          "reward_weights=[...])"),
        ("chat_template_kwargs", not get("chat_template_kwargs"), "give it to the prompts task: get_task("
                                                                  "'prompts', ..., chat_template_kwargs={...})"),
        ("fp16", not get("fp16"), "bf16 or full precision here (model.autocast)"),
        ("gradient_checkpointing_kwargs", set(get("gradient_checkpointing_kwargs") or {}) <= {"use_reentrant"},
         "only use_reentrant here (the layers are recomputed non-reentrantly: the same numbers)"),
        ("neftune_noise_alpha", get("neftune_noise_alpha") is None, "no NEFTune noise here"),
        ("optim_args", not get("optim_args"), "AdamW's settings are the algo.* ones here"),
        ("optim_target_modules", get("optim_target_modules") is None, "AdamW on every trainable weight here"),
        *[(name, not get(name), "several processes run under accelerate launch here (data-parallel; FSDP2 with "
                                "the TRL callback)") for name in ("deepspeed", "fsdp", "parallelism_config")],
        ("resume_from_checkpoint", not get("resume_from_checkpoint"), "continue a run with elastic-reset train "
                                                                      "--resume (RLTrainer(..., resume=True))"),
    ])
    save = get("save_strategy", "steps")
    evaluate = get("eval_strategy", "no")
    for name, value in (("save_strategy", save), ("eval_strategy", evaluate)):
        if value not in ("steps", "no"):
            get.refuse(name, f"{value!r}: only steps (or no) has a counterpart here")
    method = {"name": "kl" if beta > 0 else "none"}
    alpha, sync_steps = get.number("ref_model_mixup_alpha", 0.6), get.number("ref_model_sync_steps", 512, int)
    if get("sync_ref_model"):  # TR-DPO: the KL reference pulled towards the policy every so many steps
        method = {"name": "anchor", "preset": "ref_sync", "alpha": alpha,
                  "every": iterations("ref_model_sync_steps", sync_steps)}
    hub = (get("hub_model_id") or Path(get("output_dir") or ".").resolve().name) if get("push_to_hub") else None
    report = get("report_to") or []
    report = [report] if isinstance(report, str) else list(report)
    data = {
        "seed": get.number("seed", 42, int),
        "steps": iterations("max_steps", max_steps),
        "algo": {"name": "rloo", "samples_per_prompt": k, "prompts_per_step": generation // k,
                 "minibatch_size": per_step, "epochs": epochs, "lr": get.number("learning_rate"),
                 "shuffle_prompts": bool(get("shuffle_dataset", True)),
                 "lr_scheduler": get("lr_scheduler_type", "linear"),
                 "warmup_steps": iterations("warmup_steps", get.number("warmup_steps")),
                 "lr_scheduler_kwargs": dict(get("lr_scheduler_kwargs") or {}),
                 "max_grad_norm": get("max_grad_norm") or None,  # 0: no clipping, as in transformers
                 "weight_decay": get.number("weight_decay", 0.0),
                 "adam_beta2": get.number("adam_beta2", 0.999), "adam_eps": get.number("adam_epsilon", 1e-8),
                 "clip_range": get.number("epsilon", 0.2),
                 "clip_range_high": get.number("epsilon_high"),
                 "mask_truncated_completions": bool(get("mask_truncated_completions", False)), **algo},
        "kl": {"coef": beta, "target": None, "estimator": estimator},
        "method": method,
        "sampling": {"max_new_tokens": get.number("max_completion_length", 256, int),
                     "temperature": get.number("temperature", 1.0), "top_p": get.number("top_p", 1.0),
                     "top_k": get.number("top_k", None, int) or 0, "min_p": get.number("min_p") or 0.0,
                     "repetition_penalty": get.number("repetition_penalty", 1.0)},
        "model": {"autocast": "bf16" if get("bf16") else "none", "max_prompt_tokens": None,  # TRL cuts none
                  "activation_checkpointing": bool(get("gradient_checkpointing", False))},  # TRL's default: on
        "checkpoint_every": iterations("save_steps", get.number("save_steps")) if save == "steps" else 0,
        "eval": {"every": iterations("eval_steps", get.number("eval_steps") or get.number("logging_steps"))
                 if evaluate == "steps" else 0},
        "report_to": report,
        "log_completions": bool(get("log_completions", False)),
        "push_to_hub": hub,
        "run_name": get("run_name"),
        "project": None if get("project", DEFAULT_PROJECT) == DEFAULT_PROJECT else get("project"),
    }
    _refuse_unread(get)
    return config_from_dict(data, list(overrides))


def _refuse_unread(get: _Reader, ignored: frozenset[str] = IGNORED) -> None:
    """Refuse a setting of the TRL config's own (not transformers' ``TrainingArguments``') that was neither read
    nor ``ignored``, unless it is at its default: a newer TRL's setting is never dropped silently."""
    args = get.args
    if not dataclasses.is_dataclass(args):
        return
    from transformers import TrainingArguments

    inherited = {f.name for f in dataclasses.fields(TrainingArguments)}
    for f in dataclasses.fields(args):
        if f.name in get.read or f.name in ignored or f.name in inherited:
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if getattr(args, f.name) != default:
            get.refuse(f.name, f"{getattr(args, f.name)!r}: not known to this version of elastic-reset; leave it at "
                               "its default")
