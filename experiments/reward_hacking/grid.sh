#!/usr/bin/env bash
# The reward-hacking grid (README.md beside it), on the proxies stage 0 chose: resumable, seed 0 first.
#   bash experiments/reward_hacking/grid.sh       # from the repository root, after stage0.sh named a proxy
# Seed 0: every arm and candidate (rule 1 of verdict.py: two candidates per tuned family), then each family's
# chosen candidate (verdict.py --choose) becomes its arm, its seed-0 cell copied, and the AM proxy's Elastic Reset
# runs at that setting; then seeds 1..SEEDS-1 of every arm, seed by seed. Every cell comes from the build stage 0
# recorded (builds.sh). Finished cells' small files go to results/grid/runs/ (committed) and come back into an empty
# $GRID. JOBS=N trains N cells at once; ER and PY name the CLI and Python (default: the .venv's).
#
# Arms (configs/imdb_gold.yaml, 50 iterations, a second evaluation set B: task.options.n_report 64; cut to fit the
# budget, as stage 0 measured half a cell's time in evaluations: no test split and no forget set, which no rule reads):
#  none                      RLOO, no KL: what stage 0 ran, the phenomenon
#  rloo_kl_0.01, rloo_kl_0.03  RLOO + KL to the initial model, beta fixed (kl.target null)
#  er_17, er_8 -> er         Elastic Reset as its authors' IMDB code: decay 0.995, EMA once an iteration, KL beta 0.001
#                            (adaptive, target 1.0) to the EMA; reset every 17 or 8 iterations
#  rr_17, rr_8 -> rr         reference resets as the GR paper's TRL runs them (sync_ref_model, mixup alpha 1: the KL
#                            reference <- the policy, the optimizer's state kept): anchor ref_sync, alpha 1, on RLOO +
#                            KL beta 0.03 (fixed); every 17 or 8 iterations
#  gr_0.01, gr_0.001 -> gr   gradient regularisation, no KL (as that paper's runs), strength 0.01 or 0.001
# The AM proxy: none and er.
set -euo pipefail
cd "$(dirname "$0")/../.."
HERE=experiments/reward_hacking
GRID=${GRID:-runs/reward_hacking_grid}
RESULTS=${RESULTS:-$HERE/results}
OUT=$RESULTS/grid
SEEDS=${SEEDS:-3}
ER=${ER:-.venv/bin/elastic-reset} PY=${PY:-.venv/bin/python}
source experiments/grid_cells.sh
source $HERE/builds.sh
n=$($PY -c "import json, sys; c = json.load(open(sys.argv[1])).get('choice'); print(c or '')" "$RESULTS/stage0.json")
[ -n "$n" ] || { echo "stage 0 named no proxy ($RESULTS/stage0.md): the grid is not run" >&2; exit 3; }
need_base
declare -A PROXY
for kind in rm am; do proxy=$(need_proxy $kind "$n"); PROXY[$kind]=$proxy; done
declare -A METHOD=([none]=none [rloo_kl_0.01]=kl [rloo_kl_0.03]=kl)
declare -A SETS=([none]="kl.coef=0 kl.target=null" [rloo_kl_0.01]="kl.coef=0.01 kl.target=null"
                 [rloo_kl_0.03]="kl.coef=0.03 kl.target=null")
for r in 17 8; do
  METHOD[er_$r]=elastic_reset
  SETS[er_$r]="kl.coef=0.001 kl.target=1.0 kl.reference=ema method.decay=0.995 method.reset_every=$r"
  SETS[er_$r]+=" method.ema_update=iteration"
  METHOD[rr_$r]=anchor
  SETS[rr_$r]="kl.coef=0.03 kl.target=null method.preset=ref_sync method.alpha=1 method.every=$r"
done
for g in 0.01 0.001; do METHOD[gr_$g]=gradient_reg SETS[gr_$g]="kl.coef=0 kl.target=null method.strength=$g"; done
restore_cells "$OUT" "$GRID"
run() {  # PROXY SEEDS ARM...: compare over seeds 0..SEEDS-1 of the arms, then keep the finished cells
  local proxy=$1 seeds=$2 methods=() sets=() arm kv
  shift 2
  for arm in "$@"; do
    methods+=("$arm=${METHOD[$arm]}")
    for kv in ${SETS[$arm]}; do sets+=(--method-set "$arm:$kv"); done
  done
  $ER compare configs/imdb_gold.yaml --out "$GRID/$proxy" --seeds "$seeds" --jobs "${JOBS:-1}" --prune-finished \
    --methods "$(IFS=,; echo "${methods[*]}")" "${sets[@]}" --set "task.options.reward_model=${PROXY[$proxy]}" \
    --set task.options.n_report=64 --set task.options.n_test=0 --set task.options.n_forget=0 --set progress=false
  collect_cells "$GRID" "$OUT"
}
RM_ARMS="none rloo_kl_0.01 rloo_kl_0.03 er rr gr"
# shellcheck disable=SC2086  # the arm lists are words
run rm 1 none rloo_kl_0.01 rloo_kl_0.03 er_17 er_8 rr_17 rr_8 gr_0.01 gr_0.001
run am 1 none
for family in er rr gr; do
  chosen=$($PY $HERE/verdict.py "$OUT" --choose $family)
  [ -n "$chosen" ] || { echo "$family: a candidate's seed 0 is unfinished" >&2; exit 1; }
  METHOD[$family]=${METHOD[$chosen]} SETS[$family]=${SETS[$chosen]}
  if [ ! -e "$GRID/rm/$family/seed0" ]; then mkdir -p "$GRID/rm/$family" && cp -r "$GRID/rm/$chosen/seed0" \
    "$GRID/rm/$family/seed0" && echo "$family" > "$GRID/rm/$family/seed0/label"; fi
done
run am 1 none er
for s in $(seq 2 "$SEEDS"); do  # seed by seed: a grid stopped part-way has equal seeds
  run rm "$s" $RM_ARMS
  run am "$s" none er
done
$PY $HERE/verdict.py "$OUT"
