"""A TRL ``GRPOConfig`` as this engine's :class:`~elastic_reset.rl.config.TrainConfig`: the settings a GRPO user
already has, carried over as README's "Coming from TRL's ``GRPOConfig``" table maps them.

What GRPO counts in optimizer steps (``max_steps``, ``save_steps``, ``eval_steps``, ``warmup_steps``) becomes
iterations here (one generation batch each, ``num_iterations`` × its optimizer steps); the batch sizes become
``prompts_per_step`` × ``samples_per_prompt`` and ``minibatch_size`` (completions per optimizer step). The
algorithm is ``rloo`` with GRPO's ``scale_rewards``; β goes into the reward (papers' eq. 1), not the loss. A setting
this engine cannot honour is refused in one line naming it, never dropped; ``use_vllm`` and the other settings of
*how* TRL generates or stores are not about the method and are ignored. ``trl`` itself is not imported.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from elastic_reset.errors import ConfigError
from elastic_reset.rl.config import SCHEDULERS, TrainConfig, config_from_dict
DEFAULT_PROJECT = "huggingface"
"""transformers' default ``project``: left to the trackers' own default here."""


def config_from_grpo(args: Any, overrides: list[str] = ()) -> TrainConfig:
    """The :class:`TrainConfig` that trains as ``args`` (a ``trl.GRPOConfig``) says, then ``overrides`` (``--set``
    items: the model, the task, the drift-control method, ...). ``args.max_steps`` must be set: GRPO's epochs over
    a dataset have no counterpart here."""
    def get(name: str, default: Any = None) -> Any:
        value = getattr(args, name, default)
        return getattr(value, "value", value)  # transformers' enums (SchedulerType, IntervalStrategy)

    def refuse(name: str, why: str) -> None:
        raise ConfigError(f"GRPOConfig.{name}: {why}")

    k = int(get("num_generations"))
    per_step = int(get("per_device_train_batch_size")) * int(get("gradient_accumulation_steps", 1)) \
        * int(get("world_size", 1))
    generation = int(get("generation_batch_size") or per_step)
    if generation % k:
        refuse("generation_batch_size", f"{generation} completions are not whole groups of num_generations={k}")
    if generation % per_step:
        refuse("steps_per_generation", f"a generation batch of {generation} completions is not a whole number of "
                                       f"optimizer steps of {per_step}")
    epochs = int(get("num_iterations", 1))
    updates = epochs * generation // per_step  # optimizer steps an iteration
    max_steps = int(get("max_steps", -1))
    if max_steps <= 0:
        refuse("max_steps", "set the number of optimizer steps; epochs over a dataset (num_train_epochs) have no "
                            "counterpart here, where a run is a number of iterations")

    def iterations(name: str, value: float | None) -> int:
        """Optimizer steps (transformers: a value under 1 is that fraction of max_steps, rounded up) as
        iterations."""
        optimizer_steps = math.ceil(value * max_steps) if value is not None and 0 < value < 1 else int(value or 0)
        if optimizer_steps % updates:
            refuse(name, f"{optimizer_steps} optimizer steps are not whole iterations of {updates}")
        return optimizer_steps // updates
    for name, ok, why in [
        ("adam_beta1", get("adam_beta1", 0.9) == 0.9, "only 0.9 here"),
        ("epsilon_high", get("epsilon_high") in (None, get("epsilon")), "asymmetric clipping is not built here"),
        ("loss_type", get("loss_type", "dapo") in ("dapo", "bnpo"), "only a token-level mean of the loss (dapo, "
                                                                    "bnpo) is built here"),
        ("optim", str(get("optim", "adamw_torch")).startswith("adamw_torch"), "only AdamW (adamw_torch) here"),
        ("lr_scheduler_type", get("lr_scheduler_type", "linear") in SCHEDULERS, f"one of {', '.join(SCHEDULERS)}"),
        ("top_entropy_quantile", get("top_entropy_quantile", 1.0) == 1.0, "not built here"),
        ("delta", get("delta") is None, "two-sided clipping is not built here"),
        ("generation_kwargs", not get("generation_kwargs"), "set the sampling.* settings instead"),
        ("sync_ref_model", not get("sync_ref_model"), "TR-DPO's reference sync is method.name anchor with "
                                                      "method.preset ref_sync"),
        ("reward_weights", get("reward_weights") is None, "give it to the prompts task: get_task('prompts', ..., "
                                                          "reward_weights=[...])"),
        ("chat_template_kwargs", not get("chat_template_kwargs"), "give it to the prompts task: get_task("
                                                                  "'prompts', ..., chat_template_kwargs={...})"),
        ("warmup_ratio", not get("warmup_ratio", 0.0), "give warmup_steps instead"),
    ]:
        if not ok:
            refuse(name, f"{get(name)!r}: {why}")

    save = get("save_strategy", "steps")
    evaluate = get("eval_strategy", "no")
    for name, value in (("save_strategy", save), ("eval_strategy", evaluate)):
        if value not in ("steps", "no"):
            refuse(name, f"{value!r}: only steps (or no) has a counterpart here")
    scale = get("scale_rewards", "group")
    scale = {True: "group", False: "none"}.get(scale, scale)
    if scale not in ("group", "batch", "none"):
        refuse("scale_rewards", f"{scale!r}: expected group, batch or none")
    beta = float(get("beta", 0.0))
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
                 "max_grad_norm": get("max_grad_norm") or None,  # 0: no clipping, as in transformers
                 "weight_decay": float(get("weight_decay", 0.0)),
                 "adam_beta2": float(get("adam_beta2", 0.999)), "adam_eps": float(get("adam_epsilon", 1e-8)),
                 "clip_range": float(get("epsilon", 0.2)), "scale_rewards": "group" if scale == "group" else "none",
                 "whiten_advantages": scale == "batch",
                 "mask_truncated_completions": bool(get("mask_truncated_completions", False))},
        "kl": {"coef": beta, "target": None, "estimator": "k3"},
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
    return config_from_dict(data, list(overrides))
