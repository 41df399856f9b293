#!/usr/bin/env bash
# The first IMDB grid of BENCHMARKS.md ("IMDB on SmolLM2, where the reward did not move"): PPO+KL, Elastic
# Reset as the authors' code ran it and as the paper's text describes it, and the two reset ablations, 3 seeds
# each, on configs/imdb_smollm2.yaml.
# Resumable: run it again after an interruption. Needs the reward model
# (elastic-reset build imdb-classifier --data-dir ../shared/data). About an hour on 2 CPU cores.
#
# Per-method settings (the paper's §6 and Appendix B, and what the authors' released RL4LMs fork ran; see
# BENCHMARKS.md, "IMDB: reward vs drift"):
#  kl            PPO + KL, beta 0.1, adaptive (target 0.5)
#  elastic_reset authors' code: beta 0.001 (target 1.0), decay 0.995, EMA updated once per iteration,
#                KL reference = the EMA
#  er_paper      paper's text: beta 0.001 (target 1.0), EMA after every optimizer step, KL reference = the
#                initial model; decay 0.75 keeps the text's EMA horizon of ~2 iterations (0.995 over RL4LMs'
#                100 optimizer steps per iteration; here 2 steps per iteration)
#  reset_to_init beta 0.001 (target 1.0), reset every 6 to the initial weights
#  reset_to_ema  as the authors' elastic_reset, but the EMA is never reset to the initial weights
set -euo pipefail
cd "$(dirname "$0")/../.."
GRID=${GRID:-runs/imdb_smollm2}
SMALL_KL=(kl.coef=0.001 kl.target=1.0)
sets=()
for m in elastic_reset er_paper reset_to_init reset_to_ema; do
  for kv in "${SMALL_KL[@]}"; do sets+=(--method-set "$m:$kv"); done
done
.venv/bin/elastic-reset compare configs/imdb_smollm2.yaml --out "$GRID" --seeds 3 \
  --methods kl,elastic_reset,er_paper=elastic_reset,reset_to_init,reset_to_ema \
  "${sets[@]}" \
  --method-set elastic_reset:method.ema_update=iteration --method-set elastic_reset:kl.reference=ema \
  --method-set er_paper:method.ema_update=step --method-set er_paper:kl.reference=init \
  --method-set er_paper:method.decay=0.75 \
  --method-set reset_to_ema:method.ema_update=iteration --method-set reset_to_ema:kl.reference=ema \
  --set progress=false
# What BENCHMARKS.md cites: the report, the figures, and each run's config and metrics (not the checkpoints).
rm -rf experiments/imdb/results/smollm2/runs && mkdir -p experiments/imdb/results/smollm2
cp "$GRID"/summary.json "$GRID"/pareto.png "$GRID"/pareto_curves.png experiments/imdb/results/smollm2/
for run in "$GRID"/*/seed*/; do
  dest=experiments/imdb/results/smollm2/runs/${run#"$GRID"/}
  mkdir -p "$dest" && cp "$run"/config.yaml "$run"/metrics.jsonl "$run"/label "$dest"
done
