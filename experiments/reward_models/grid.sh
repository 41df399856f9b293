#!/usr/bin/env bash
# The comparison: the Bradley-Terry reward model (RM) against the Advantage Model (AM) on the same
# prompt-disjoint split of HH-RLHF (helpful + harmless) and the beer/coffee Stack Exchange pairs, 3 seeds each,
# for each backbone. Resumable: a finished model is skipped (in GRID, or kept in experiments/reward_models/results/runs/ by the
# table script, so a session whose runs/ is gone does not retrain it), an interrupted one continues from its
# checkpoint.
#   BACKBONES=minilm SEEDS=3 GRID=runs/reward-models bash experiments/reward_models/grid.sh
#   BACKBONES=smollm2 SEEDS=3 SAVE_STEPS=25 GROUP_BY_LENGTH=1 GRID=runs/reward-models bash experiments/reward_models/grid.sh
#   .venv/bin/python experiments/reward_models/table.py runs/reward-models
set -euo pipefail
cd "$(dirname "$0")/../.."
GRID=${GRID:-runs/reward-models}
DATA_DIR=${DATA_DIR:-../shared/data}
KEPT=${KEPT:-results/reward-models/runs}
EPOCHS=${EPOCHS:-1}
SAVE_STEPS=${SAVE_STEPS:-100}  # a checkpoint every N steps: what an interruption loses (SmolLM2 on 2 CPU cores: 25)
# Batches of similar length pad 1.4x less; the MiniLM grid ran without it (random batches), the SmolLM2 one with it.
group=(); [ "${GROUP_BY_LENGTH:-0}" = 1 ] && group=(--group-by-length)
for backbone in ${BACKBONES:-minilm smollm2}; do
  # Seed by seed, RM then AM: a grid cut short still has paired rows.
  for seed in $(seq 0 $(( ${SEEDS:-3} - 1 ))); do
    for kind in rm am; do
      out="$GRID/$backbone-$kind-seed$seed"
      [ -f "$out/reward_model.json" ] && { echo "$out: done, skipped"; continue; }
      [ -f "$KEPT/$backbone-$kind-seed$seed.json" ] && { echo "$out: kept in $KEPT, skipped"; continue; }
      resume=(); [ -d "$out.checkpoints" ] && resume=(--resume)
      flag=(); [ "$kind" = am ] && flag=(--advantage)
      echo "$out: training ($(date -u +%H:%M:%S))"
      .venv/bin/elastic-reset reward-model train --backbone "$backbone" "${flag[@]}" --seed "$seed" \
        --data hh-rlhf --data stack-exchange --data-dir "$DATA_DIR" --epochs "$EPOCHS" --save-steps "$SAVE_STEPS" \
        "${group[@]}" --out "$out" "${resume[@]}"
    done
  done
done
