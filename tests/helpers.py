"""Helpers shared by several test files (a plain module: pytest collects no test from it).

Test files import from here, never from each other: ``from helpers import tiny_config``.
"""

from __future__ import annotations

from pathlib import Path

import torch
import yaml

from elastic_reset.rl.config import config_from_dict

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yaml"


# ------------------------------------------------------------------------------------------------ configs
def tiny_config(*overrides: str, **sections):
    """The tiny config, 3 iterations, no checkpoints, no evaluation, with ``sections`` merged and ``overrides``."""
    data = yaml.safe_load(TINY.read_text())
    data.update({"steps": 3, "checkpoint_every": 0, "eval": {"every": 0}})
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return config_from_dict(data, list(overrides))


REHEARSAL = ("rehearsal.prompts=12", "rehearsal.clusters=2", "rehearsal.top_k=3", "rehearsal.batch=3")
"""A small Selective Rehearsal set on the tiny task: 12 candidates, 2 clusters, the 3 best of each, 3 a step."""

LEARN = {"steps": 30, "checkpoint_every": 0, "eval": {"every": 30, "num_prompts": 8},
         "algo": {"name": "rloo", "lr": 1e-2, "epochs": 1}, "method": {"name": "none"},
         "kl": {"coef": 0.0, "target": None}}
"""RLOO (the fastest learner here) without a KL penalty unless a test adds one, so each method's effect is its own."""


def learning_config(*overrides: str):
    """The tiny config with :data:`LEARN` merged in: 30 iterations that learn, evaluated at 0 and 30."""
    data = yaml.safe_load(TINY.read_text())
    for key, value in LEARN.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return config_from_dict(data, list(overrides))


# ------------------------------------------------------------------------------------------------ processes
def sigkill_after_step(proc, metrics: Path, step: int, timeout: float) -> None:
    """SIGKILL the training process ``proc`` once ``metrics`` holds an iteration record at ``step`` or later (the
    test fails if the run ends first, or after ``timeout`` seconds); returns when it is dead."""
    import signal
    import time

    from elastic_reset.io import read_metrics

    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and any(r.get("step", 0) >= step and "reward" in r for r in read_metrics(metrics)):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()


# ------------------------------------------------------------------------------------------------ records
def evals(records):
    """``{step: record}`` of the evaluation records."""
    return {r["step"]: r for r in records if "eval/reward" in r}


def without_times(records):
    """The records without their ``time/`` and ``memory/`` keys (which differ between otherwise identical runs)."""
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "memory/"))} for r in records]


def trainable(trainer):
    """A copy of the trainer's trainable parameters by name."""
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


# ------------------------------------------------------------------------------------------------ sampling
def independent_top_p(logits: torch.Tensor, p: float, min_keep: int = 1) -> torch.Tensor:
    """The smallest set of most likely tokens with cumulative probability >= p (at least ``min_keep``), computed
    by a descending walk rather than Hugging Face's ascending one."""
    probs, order = torch.softmax(logits.double(), -1).sort(-1, descending=True)
    before = probs.cumsum(-1) - probs  # mass of the strictly more likely tokens
    keep_sorted = before < p
    keep_sorted[..., :min_keep] = True
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


# ------------------------------------------------------------------------------------------- a finished run
RUN_SETTINGS = ["steps=4", "checkpoint_every=2", "eval.every=2", "progress=false"]
"""The tiny config as a run to damage and resume: 4 iterations, checkpoints at 2 and 4 (both kept), evaluations at
0, 2 and 4 (conftest's ``finished`` fixture trains it once)."""


def run_config(*overrides: str):
    """The tiny config with :data:`RUN_SETTINGS` and ``overrides``."""
    return config_from_dict(yaml.safe_load(TINY.read_text()), [*RUN_SETTINGS, *overrides])


def step_file(run: Path, step: int) -> Path:
    """The checkpoint file of ``step`` in run directory ``run``."""
    return run / "checkpoints" / f"step_{step:07d}.pt"


def load_script(path: Path, name: str):
    """A study's script (experiments/<study>/<file>.py, not a package) as a module, to call its functions."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    """A TCP port free on this machine now, for a test's ``torchrun`` / ``accelerate launch`` rendezvous."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
