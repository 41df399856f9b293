"""One rank of a DeepSpeed ZeRO run, started by tests/test_deepspeed.py under ``torchrun --nproc_per_node 2``
(DeepSpeed's CPU accelerator, gloo).

    deepspeed_worker.py STAGE OUT PERSIST

fsdp_reference's MLP and SGD run through ``deepspeed.initialize`` at ZeRO stage STAGE, each rank on its half of the
batch (the gradients are averaged, so each step is the full batch's), with Elastic Reset every 2 of 5 steps, then
the same with the LITI and reference-sync anchors. ZeRO-3 keeps parameters under PERSIST elements gathered between
steps (DeepSpeed's default 100,000: all of this MLP's; 0: none). Rank 0 writes the gathered weights and the distances to
``OUT/zero<STAGE>.pt``; each rank its EMA state to ``OUT/zero<STAGE>_state<r>.pt``.

Then a transformers ``Trainer`` with ``ElasticResetCallback`` and a DeepSpeed config, 4 optimizer steps (a reset
every 2, a checkpoint every 2) into ``OUT/run``, then resumed from ``OUT/run/checkpoint-2`` into ``OUT/resumed``. Each
rank writes its EMA of both runs and the gathered weights to ``OUT/trainer<r>.pt``.
"""

import sys
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from fsdp_reference import STEPS, batch, make_model, make_reset  # noqa: E402

from elastic_reset.core import Anchor, ElasticReset  # noqa: E402


def engine(stage: int, persist: int):
    model = make_model()
    zero = {"stage": stage, **({"stage3_param_persistence_threshold": persist} if stage == 3 else {})}
    config = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": zero,
              "zero_allow_untested_optimizer": True, "zero_force_ds_cpu_optimizer": False}
    return deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
                                config=config)[0]


def gathered(e) -> dict[str, torch.Tensor]:
    params = list(e.module.named_parameters())
    with deepspeed.zero.GatheredParameters([p for _, p in params]):
        return {n: p.detach().clone() for n, p in params}


def fit(e, rows: slice, step) -> None:
    x, y = (t[rows] for t in batch())
    for _ in range(STEPS):
        e.backward(torch.nn.functional.mse_loss(e(x), y))
        e.step()
        step()


def core(stage: int, out: Path, persist: int) -> None:
    rank = dist.get_rank()
    rows = slice(rank * 4, (rank + 1) * 4)
    e = engine(stage, persist)
    try:  # ZeRO's optimizer state lives in flat partitions: dropping the reset weights' alone is refused
        ElasticReset(e.module, reset_every=2, reset_optimizer_state=True, optimizer=e.optimizer)
        refused = ""
    except ValueError as error:
        refused = str(error)
    er = make_reset(e.module)
    distances = []

    def reset_step():
        event = er.step()
        distances.append(er.distance() if event is None else event.distance)
    fit(e, rows, reset_step)
    weights = gathered(e)
    torch.save(er.state_dict(), out / f"zero{stage}_state{rank}.pt")
    a = engine(stage, persist)
    liti = Anchor.preset("liti", a.module, eta=0.5, every=2)
    sync = Anchor.preset("ref_sync", a.module, alpha=0.5, every=3)
    to_init, to_ref = [], []

    def anchor_step():
        liti.step()
        sync.step()
        to_init.append(liti.distance("policy", "init"))
        to_ref.append(sync.distance("policy", "reference"))
    fit(a, rows, anchor_step)
    anchored = gathered(a)
    if rank == 0:
        torch.save({"weights": weights, "distances": distances, "resets": er.num_resets, "zero": er.zero,
                    "refused": refused,
                    "sharded": er.is_sharded, "anchor_weights": anchored, "anchor_distances": (to_init, to_ref)},
                   out / f"zero{stage}.pt")


def trainer(stage: int, out: Path, persist: int) -> None:
    from transformers import Trainer, TrainingArguments

    from elastic_reset.integrations.trl import ElasticResetCallback
    from elastic_reset.models import tiny_causal_lm

    ids = torch.randint(3, 259, (16, 12), generator=torch.Generator().manual_seed(0)).tolist()
    config = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
              "zero_optimization": {"stage": stage, **({"stage3_param_persistence_threshold": persist}
                                                       if stage == 3 else {})}, "zero_allow_untested_optimizer": True,
              "zero_force_ds_cpu_optimizer": False}

    def run(folder: str, resume: str | None = None):
        args = TrainingArguments(output_dir=str(out / folder), use_cpu=True, seed=0, learning_rate=1e-2,
                                 per_device_train_batch_size=1, gradient_accumulation_steps=2, max_steps=4,
                                 logging_steps=1, save_steps=2, report_to="none", disable_tqdm=True,
                                 deepspeed=config)
        callback = ElasticResetCallback(decay=0.5, reset_every=2)
        t = Trainer(model=tiny_causal_lm(hidden=64, layers=2), args=args, callbacks=[callback],
                    train_dataset=[{"input_ids": x, "labels": x} for x in ids])
        t.train(resume_from_checkpoint=resume)
        return callback.elastic_reset, gathered(t.model_wrapped)
    er, weights = run("run")
    resumed, resumed_weights = run("resumed", str(out / "run" / "checkpoint-2"))
    torch.save({"zero": er.zero, "resets": (er.num_resets, resumed.num_resets), "ema": (er.ema, resumed.ema),
                "weights": (weights, resumed_weights)}, out / f"trainer{dist.get_rank()}.pt")


if __name__ == "__main__":
    stage, out, persist = int(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    deepspeed.init_distributed(dist_backend="gloo")
    core(stage, out, persist)
    trainer(stage, out, persist)
    dist.barrier()
    dist.destroy_process_group()
