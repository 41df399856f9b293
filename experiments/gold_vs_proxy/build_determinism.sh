#!/usr/bin/env bash
# Does the gold-vs-proxy testbed's build chain give the same bytes twice on this machine? The grids that span
# sessions rebuild their artefacts on each new machine and refuse a rebuild that differs (grid_cells.sh:
# same_build); this checks the premise, run to run, at small sizes: the classifier (the gold), the IMDB policy,
# gold-labelled pairs and a Bradley-Terry proxy, built twice into two caches, then compared file by file.
#   bash experiments/gold_vs_proxy/build_determinism.sh [WORK_DIR]     # ~25 min on 2 AVX2 cores
set -euo pipefail
cd "$(dirname "$0")/../.."
WORK=${1:-$(mktemp -d)}
mkdir -p "$WORK"
ER=.venv/bin/elastic-reset
for run in a b; do
  export ELASTIC_RESET_CACHE=$WORK/$run
  log=$WORK/$run.log
  start=$(date +%s)
  $ER build imdb-classifier --data-dir ../shared/data --n-train 480 --n-test 64 > "$log" 2>&1
  $ER build imdb-smollm2 --data-dir ../shared/data --steps 8 >> "$log" 2>&1
  $ER build gold-pairs --data-dir ../shared/data --n-pairs 32 --temperature 0.5 >> "$log" 2>&1
  $ER reward-model train --backbone minilm --data "$ELASTIC_RESET_CACHE/gold-pairs/imdb-n32-t0.5-seed0/pairs.jsonl" \
    --out "$ELASTIC_RESET_CACHE/proxy" >> "$log" 2>&1
  echo "chain $run: $(( $(date +%s) - start )) s"
done
# The weights and the pairs; reward_model.json differs anyway (its data path and timings).
status=0
while IFS= read -r f; do
  if cmp -s "$WORK/a/$f" "$WORK/b/$f"; then echo "same      $f"; else echo "DIFFERENT $f"; status=1; fi
done < <(cd "$WORK/a" && find . \( -name '*.safetensors' -o -name '*.pt' -o -name pairs.jsonl \) | sort)
exit $status
