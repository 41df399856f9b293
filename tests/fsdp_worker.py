"""One rank of an FSDP2 run, started by tests/test_fsdp.py under ``torchrun --nproc_per_node 2`` (gloo, CPU).

    fsdp_worker.py OUT

A two-layer MLP sharded with ``fully_shard``, trained by SGD on this rank's half of a fixed batch (FSDP2 averages
the gradients, so each step is the full batch's), with Elastic Reset every 2 of 5 steps. Rank 0 writes the
gathered weights and the distances to ``OUT/fsdp.pt``; each rank writes its EMA state to ``OUT/state<r>.pt``.
Then the TRL callback saves the sharded state into ``OUT/checkpoint-5`` and a fresh callback resumes from it.
"""

import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(Path(__file__).parent))
from fsdp_reference import STEPS, make_model, train, train_anchor  # noqa: E402


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = make_model()
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    distances, er, optimizer = train(model, slice(rank * 4, (rank + 1) * 4))  # this rank's half of 8 rows
    full = {n: p.full_tensor() for n, p in model.named_parameters()}
    torch.save(er.state_dict(), out / f"state{rank}.pt")
    resumed = callback_round_trip(er, model, optimizer, out, rank)
    anchored = make_model()
    for layer in anchored:
        fully_shard(layer)
    fully_shard(anchored)
    to_init, to_ref = train_anchor(anchored, slice(rank * 4, (rank + 1) * 4))
    anchored_full = {n: p.full_tensor() for n, p in anchored.named_parameters()}
    if rank == 0:
        torch.save({"weights": full, "distances": distances, "resets": er.num_resets,
                    "sharded": er.is_sharded, "callback_resumed": resumed, "anchor_weights": anchored_full,
                    "anchor_distances": (to_init, to_ref)}, out / "fsdp.pt")
    dist.barrier()  # no rank tears gloo down while the other still works: that aborted a CI run once
    dist.destroy_process_group()


def callback_round_trip(er, model, optimizer, out: Path, rank: int) -> bool:
    """Save through ElasticResetCallback.on_save as the Trainer would at step 5, resume a fresh callback from it;
    True when every rank got its own shards back."""
    from elastic_reset.integrations.trl import ElasticResetCallback

    args = SimpleNamespace(should_save=rank == 0, output_dir=str(out), process_index=rank)
    state = SimpleNamespace(global_step=STEPS)
    (out / f"checkpoint-{STEPS}").mkdir(exist_ok=True)
    dist.barrier()
    saving = ElasticResetCallback(decay=0.7, reset_every=2)
    saving.elastic_reset = er
    saving.on_save(args, state, None)
    dist.barrier()
    resuming = ElasticResetCallback(decay=0.7, reset_every=2)
    resuming.on_train_begin(args, state, None, model=model, optimizer=optimizer)
    mine = all(torch.equal(a, b) for a, b in zip(resuming.elastic_reset.ema, er.ema)) and \
        resuming.elastic_reset.num_resets == er.num_resets
    flags = [None, None]
    dist.all_gather_object(flags, mine)
    return all(flags)


if __name__ == "__main__":
    main()
