"""Data parallelism for the engine: N processes started by ``accelerate launch --num_processes N`` (or
``torchrun``), each sampling its share of every batch, one model replica each.

What stays identical on every rank, and why: every rank starts from the same weights (the same seeds), every
optimizer step applies the same gradient (the mean over ranks, all-reduced), and every statistic that feeds back
into training (the moving-average baseline, advantage whitening, the adaptive KL controller) is computed over the
whole batch, not the rank's share. The EMA and the resets of Elastic Reset (§3) are then the same computation on
the same numbers on every rank: no broadcast is needed, and the tests check that they agree.

Why not ``Accelerator.prepare`` (DDP): the engine calls the policy outside one forward of one module (the KV-cache
sampler, the adapter-disabled reference, a value head on the hidden states, the multitask loss); DDP's reducer
expects every rank to run the same grad-enabled forwards through its wrapper. One flattened all-reduce of the
trainable gradients per optimizer step is the average DDP would compute; its cost is one collective over the
trainable tensors (LoRA adapters: a few MB), after the backward instead of overlapped with it.

Each rank's loss is the mean over its own tokens (DDP's convention), so with unequal response lengths across ranks
an update weights tokens slightly differently from one process holding the whole batch.
"""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass
from typing import Any

import torch

from elastic_reset.errors import ConfigError


def launched_world_size() -> int:
    """How many processes the launcher started (1 without ``accelerate launch`` / ``torchrun``)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process() -> bool:
    """Rank 0 of a launched run, or a process that was not launched as one of several."""
    return int(os.environ.get("RANK", "0")) == 0


def leave_process_group(wait: bool = True) -> None:
    """Destroy the process group this process joined (a no-op where none was joined), once every rank is done with
    it when ``wait``. A gloo group left for the interpreter's exit can abort the process with "terminate called
    without an active exception" (its worker threads outlive the interpreter: pytorch/pytorch#190489), failing a
    finished run. At exit ``wait=False``: a rank that failed must not wait for ranks that will never arrive."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        if wait:
            torch.distributed.barrier()
        torch.distributed.destroy_process_group()


@dataclass
class DataParallel:
    """This process's place among the data-parallel ranks, and the collectives the trainer needs. With one
    process every method is the identity, and nothing distributed is imported."""

    world_size: int = 1
    rank: int = 0
    local_rank: int = 0

    @classmethod
    def from_environment(cls, device: str) -> DataParallel:
        """Join the process group the launcher set up: NCCL where the policy is on CUDA, gloo on the CPU."""
        if launched_world_size() <= 1:
            return cls()
        from accelerate import PartialState

        joined_here = not torch.distributed.is_initialized()
        state = PartialState(cpu=not device.startswith("cuda"))
        if joined_here:
            # Whoever opens the group closes it: a script of the user's own that trains under `accelerate launch`
            # and never calls leave_process_group() would otherwise leave it to the interpreter's exit (above).
            atexit.register(leave_process_group, wait=False)
        return cls(state.num_processes, state.process_index, state.local_process_index)

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0 writes the run's files (config, metrics, checkpoints) and evaluates."""
        return self.rank == 0

    def device(self, resolved: torch.device) -> torch.device:
        """One GPU per process: ``cuda`` becomes this process's ``cuda:<local rank>``."""
        if self.enabled and resolved.type == "cuda" and resolved.index is None:
            return torch.device("cuda", self.local_rank)
        return resolved

    def check_divides(self, key: str, value: int) -> None:
        if value % self.world_size:
            raise ConfigError(f"{key}: {value} does not split evenly over {self.world_size} processes; choose a "
                              f"multiple of {self.world_size}")

    def shard(self, items: list) -> list:
        """This rank's contiguous share of a batch every rank drew identically."""
        share = len(items) // self.world_size
        return items[self.rank * share:(self.rank + 1) * share]

    # --------------------------------------------------------------------------------------------- collectives
    def _all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        from accelerate.utils import reduce

        return reduce(tensor, reduction="sum")

    def average_gradients(self, params: list[torch.Tensor]) -> None:
        """Replace each gradient by its mean over ranks (one flattened all-reduce). A parameter without a gradient
        on this rank counts as zero, so every rank reduces the same flat layout."""
        if not self.enabled:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1).float() for g in grads])
        flat = self._all_reduce(flat) / self.world_size
        offset = 0
        for p, g in zip(params, grads):
            n = g.numel()
            p.grad = flat[offset:offset + n].view_as(g).to(g.dtype)
            offset += n

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sums over ranks of a few numbers."""
        if not self.enabled:
            return list(values)
        return self._all_reduce(torch.tensor(values, dtype=torch.float64, device=self._collective_device())).tolist()

    def mean_of(self, x: torch.Tensor) -> float:
        """Mean of every element of ``x`` on every rank (the global batch's mean)."""
        if not self.enabled:
            return float(x.mean())
        total, count = self.sum([float(x.sum()), float(x.numel())])
        return total / count

    def whiten(self, x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
        """:func:`elastic_reset.rl.ops.whiten` with the mean and unbiased variance of the whole batch: the global
        mean first, then the global mean of squared deviations from it (two all-reduces; E[x²] − E[x]² would lose
        the variance to cancellation when it is small next to the mean)."""
        from elastic_reset.rl import ops

        if not self.enabled:
            return ops.whiten(x, mask, eps=eps)
        m = mask > 0
        xf = torch.where(m, x.float(), 0.0)
        total, count = self.sum([float(ops.masked_sum(xf, m)), float(m.sum())])
        mean = total / count
        (squares,) = self.sum([float(ops.masked_sum((xf - mean) ** 2, m))])
        var = squares / max(count - 1.0, 1.0)
        return ops.whiten_with(xf, m, mean, var, eps=eps)

    def gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""
        if not self.enabled:
            return [obj]
        from accelerate.utils import gather_object

        return gather_object([obj])

    def cat(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's ``x`` (of any length) concatenated along dim 0, in rank order, on ``x``'s device."""
        if not self.enabled:
            return x
        return torch.cat([t.to(x.device) for t in self.gather_object(x.cpu())])

    def barrier(self) -> None:
        if self.enabled:
            torch.distributed.barrier()

    def _collective_device(self) -> torch.device:
        # NCCL reduces CUDA tensors only; gloo CPU ones.
        return torch.device("cuda", self.local_rank) if torch.distributed.get_backend() == "nccl" else \
            torch.device("cpu")


def mean_record(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One metrics record from every rank's: numbers averaged over ranks (each rank's share is the same size),
    anything else (a reset event, which is identical everywhere) taken from rank 0."""
    out = dict(records[0])
    for key, value in records[0].items():
        if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
            values = [r[key] for r in records if isinstance(r.get(key), (int, float))]
            mean = sum(values) / len(values)
            out[key] = mean if isinstance(value, float) else (int(mean) if mean == int(mean) else mean)
    return out
