"""One rank of a data-parallel run, started by tests/test_distributed.py under ``accelerate launch``.

    distributed_worker.py CONFIG OUT [--drop-first-on-rank0] [KEY=VALUE ...]

Trains CONFIG into OUT (resuming if OUT holds a run), then writes ``OUT/rank<r>.pt``: this rank's trainable
weights, its Elastic Reset state (EMA, θ0, counters), the prompts it was given at each step, each policy loss's
(iteration, real tokens, ``step_tokens`` divisor) and the adaptive entropy weight's state.
``--drop-first-on-rank0``: rank 0's first sample of every batch is dropped (as an invalid reward would drop it),
so that the ranks' batches hold different numbers of real tokens.
"""

import sys
from pathlib import Path

import torch

from elastic_reset.rl.config import load_config
from elastic_reset.rl.distributed import leave_process_group
from elastic_reset.rl.trainer import RLTrainer


def main() -> None:
    config_path, out, *overrides = sys.argv[1:]
    drop = "--drop-first-on-rank0" in overrides
    overrides = [o for o in overrides if o != "--drop-first-on-rank0"]
    out = Path(out)
    trainer = RLTrainer(load_config(config_path, overrides), out, resume=(out / "config.yaml").exists())
    prompts_seen = []

    class RecordingReward:
        """The trainer's reward, recording the prompts it scores; everything else (its parts, logs, the
        trainer state a TRL reward sees) is the reward's own."""

        def __init__(self, reward):
            self.reward = reward

        def __getattr__(self, name):
            return getattr(self.reward, name)

        def __call__(self, prompts, completions, *rollout, **step):
            prompts_seen.append(list(prompts))
            scored = self.reward(prompts, completions, *rollout, **step)
            if drop and trainer.dp.rank == 0:
                scored.keep = scored.keep.clone()
                scored.keep[0] = False
            return scored

    trainer.reward = RecordingReward(trainer.reward)
    losses, loss = [], trainer.estimator.loss

    def recording_loss(out, mb, step_tokens=None):
        losses.append((trainer.step, float(mb.mask.sum()), step_tokens))
        return loss(out, mb, step_tokens)

    trainer.estimator.loss = recording_loss
    trainer.train()
    ema = trainer.method.ema
    torch.save({"trainable": {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad},
                "ema": None if ema is None else {k: v for k, v in ema.state_dict().items()},
                "prompts": prompts_seen, "world_size": trainer.dp.world_size, "losses": losses,
                "entropy_ctl": None if trainer.entropy_ctl is None else trainer.entropy_ctl.state_dict()},
               out / f"rank{trainer.dp.rank}.pt")
    leave_process_group()


if __name__ == "__main__":
    main()
