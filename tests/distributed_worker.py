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
    score = trainer.reward

    def recording_score(prompts, completions, *rollout):
        prompts_seen.append(list(prompts))
        return score(prompts, completions, *rollout)

    recording_score.components = {}  # the training step logs a reward's parts; this task's has none
    trainer.reward = recording_score
    trainer.train()
    ema = trainer.method.ema
    torch.save({"trainable": {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad},
                "ema": None if ema is None else {k: v for k, v in ema.state_dict().items()},
                "prompts": prompts_seen, "world_size": trainer.dp.world_size},
               out / f"rank{trainer.dp.rank}.pt")


if __name__ == "__main__":
    main()
