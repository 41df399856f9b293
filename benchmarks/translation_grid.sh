#!/usr/bin/env bash
# The Translation Game of BENCHMARKS.md ("Translation Game (issue 11)"): configs/translation.yaml for 8 methods x
# 5 seeds (the paper's count, §4 and Table 1). Resumable: run it again after an interruption (finished cells are
# skipped; SEEDS=2 stops after two seeds). Needs the agents:
#   elastic-reset build translation-agents --data-dir ../shared/data
#
# Per-method settings (paper §4: "a minimal search to find the best hyperparameters for each method"; ours: the
# paper's values, see BENCHMARKS.md for what was tried):
#  frozen         FROZEN ENGLISH: the speaker never updates; only the listener learns
#  reinforce      REINFORCE (moving-average baseline, entropy bonus 0.001), no drift control
#  kl_lm          + KL PENALTY to the English LM, beta 0.05 (the paper's KL baseline, after Lee et al. 2019)
#  kl_init        + KL to the pretrained FR→EN, beta 0.05
#  multitask      + MULTITASK / S2P: supervised FR→EN on the pretraining half, weight 1
#  reset_to_init  + RESET to the pretrained weights, beta 0.001
#  reset_to_ema   + RESET TO EMA (the EMA is never reset), beta 0.001, eta 0.99
#  elastic_reset  + ELASTIC RESET, beta 0.001, eta 0.99
# Resets every 0.46 x steps (the paper's 23k of 50k updates: two resets, three iterations).
set -euo pipefail
cd "$(dirname "$0")/.."
GRID=${GRID:-runs/translation-game}
SEEDS=${SEEDS:-5}
for n in $(seq 1 "$SEEDS"); do
.venv/bin/elastic-reset compare configs/translation.yaml --out "$GRID" --seeds "$n" --score task_bleu --drift drift_bleu \
  --methods frozen,reinforce=none,kl_lm=kl,kl_init=kl,multitask,reset_to_init,reset_to_ema,elastic_reset \
  --method-set kl_lm:kl.reference=lm --method-set kl_lm:kl.coef=0.05 \
  --method-set kl_init:kl.reference=init --method-set kl_init:kl.coef=0.05 \
  --method-set multitask:kl.coef=0.0 \
  --method-set reset_to_init:kl.coef=0.001 \
  --method-set reset_to_ema:kl.coef=0.001 \
  --method-set elastic_reset:kl.coef=0.001 \
  --set progress=false
done
# What BENCHMARKS.md cites: the report, the figures, and each run's config and metrics (not the checkpoints).
rm -rf results/translation-game/runs && mkdir -p results/translation-game
cp "$GRID"/summary.json "$GRID"/pareto.png "$GRID"/pareto_curves.png results/translation-game/
for run in "$GRID"/*/seed*/; do
  dest=results/translation-game/runs/${run#"$GRID"/}
  mkdir -p "$dest" && cp "$run"/config.yaml "$run"/metrics.jsonl "$run"/label "$dest"
done
