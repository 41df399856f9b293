"""A TRL ``GRPOConfig`` or ``RLOOConfig`` as this engine's :class:`~elastic_reset.rl.config.TrainConfig`: the
settings a TRL user already has, carried over as README's "Coming from TRL" table maps them.

What TRL counts in optimizer steps (``max_steps``, ``save_steps``, ``eval_steps``, ``warmup_steps``) becomes
iterations here (one generation batch each, ``num_iterations`` × its optimizer steps); the batch sizes become
``prompts_per_step`` × ``samples_per_prompt`` and ``minibatch_size`` (completions per optimizer step). The
algorithm is ``rloo``: with GRPO's ``scale_rewards`` and its clipped ratio (``algo.ratio``, ``clip_range``,
``clip_range_high``, ``loss_aggregation``) for a ``GRPOConfig``, β then going into the reward (papers' eq. 1),
not the loss; as ``RLOOTrainer`` has it for an ``RLOOConfig``. A setting this engine cannot honour is refused in
one line naming it, never dropped; ``use_vllm`` and the other settings of *how* TRL generates or stores are not
about the method and are ignored. ``trl`` itself is not imported."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from elastic_reset.errors import ConfigError
from elastic_reset.rl.config import SCHEDULERS, TrainConfig, config_from_dict

DEFAULT_PROJECT = "huggingface"
"""transformers' default ``project``: left to the trackers' own default here."""
LOSS_TYPES = {"dapo": "token", "bnpo": "token", "grpo": "sequence", "dr_grpo": "constant", "cispo": "token"}
"""TRL's ``loss_type`` values built here, as ``algo.loss_aggregation`` (``cispo`` with ``algo.surrogate: cispo``,
the others with the clipped ratio)."""
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
    # the settings of what is refused above when it is asked for (loss types, TR-DPO's sync, adaptive entropy)
    "sapo_temperature_neg", "sapo_temperature_pos", "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg",
    "vespo_lambda_neg", "ref_model_mixup_alpha", "ref_model_sync_steps", "entropy_coef_min", "entropy_coef_max",
    "entropy_coef_delta", "entropy_target",
})
"""``GRPOConfig``'s and ``RLOOConfig``'s own settings that make no difference here. Any other one that is not read
(one a newer TRL added) is refused unless it is at its default."""


class _Reader:
    """A TRL config's settings, read by name (transformers' enums as their values), each read remembered so that
    :func:`_refuse_unread` can find the rest; a refusal names the config's class and the setting."""

    def __init__(self, args: Any, kind: str):
        self.args, self.kind, self.read = args, kind, set()

    def __call__(self, name: str, default: Any = None) -> Any:
        self.read.add(name)
        value = getattr(self.args, name, default)
        return getattr(value, "value", value)  # transformers' enums (SchedulerType, IntervalStrategy)

    def refuse(self, name: str, why: str) -> None:
        raise ConfigError(f"{self.kind}.{name}: {why}")

    def check(self, rules: list[tuple[str, bool, str]]) -> None:
        for name, ok, why in rules:
            if not ok:
                self.refuse(name, f"{self(name)!r}: {why}")


