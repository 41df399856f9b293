"""Points on the reward-vs-drift plane without more RL: the weights θ_a + λ·(θ − θ_a) between a run's
final policy θ and an anchor θ_a, evaluated exactly as the run's own evaluations (same prompts, same noise).

Toward the initial model, λ in (0, 1) is model averaging (Lin et al. 2023, arXiv 2309.06256: "heterogeneous model
averaging" of θ0 and θ) and λ > 1 is ExPO (Zheng et al. 2024, arXiv 2404.16792: θ0 + (1 + α)(θ − θ0)); toward the
EMA of an Elastic Reset run, the same with θ̄ as the anchor. With LoRA, the initial model is the base (the run's KL
reference) and the point is W0 + λ·ΔW exactly: the adapters' B is scaled by λ, not A and B both (that would scale
ΔW = B·A by λ²). Toward the EMA (of A and B), the point W0 + B̄Ā + λ(BA − B̄Ā) has rank 2r: it is evaluated with a
second adapter holding (1 − λ)·B̄Ā active beside the policy's λ·BA.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch

from elastic_reset.errors import ConfigError, RunFileError
from elastic_reset.evaluation.runs import SWEEP_FILE
from elastic_reset.io import atomic_write_text, read_metrics
from elastic_reset.rl.config import load_config

TOWARD = ("init", "ema")


@contextmanager
def interpolated(trainer, lam: float, toward: str = "init") -> Iterator[None]:
    """The trainer's model holds θ_a + λ·(θ − θ_a) inside the block; its own weights are restored exactly after."""
    params = {n: p for n, p in trainer.model.named_parameters() if p.requires_grad}
    saved = {n: p.detach().clone() for n, p in params.items()}
    second_adapter = nullcontext()
    with torch.no_grad():
        if trainer.is_lora:
            for name, p in params.items():
                if ".lora_B." in name:
                    p.mul_(lam)
            if toward == "ema":
                second_adapter = _ema_adapter(trainer, _anchor(trainer, toward, params), 1.0 - lam)
        else:
            anchor = _anchor(trainer, toward, params)
            for name, p in params.items():
                a = anchor[name].to(p.device, p.dtype)
                p.copy_(a + lam * (saved[name] - a))
    try:
        with second_adapter:
            yield
    finally:
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(saved[name])


EMA_ADAPTER = "sweep_ema"
"""The adapter that holds (1 − λ)·B̄Ā beside the policy's own λ·BA while a LoRA point toward the EMA is evaluated."""


@contextmanager
def _ema_adapter(trainer, ema: dict[str, torch.Tensor], weight: float) -> Iterator[None]:
    """A second adapter, active beside the policy's, holding ``weight``·B̄Ā (Ā, B̄: the EMA of the adapters): the
    sum W0 + λ·BA + (1 − λ)·B̄Ā is θ̄ + λ(θ − θ̄) exactly, a rank-2r update that no single rank-r adapter holds. The
    KL reference (adapters off) stays W0; the adapter is deleted and the trainable flags restored after."""
    model = trainer.model
    own = model.active_adapter
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    model.add_adapter(EMA_ADAPTER, model.peft_config[own])
    try:
        with torch.no_grad():
            for name, value in ema.items():
                target = model.get_parameter(name.replace(f".{own}.", f".{EMA_ADAPTER}."))
                scale = weight if ".lora_B." in name else 1.0
                target.copy_(scale * value.to(target.device, target.dtype))
        model.base_model.set_adapter([own, EMA_ADAPTER])
        yield
    finally:
        model.base_model.set_adapter(own)
        model.delete_adapter(EMA_ADAPTER)
        for name, p in model.named_parameters():
            p.requires_grad_(flags[name])


def _anchor(trainer, toward: str, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if toward == "ema":
        if not trainer.method.keeps_ema:
            raise ConfigError(f"--toward ema: method {trainer.config.method.name!r} keeps no EMA")
        ema = trainer.method.ema
        return dict(zip(ema.names, ema.ema))
    with trainer.reference.model() as ref:  # the frozen initial copy (full fine-tuning)
        initial = dict(ref.named_parameters())
    missing = [n for n in params if n not in initial]
    if missing:
        raise RunFileError(f"the initial model has no parameter {missing[0]!r}")
    return {n: initial[n].detach() for n in params}


def sweep_run(run_dir: str | Path, lambdas: Sequence[float], toward: str = "init") -> list[dict[str, Any]]:
    """Evaluate the run's latest checkpoint interpolated toward ``toward`` at each λ; the records (``lambda``,
    ``toward``, ``step`` and the ``eval/*`` metrics) are written to ``RUN/sweep.jsonl``, replacing earlier ones of
    the same (anchor, λ) (the evaluation is deterministic: the same point again). Returns this call's records."""
    from elastic_reset.rl.trainer import RLTrainer

    if toward not in TOWARD:
        raise ConfigError(f"--toward: expected one of {TOWARD}, got {toward!r}")
    if not lambdas or any(not isinstance(x, (int, float)) or x != x for x in lambdas):
        raise ConfigError(f"--lambdas: expected numbers, got {list(lambdas)!r}")
    run_dir = Path(run_dir)
    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        raise RunFileError(f"{config_path}: missing; {run_dir} is not a run directory")
    trainer = RLTrainer(load_config(config_path), run_dir, resume=True)
    try:
        if trainer.config.eval.every == 0:
            raise ConfigError(f"{config_path}: eval.every is 0, so the run has no evaluations to compare with")
        records = []
        for lam in lambdas:
            with interpolated(trainer, float(lam), toward):
                record = trainer.evaluator.evaluate_prompts("eval", against="eval")
            records.append({"lambda": float(lam), "toward": toward, "step": trainer.step, **record})
    finally:
        trainer.close()
    path = run_dir / SWEEP_FILE
    kept = [r for r in (read_metrics(path) if path.is_file() else [])
            if (r.get("toward"), r.get("lambda")) not in {(toward, float(x)) for x in lambdas}]
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in kept + records))
    return records
