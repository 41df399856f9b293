"""One rank of a data-parallel run, started by tests/test_distributed.py under ``accelerate launch``.

    distributed_worker.py CONFIG OUT [KEY=VALUE ...]

Trains CONFIG into OUT (resuming if OUT holds a run), then writes ``OUT/rank<r>.pt``: this rank's trainable
weights, its Elastic Reset state (EMA, θ0, counters), and the prompts it was given at each step.
"""

import sys
from pathlib import Path

import torch

from elastic_reset.rl.config import load_config
from elastic_reset.rl.trainer import RLTrainer


def main() -> None:
    config_path, out, *overrides = sys.argv[1:]
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

        def __call__(self, prompts, completions, *rollout):
            prompts_seen.append(list(prompts))
            return self.reward(prompts, completions, *rollout)

    trainer.reward = RecordingReward(trainer.reward)
    trainer.train()
    ema = trainer.method.ema
    torch.save({"trainable": {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad},
                "ema": None if ema is None else {k: v for k, v in ema.state_dict().items()},
                "prompts": prompts_seen, "world_size": trainer.dp.world_size},
               out / f"rank{trainer.dp.rank}.pt")


if __name__ == "__main__":
    main()