def config_from_grpo(args: Any, overrides: list[str] = ()) -> TrainConfig:
    """The :class:`TrainConfig` that trains as ``args`` (a ``trl.GRPOConfig``) says, then ``overrides`` (``--set``
    items: the model, the task, the drift-control method, ...). ``args.max_steps`` must be set: GRPO's epochs over
    a dataset have no counterpart here."""
    get = _Reader(args, "GRPOConfig")
    loss_type = get("loss_type", "dapo")
    get.check([
        ("loss_type", loss_type in LOSS_TYPES, f"one of {', '.join(LOSS_TYPES)} here"),
        ("importance_sampling_level", get("importance_sampling_level", "token") in ("token", "sequence"),
         "token or sequence"),
        ("use_adaptive_entropy", not get("use_adaptive_entropy"), "give a fixed entropy_coef"),
        ("multi_objective_aggregation", get("multi_objective_aggregation", "sum_then_normalize") ==
         "sum_then_normalize", "only the weighted sum of the rewards, then the advantage, here"),
        ("off_policy_mask_threshold", get("off_policy_mask_threshold") is None, "not built here"),
        ("max_tool_calling_iterations", get("max_tool_calling_iterations") is None, "no tool calls here"),
    ])
    scale = get("scale_rewards", "group")
    scale = {True: "group", False: "none"}.get(scale, scale)
    if scale not in ("group", "batch", "none"):
        get.refuse("scale_rewards", f"{scale!r}: expected group, batch or none")
    algo = {"ratio": get("importance_sampling_level", "token"),
            "ratio_max": None if get("delta") is None else float(get("delta")),
            "loss_aggregation": LOSS_TYPES[loss_type], "surrogate": "cispo" if loss_type == "cispo" else "clip",
            "top_entropy_quantile": float(get("top_entropy_quantile", 1.0)),
            "entropy_coef": float(get("entropy_coef", 0.0)),
            "scale_rewards": "group" if scale == "group" else "none", "whiten_advantages": scale == "batch"}
    return _carried_over(get, overrides, algo, beta=float(get("beta", 0.0)), estimator="k3")


def config_from_rloo(args: Any, overrides: list[str] = ()) -> TrainConfig:
    """The :class:`TrainConfig` that trains as ``args`` (a ``trl.RLOOConfig``) says, then ``overrides``, as
    :func:`config_from_grpo`. ``RLOOTrainer``'s method is this engine's ``rloo`` as the papers have it: β·Σ log
    π/π_ref in the reward (``kl.estimator: k1``), the leave-one-out baseline, the whole sequence's probability ratio
    clipped (``algo.ratio: sequence_sum``), one loss per completion averaged (``loss_aggregation: sequence``)."""
    get = _Reader(args, "RLOOConfig")
    clip = get("reward_clip_range")
    algo = {"ratio": "sequence_sum", "loss_aggregation": "sequence", "scale_rewards": "none",
            "whiten_advantages": bool(get("normalize_advantages", False)),
            "reward_clip_range": None if clip is None else [float(v) for v in clip]}
    return _carried_over(get, overrides, algo, beta=float(get("beta", 0.05)), estimator="k1")


