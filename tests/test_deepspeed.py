"""Elastic Reset and the anchors under DeepSpeed ZeRO-2 and ZeRO-3: θ is the optimizer's fp32 masters (a reset
written to the model's weights alone would be undone by the next step), ZeRO-3's copies are each rank's partitions,
and the gathered weights equal the single-process run; in a transformers Trainer with a DeepSpeed config the
callback saves and resumes them. Two processes on DeepSpeed's CPU accelerator (gloo)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

if importlib.util.find_spec("deepspeed") is None:  # not imported here: the workers import it
    pytest.skip("DeepSpeed is an optional extra (pip install elastic-reset[deepspeed])", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).parent))
from fsdp_reference import assert_anchors_match, make_model, train  # noqa: E402
from helpers import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", params=[(2, 0), (3, 100_000), (3, 0)],
                ids=["zero2", "zero3", "zero3-unpersisted"])
def zero(request, tmp_path_factory) -> tuple[int, Path]:
    """One run per ZeRO set-up: stage 2; stage 3 with every parameter gathered between steps (small ones persist,
    DeepSpeed's default) and with none (each forward gathers from the partitions). Each also trains with the
    callback in a Trainer."""
    stage, persist = request.param
    out = tmp_path_factory.mktemp(f"zero{stage}")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu",
           "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT / "src"), os.environ.get("PYTHONPATH"))))}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "--master_port", str(free_port()), str(ROOT / "tests" / "deepspeed_worker.py"),
                           str(stage), str(out), str(persist)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return stage, out


def test_resets_on_the_masters_give_the_single_process_weights(zero):
    stage, out = zero
    result = torch.load(out / f"zero{stage}.pt", weights_only=False)
    model = make_model()
    distances, er, _ = train(model)
    assert result["zero"] == (3 if stage == 3 else 1) and result["sharded"] == (stage == 3)
    assert result["resets"] == er.num_resets == 2
    assert result["refused"].startswith("reset_optimizer: DeepSpeed ZeRO keeps the optimizer's state")
    for name, tensor in model.named_parameters():
        torch.testing.assert_close(result["weights"][name], tensor.detach(), rtol=1e-5, atol=1e-6)
    assert result["distances"] == pytest.approx(distances, rel=1e-5)  # over the whole parameters


def test_anchor_pulls_on_the_masters_give_the_single_process_weights(zero):
    stage, out = zero
    assert_anchors_match(torch.load(out / f"zero{stage}.pt", weights_only=False))


def test_each_rank_keeps_whole_masters_under_zero2_and_its_partitions_under_zero3(zero):
    stage, out = zero
    states = [torch.load(out / f"zero{stage}_state{r}.pt", weights_only=False) for r in (0, 1)]
    whole = train(make_model())[1].state_dict()["copies"]["ema"]
    for i, full in enumerate(whole):
        parts = [s["copies"]["ema"][i] for s in states]
        if stage == 2:  # parameters whole on every rank
            assert all(torch.allclose(p, full, rtol=1e-5, atol=1e-6) for p in parts)
        else:  # flat partitions, the last padded
            assert parts[0].dim() == 1 and parts[0].numel() < full.numel()
            torch.testing.assert_close(torch.cat(parts)[:full.numel()], full.flatten(), rtol=1e-5, atol=1e-6)


def test_the_callback_in_a_deepspeed_trainer_resumes_each_ranks_state_exactly(zero):
    stage, out = zero
    for rank in (0, 1):
        result = torch.load(out / f"trainer{rank}.pt", weights_only=False)
        assert result["zero"] == (3 if stage == 3 else 1) and result["resets"] == (2, 2)
        run, resumed = result["ema"]
        assert all(torch.equal(a, b) for a, b in zip(run, resumed))
        assert all(torch.equal(result["weights"][0][k], result["weights"][1][k]) for k in result["weights"][0])
    files = sorted(p.name for p in (out / "run" / "checkpoint-2").glob("elastic_reset*.pt"))
    assert files == (["elastic_reset.rank0.pt", "elastic_reset.rank1.pt"] if stage == 3 else ["elastic_reset.pt"])
    assert (out / "run" / "ema").is_dir() == (stage == 2)  # ZeRO-3's EMA stays in the per-rank files
