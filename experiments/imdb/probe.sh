#!/usr/bin/env bash
# All weights or LoRA (merged) for adapting SmolLM2-135M-Instruct to IMDB reviews? The same
# number of steps and tokens each (batches of 4 × 256 tokens), each at its usual learning rate; held-out perplexity on
# 200 test reviews before and after, and the wall time. Resumable: a finished arm is skipped, a killed one continues.
#   bash experiments/imdb/probe.sh [STEPS] [OUT]      (default 80 steps, experiments/imdb/results/135m/probe)
set -euo pipefail
cd "$(dirname "$0")/../.."
STEPS=${1:-80}
OUT=${2:-results/imdb_135m/probe}
DATA=${ELASTIC_RESET_DATA:-../shared/data}
mkdir -p "$OUT"
for arm in full lora16; do
  [ -f "$OUT/$arm.json" ] && continue
  flags=(--lora-r 0); [ "$arm" = lora16 ] && flags=(--lora-r 16)
  resume=(); [ -d "$OUT/$arm.model.checkpoints" ] && resume=(--resume)
  .venv/bin/elastic-reset build imdb-smollm2 --data-dir "$DATA" --steps "$STEPS" --out "$OUT/$arm.model" \
      "${flags[@]}" "${resume[@]}" --force 2>&1 | grep -v "Writing model shards" | tee "$OUT/$arm.log"
  python3 -c "import json,sys; m=json.load(open('$OUT/$arm.model/pretrain_metrics.json')); m.pop('train_loss'); \
print(json.dumps(m, indent=2))" > "$OUT/$arm.json"
  rm -rf "$OUT/$arm.model"   # weights are not kept in git; the numbers are
done
