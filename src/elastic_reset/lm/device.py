"""Where a model runs and in which precision: the one place that asks the hardware.

:func:`resolve_device` turns a device setting into a ``torch.device``; :func:`native_bf16` says whether a device
computes bf16 natively; :func:`autocast_dtype` turns an autocast setting into the dtype to autocast to (or None).
The RL engine, the reward classifier and the pretraining builders all go through these. :func:`rng_state` and
:func:`set_rng_state` keep and put back the generators sampling on a device draws from, for jobs that resume.
:func:`describe_machine` says where a process runs, for run directories and benchmark results.
"""

from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path

import torch

from elastic_reset.errors import ConfigError


def rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    """The generators that sampling on ``device`` draws from (the CPU's, and the GPU's on a GPU), to put back with
    :func:`set_rng_state` where an interrupted job resumes."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, torch.Tensor], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def resolve_device(setting: str | torch.device | None = "auto", field: str = "model.device") -> torch.device:
    """A device setting: ``auto`` (or None) is CUDA when present, else the CPU; a CUDA device on a machine without
    one is refused (naming ``field``) rather than silently replaced."""
    if setting is None or setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(setting)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"{field}: {str(setting)!r} asked for, but this PyTorch sees no CUDA device")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"{field}: {str(setting)!r} asked for, but there are only "
                              f"{torch.cuda.device_count()} CUDA device(s)")
    return device


def native_bf16(device: torch.device | str) -> bool:
    """Whether ``device`` computes bf16 natively: a CUDA GPU with bf16, or a CPU with AVX-512 BF16 / AMX. On an
    AVX2-only CPU bf16 is emulated and slower than fp32 (see BENCHMARKS.md)."""
    kind = torch.device(device).type
    if kind == "cuda":
        return torch.cuda.is_bf16_supported()
    return kind == "cpu" and torch.cpu._is_avx512_bf16_supported()


def autocast_dtype(setting: str, device: torch.device | str = "cpu") -> torch.dtype | None:
    """The autocast dtype of a setting: ``bf16``, ``none`` (None: fp32), or ``auto``: bf16 where the device has it
    natively (:func:`native_bf16`), else None."""
    if setting == "bf16":
        return torch.bfloat16
    if setting == "none":
        return None
    return torch.bfloat16 if native_bf16(device) else None


# What caps the instruction set of torch's own kernels, MKL's and oneDNN's: at AVX2, a CPU with wider vectors runs
# the kernels an AVX2-only one runs (experiments/translation_game/grid.sh)
ISA_CAPS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")


def describe_machine(device: torch.device | str | None = None) -> dict:
    """Where this process runs: the CPU's model, cores (and those this process may use), memory, AVX-512 BF16, the
    instruction set torch's kernels use and the caps set on it (:data:`ISA_CAPS`), the GPU's name when ``device`` is
    CUDA (None: when torch sees one), the platform, and the versions of Python, torch and transformers, with the
    date. A grid that spans sessions runs on several machines: each run records this."""
    import transformers

    cpu, mem_gib = platform.processor() or "unknown", None
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
        cpu = next(line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name"))
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        mem_gib = round(int(next(line for line in meminfo if line.startswith("MemTotal:")).split()[1]) / 2**20, 1)
    except (OSError, StopIteration, ValueError, IndexError):
        pass  # not Linux: the platform module's answer stands
    cuda = torch.cuda.is_available() if device is None else torch.device(device).type == "cuda"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "mem_gib": mem_gib,
        "avx512_bf16": bool(torch.cpu._is_avx512_bf16_supported()),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "isa_caps": {name: os.environ[name] for name in ISA_CAPS if name in os.environ},
        "gpu": torch.cuda.get_device_name(torch.device(device) if device is not None else None) if cuda else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }
