"""Data-parallel training: two CPU processes under ``accelerate launch`` (gloo).

Each launch starts two Python processes, so these tests take tens of seconds; they run the tiny config."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch
from helpers import free_port

from elastic_reset.io import read_metrics
from elastic_reset.rl.config import ConfigError
from elastic_reset.rl import ops
from elastic_reset.rl.distributed import DataParallel, mean_record

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yaml"
WORKER = ROOT / "tests" / "distributed_worker.py"
# Elastic Reset every 2 iterations over 6, the EMA updated at every optimizer step (2 epochs x 2 minibatches),
# PPO with whitened advantages and the adaptive KL controller: every cross-rank statistic is exercised.
SETTINGS = ["steps=6", "checkpoint_every=2", "eval.every=3", "method.reset_every=2"]


def _launch(*args, processes: int = 2) -> list[str]:
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            "--main_process_port", str(free_port()), *map(str, args)]


def _env() -> dict[str, str]:
    return {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}


def _run(args, timeout=300):
    done = subprocess.run(args, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dp") / "run"
    _run(_launch(WORKER, TINY, out, *SETTINGS))
    return out


def test_ranks_share_the_batch_and_agree_on_weights_ema_and_resets(two_rank_run):
    ranks = [torch.load(two_rank_run / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    assert ranks[0]["world_size"] == ranks[1]["world_size"] == 2
    # Each rank trained on its own half of every batch (2 of the 4 prompts, each sampled twice).
    for mine, theirs in zip(ranks[0]["prompts"], ranks[1]["prompts"]):
        assert len(mine) == len(theirs) == 4 and set(mine).isdisjoint(theirs)
    # The same gradient every step, so the same weights, the same EMA and θ0, the same resets, on both ranks.
    for name, tensor in ranks[0]["trainable"].items():
        torch.testing.assert_close(ranks[1]["trainable"][name], tensor, rtol=0, atol=0)
    ema0, ema1 = ranks[0]["ema"], ranks[1]["ema"]
    for key in ("ema", "init"):
        for a, b in zip(ema0["copies"][key], ema1["copies"][key]):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert ema0["num_pulls"] == ema1["num_pulls"] == 3
    assert ema0["num_steps"] == ema1["num_steps"] == 6


def test_trls_dapo_divisor_and_the_adaptive_entropy_weight_are_the_whole_batchs_on_two_ranks(tmp_path):
    out = tmp_path / "run"
    _run(_launch(WORKER, TINY, out, "--drop-first-on-rank0", *SETTINGS, "algo.loss_aggregation=batch_token",
                 "algo.entropy_target=0.5", "algo.entropy_coef=0.01", "bad_reward=drop"))
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    calls = [r["losses"] for r in ranks]
    assert len(calls[0]) == len(calls[1]) == 6 * 4  # 6 iterations of 2 epochs x 2 minibatches
    for step in range(6):
        mine, theirs = ([c for c in rank if c[0] == step] for rank in calls)
        assert sum(c[1] for c in mine) < sum(c[1] for c in theirs)  # rank 0 dropped a sample
        divisors = {c[2] for c in mine + theirs}
        # one divisor for every minibatch of both ranks: their real tokens per minibatch and rank
        assert len(divisors) == 1 and divisors.pop() == pytest.approx(sum(c[1] for c in mine + theirs) / 8)
    assert ranks[0]["entropy_ctl"] == ranks[1]["entropy_ctl"] and ranks[0]["entropy_ctl"]["coef"] != 0.01


def test_rank_zero_alone_writes_metrics_and_checkpoints(two_rank_run):
    records = read_metrics(two_rank_run / "metrics.jsonl")
    train = [r["step"] for r in records if "reward" in r]
    evals = [r["step"] for r in records if "eval/reward" in r]
    assert train == [1, 2, 3, 4, 5, 6] and evals == [0, 3, 6]  # once each: not once per rank
    assert [r["step"] for r in records if "reset" in r] == [2, 4, 6]
    state = torch.load(two_rank_run / "checkpoints" / "step_0000006.pt", weights_only=False)
    assert state["world_size"] == 2 and len(state["rank_rngs"]) == 2
    assert not torch.equal(state["rank_rngs"][0]["generator"], state["rank_rngs"][1]["generator"])


def _alive(process):
    """Whether a process still runs (a zombie nobody reaps counts as dead)."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_resume_after_sigkill_matches_the_uninterrupted_run(two_rank_run, tmp_path):
    killed = tmp_path / "killed"
    proc = subprocess.Popen(_launch(WORKER, TINY, killed, *SETTINGS), env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics, deadline = killed / "metrics.jsonl", time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and any(r.get("step", 0) >= 3 and "reward" in r for r in read_metrics(metrics)):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    # The launcher and both ranks at once (torchrun starts the ranks in sessions of their own: kill by ancestry).
    launcher = psutil.Process(proc.pid)
    family = [launcher, *launcher.children(recursive=True)]
    assert len(family) >= 3, "expected the launcher and two ranks"
    for process in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(signal.SIGKILL)
    proc.wait()
    # SIGKILL is delivered asynchronously: give the ranks a moment to die.
    deadline = time.time() + 30
    while any(map(_alive, family[1:])) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(map(_alive, family[1:])), "a rank survived SIGKILL"
    assert not (killed / "checkpoints" / "step_0000006.pt").exists()
    _run(_launch(WORKER, TINY, killed, *SETTINGS))

    def without_times(path):
        return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in read_metrics(path)]

    assert without_times(killed / "metrics.jsonl") == without_times(two_rank_run / "metrics.jsonl")
    resumed = torch.load(killed / "rank1.pt", weights_only=False)["trainable"]
    full = torch.load(two_rank_run / "rank1.pt", weights_only=False)["trainable"]
    for name, tensor in full.items():
        torch.testing.assert_close(resumed[name], tensor, rtol=0, atol=0)


def test_a_checkpoint_resumes_only_on_as_many_processes(two_rank_run, tmp_path):
    from elastic_reset.rl.config import load_config
    from elastic_reset.rl.trainer import RLTrainer

    trainer = RLTrainer(load_config(TINY, SETTINGS), tmp_path / "one")
    state = torch.load(two_rank_run / "checkpoints" / "step_0000006.pt", weights_only=False)
    with pytest.raises(ConfigError, match="2 process.*--num_processes 2"):
        trainer.load_state_dict(state)


def test_the_cli_leaves_the_process_group_it_ran_in(tmp_path):
    # A gloo group left for the interpreter's exit can abort a finished rank (SIGABRT: a CI run failed so).
    from elastic_reset.cli import main

    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert main(["train", str(TINY), "--print-config"]) == 0
        assert not torch.distributed.is_initialized()
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def test_a_group_the_library_joined_is_left_at_exit_without_a_call(tmp_path):
    # A user's script under `accelerate launch` that trains and ends without leave_process_group().
    script = tmp_path / "user_script.py"
    script.write_text("import atexit, torch\n"
                      "from elastic_reset.rl.distributed import DataParallel\n"
                      "atexit.register(lambda: print('left:', not torch.distributed.is_initialized(), flush=True))\n"
                      "assert DataParallel.from_environment('cpu').world_size == 2\n")
    done = _run(_launch(script), timeout=120)
    assert done.stdout.count("left: True") == 2, done.stdout


def test_a_batch_must_split_evenly_over_the_processes():
    with pytest.raises(ConfigError, match="algo.prompts_per_step: 5 does not split evenly over 2 processes"):
        DataParallel(world_size=2).check_divides("algo.prompts_per_step", 5)
    assert DataParallel(world_size=2, rank=1).shard(list("abcd")) == ["c", "d"]


class _ThreadRank(DataParallel):
    """One of two ranks run as threads of this process: ``sum`` adds both ranks' numbers, as the all-reduce does."""

    board: tuple = ()

    def sum(self, values: list[float]) -> list[float]:
        slots, barrier = self.board
        slots[self.rank] = list(values)
        barrier.wait()
        total = [a + b for a, b in zip(*slots)]
        barrier.wait()  # both have read before either writes its next numbers
        return total


def _whiten_on_two_ranks(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Whiten with the first half of the rows on rank 0 and the second on rank 1; the two halves, concatenated."""
    board, halves, share = ([None, None], threading.Barrier(2, timeout=30)), [None, None], x.shape[0] // 2

    def rank(r: int) -> None:
        dp = _ThreadRank(world_size=2, rank=r)
        dp.board = board
        halves[r] = dp.whiten(x[r * share:(r + 1) * share], mask[r * share:(r + 1) * share])

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return torch.cat(halves)


def test_data_parallel_whitening_is_the_whitening_of_the_whole_batch():
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))
    mask = (torch.arange(5)[None] < torch.tensor([[5], [3], [1], [4], [2], [5]])).float()
    torch.testing.assert_close(_whiten_on_two_ranks(x, mask), ops.whiten(x, mask), rtol=1e-5, atol=1e-5)
    # Far from zero: the mean of squared deviations, not E[x²] − E[x]², which cancels in float32 and fails this.
    far = 100.0 + 0.1 * x
    torch.testing.assert_close(_whiten_on_two_ranks(far, mask), ops.whiten(far, mask), rtol=1e-3, atol=1e-3)
    # One process: ops.whiten itself, bit for bit.
    assert torch.equal(DataParallel().whiten(x, mask), ops.whiten(x, mask))


class _GatherRank(_ThreadRank):
    """A thread rank whose ``gather_object`` hands every rank both ranks' objects, as accelerate's does."""

    def gather_object(self, obj):
        slots, barrier = self.board
        slots[self.rank] = obj
        barrier.wait()
        both = list(slots)
        barrier.wait()
        return both


def test_the_high_entropy_tokens_are_the_whole_minibatchs_on_two_ranks():
    entropy = torch.rand(6, 5, generator=torch.Generator().manual_seed(1))
    mask = (torch.arange(5)[None] < torch.tensor([[5], [3], [1], [4], [2], [5]])).float()
    board, halves = ([None, None], threading.Barrier(2, timeout=30)), [None, None]

    def rank(r: int) -> None:
        dp = _GatherRank(world_size=2, rank=r)
        dp.board = board
        halves[r] = ops.high_entropy_mask(entropy[3 * r:3 * r + 3], mask[3 * r:3 * r + 3], 0.3, dp.cat)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert torch.equal(torch.cat(halves), ops.high_entropy_mask(entropy, mask, 0.3))


def test_one_record_from_the_ranks_averages_numbers_and_keeps_events():
    merged = mean_record([{"step": 3, "reward": 1.0, "dropped": 0, "reset": {"index": 1}},
                          {"step": 3, "reward": 0.0, "dropped": 2, "reset": {"index": 1}}])
    assert merged == {"step": 3, "reward": 0.5, "dropped": 1, "reset": {"index": 1}}


def test_compare_runs_its_cells_data_parallel(tmp_path):
    grid = tmp_path / "grid"
    done = _run(_launch("-m", "elastic_reset.cli", "compare", TINY, "--out", grid, "--methods", "elastic_reset",
                        "--seeds", "1", "--set", "steps=2", "--set", "eval.every=2", "--set", "method.reset_every=1"))
    assert done.stdout.count("grid written to") == 1  # rank 0 reports; rank 1 trained and stayed quiet
    records = read_metrics(grid / "elastic_reset" / "seed0" / "metrics.jsonl")
    assert [r["step"] for r in records if "reward" in r] == [1, 2]
    assert torch.load(grid / "elastic_reset" / "seed0" / "checkpoints" / "step_0000002.pt",
                      weights_only=False)["world_size"] == 2
    assert (grid / "summary.json").is_file()