def _carried_over(get: _Reader, overrides: list[str], algo: dict[str, Any], beta: float,
                  estimator: str) -> TrainConfig:
    """What ``GRPOConfig`` and ``RLOOConfig`` share (batches, schedule, sampling, saving, logging), with ``algo``
    (the trainer's own loss settings) on top, as a :class:`TrainConfig`."""
    k = int(get("num_generations"))
    per_step = int(get("per_device_train_batch_size")) * int(get("gradient_accumulation_steps", 1)) \
        * int(get("world_size", 1))
    steps_per_generation = int(get("steps_per_generation") or 1)  # TRL folds it into generation_batch_size
    generation = int(get("generation_batch_size") or per_step * steps_per_generation)
    if generation % k:
        get.refuse("generation_batch_size", f"{generation} completions are not whole groups of num_generations={k}")
    if generation % per_step:
        get.refuse("steps_per_generation", f"a generation batch of {generation} completions is not a whole number "
                                           f"of optimizer steps of {per_step}")
    epochs = int(get("num_iterations", 1))
    updates = epochs * generation // per_step  # optimizer steps an iteration
    max_steps = int(get("max_steps", -1))
    if max_steps <= 0:
        get.refuse("max_steps", "set the number of optimizer steps; epochs over a dataset (num_train_epochs) have no "
                                "counterpart here, where a run is a number of iterations")

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
        ("sync_ref_model", not get("sync_ref_model"), "TR-DPO's reference sync is method.name anchor with "
                                                      "method.preset ref_sync"),
        ("reward_weights", get("reward_weights") is None, "give it to the prompts task: get_task('prompts', ..., "
                                                          "reward_weights=[...])"),
        ("chat_template_kwargs", not get("chat_template_kwargs"), "give it to the prompts task: get_task("
                                                                  "'prompts', ..., chat_template_kwargs={...})"),
        ("warmup_ratio", not get("warmup_ratio", 0.0), "give warmup_steps instead"),
        ("shuffle_dataset", get("shuffle_dataset", True), "prompts are always drawn in a seeded shuffle here"),
    ])
    save = get("save_strategy", "steps")
    evaluate = get("eval_strategy", "no")
    for name, value in (("save_strategy", save), ("eval_strategy", evaluate)):
        if value not in ("steps", "no"):
            get.refuse(name, f"{value!r}: only steps (or no) has a counterpart here")
    hub = (get("hub_model_id") or Path(get("output_dir") or ".").resolve().name) if get("push_to_hub") else None
    report = get("report_to") or []
    report = [report] if isinstance(report, str) else list(report)
    data = {
        "seed": int(get("seed", 42)),
        "steps": iterations("max_steps", max_steps),
        "algo": {"name": "rloo", "samples_per_prompt": k, "prompts_per_step": generation // k,
                 "minibatch_size": per_step, "epochs": epochs, "lr": float(get("learning_rate")),
                 "lr_scheduler": get("lr_scheduler_type", "linear"),
                 "warmup_steps": iterations("warmup_steps", get("warmup_steps")),
                 "lr_scheduler_kwargs": dict(get("lr_scheduler_kwargs") or {}),
                 "max_grad_norm": get("max_grad_norm") or None,  # 0: no clipping, as in transformers
                 "weight_decay": float(get("weight_decay", 0.0)),
                 "adam_beta2": float(get("adam_beta2", 0.999)), "adam_eps": float(get("adam_epsilon", 1e-8)),
                 "clip_range": float(get("epsilon", 0.2)),
                 "clip_range_high": None if get("epsilon_high") is None else float(get("epsilon_high")),
                 "mask_truncated_completions": bool(get("mask_truncated_completions", False)), **algo},
        "kl": {"coef": beta, "target": None, "estimator": estimator},
        "method": {"name": "kl" if beta > 0 else "none"},
        "sampling": {"max_new_tokens": int(get("max_completion_length", 256)),
                     "temperature": float(get("temperature", 1.0)), "top_p": float(get("top_p", 1.0)),
                     "top_k": int(get("top_k") or 0), "min_p": float(get("min_p") or 0.0),
                     "repetition_penalty": float(get("repetition_penalty", 1.0))},
        "model": {"autocast": "bf16" if get("bf16") else "none"},
        "checkpoint_every": iterations("save_steps", get("save_steps")) if save == "steps" else 0,
        "eval": {"every": iterations("eval_steps", get("eval_steps") or get("logging_steps"))
                 if evaluate == "steps" else 0},
        "report_to": report,
        "log_completions": bool(get("log_completions", False)),
        "push_to_hub": hub,
        "run_name": get("run_name"),
        "project": None if get("project", DEFAULT_PROJECT) == DEFAULT_PROJECT else get("project"),
    }
    _refuse_unread(get)
    return config_from_dict(data, list(overrides))


def _refuse_unread(get: _Reader) -> None:
    """Refuse a setting of the TRL config's own (not transformers' ``TrainingArguments``') that was neither read
    nor :data:`IGNORED`, unless it is at its default: a newer TRL's setting is never dropped silently."""
    args = get.args
    if not dataclasses.is_dataclass(args):
        return
    from transformers import TrainingArguments

    inherited = {f.name for f in dataclasses.fields(TrainingArguments)}
    for f in dataclasses.fields(args):
        if f.name in get.read or f.name in IGNORED or f.name in inherited:
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if getattr(args, f.name) != default:
            raise ConfigError(f"{get.kind}.{f.name}: {getattr(args, f.name)!r}: not known to this version of "
                              "elastic-reset; leave it at its default")
