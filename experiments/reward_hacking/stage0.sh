#!/usr/bin/env bash
# The reward-hacking study's stage 0 (README.md beside it): is a proxy hacked? Resumable; run it again after an
# interruption.
#   bash experiments/reward_hacking/stage0.sh       # from the repository root
# 1. The gold pairs: 4,000 gold-labelled pairs of the IMDB policy's continuations at T = 0.5 (the gold-vs-proxy
#    testbed's, `build gold-pairs`), built where the cache lacks them and recorded (same_build).
# 2. The ladder: the first 500 / 1,000 / 2,000 of those pairs, a Bradley-Terry RM and an Advantage Model on each
#    (MiniLM, `reward-model train`): six proxies.
# 3. RLOO without KL against each proxy, 1 seed, 50 iterations of configs/imdb_gold.yaml (compare; JOBS cells at
#    once), then stage0.py's rule: the grid's proxy, or "no proxy of the ladder is hacked" (exit 3).
# Every cell comes from one build: the policy's held-out perplexity and the pairs' mean gold are recorded in
# results/ on the first run, and a later run on a build that differs stops (same_build).
set -euo pipefail
cd "$(dirname "$0")/../.."
HERE=experiments/reward_hacking
GRID=${GRID:-runs/reward_hacking}
RESULTS=${RESULTS:-$HERE/results}
ER=${ER:-.venv/bin/elastic-reset} PY=${PY:-.venv/bin/python}
LADDER=(500 1000 2000)  # stage0.py's LADDER
source experiments/grid_cells.sh
source $HERE/builds.sh
need_base
methods=() sets=()
for n in "${LADDER[@]}"; do
  for kind in rm am; do
    proxy=$(need_proxy $kind "$n")
    methods+=("${kind}_$n=none")
    sets+=(--method-set "${kind}_$n:task.options.reward_model=$proxy")
  done
done
restore_cells "$RESULTS" "$GRID"
$ER compare configs/imdb_gold.yaml --out "$GRID" --seeds 1 --jobs "${JOBS:-1}" --prune-finished \
  --methods "$(IFS=,; echo "${methods[*]}")" "${sets[@]}" --set kl.coef=0 --set kl.target=null --set progress=false
collect_cells "$GRID" "$RESULTS"
$PY $HERE/stage0.py "$RESULTS"
