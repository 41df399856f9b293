"""Elastic Reset under PyTorch FSDP2: each rank keeps the EMA and θ0 of its shard, a reset
writes its own shard, and the gathered weights equal the single-process run. Two gloo processes on the CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from fsdp_reference import assert_anchors_match, make_model, train  # noqa: E402
from helpers import free_port  # noqa: E402

from elastic_reset.core import ElasticReset  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fsdp")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "--master_port", str(free_port()), str(ROOT / "tests" / "fsdp_worker.py"), str(out)],
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_gathered_weights_after_resets_equal_the_single_process_run(sharded):
    result = torch.load(sharded / "fsdp.pt", weights_only=False)
    model = make_model()
    distances, er, _ = train(model)
    weights = {n: p.detach() for n, p in model.named_parameters()}
    assert result["sharded"] and result["resets"] == er.num_resets == 2
    for name, tensor in weights.items():
        torch.testing.assert_close(result["weights"][name], tensor, rtol=1e-5, atol=1e-6)
    # ‖θ − θ̄‖ over the whole parameters, not one rank's shard.
    assert result["distances"] == pytest.approx(distances, rel=1e-5)


def test_anchor_pulls_on_shards_equal_the_single_process_run(sharded):
    assert_anchors_match(torch.load(sharded / "fsdp.pt", weights_only=False))


def test_the_trl_callback_saves_and_resumes_each_ranks_shards(sharded):
    assert torch.load(sharded / "fsdp.pt", weights_only=False)["callback_resumed"]
    assert sorted(p.name for p in (sharded / "checkpoint-5").iterdir()) == ["elastic_reset.rank0.pt",
                                                                           "elastic_reset.rank1.pt"]


def test_each_rank_keeps_its_own_shard(sharded):
    states = [torch.load(sharded / f"state{r}.pt", weights_only=False) for r in (0, 1)]
    _, er, _ = train(make_model())
    full = er.state_dict()
    for i, name in enumerate(full["names"]):
        shards = [s["copies"]["ema"][i] for s in states]
        whole = full["copies"]["ema"][i]
        if whole.dim() == 0 or whole.shape[0] == 1:
            continue
        assert shards[0].numel() < whole.numel()  # a shard, not a replica
        torch.testing.assert_close(torch.cat(shards), whole, rtol=1e-5, atol=1e-6)


def test_fsdp1_and_zero3_parameters_no_optimizer_steps_are_refused():
    p = torch.nn.Parameter(torch.zeros(3))
    p.ds_id = 7  # what DeepSpeed ZeRO-3 marks its partitioned parameters with; no ZeRO optimizer holds its master
    with pytest.raises(ValueError, match="ZeRO-3 but no ZeRO optimizer holds its fp32 master"):
        ElasticReset([("w", p)], reset_every=2)

    class FullyShardedDataParallel(torch.nn.Module):  # FSDP1's wrapper, by name
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.Linear(2, 2)

    with pytest.raises(ValueError, match="FSDP1"):
        ElasticReset(FullyShardedDataParallel(), reset_every=2)
