#!/usr/bin/env bash
# The Translation Game's attribution grid (README.md beside it; rule in attribution.py's docstring, fixed before its
# first cell): what makes Elastic Reset drift less, and a KL-to-LM baseline that does not collapse. On the first
# grid's agents (same_build against its record) and budget, 1,000 updates; resumable, cells kept in RESULTS.
#   JOBS=2 THREADS=1 bash experiments/translation_game/attribution.sh     # ~55 min a cell, two at a time
# 1. The pre-check: KL to the English LM at each of attribution.py's KL_LM_CANDIDATES, seed 0.
# 2. SEEDS seeds (default 5) of: reinforce_kl (RLOO + the same beta 0.001 KL to the initial speaker as Elastic
#    Reset, no resets), er_eta_0.999 (Elastic Reset with eta 0.999) and the KL-to-LM beta the pre-check picked.
# 3. attribution.py's verdict over these cells and the first grid's.
set -euo pipefail
cd "$(dirname "$0")/../.."
HERE=experiments/translation_game
GRID=${GRID:-runs/translation-attribution}
RESULTS=${RESULTS:-$HERE/results/attribution}
FIRST=$HERE/results/grid
SEEDS=${SEEDS:-5}
STEPS=1000  # the first grid's budget: its cells are compared with these
source $HERE/common.sh
same_build "$AGENTS/build_metrics.json" "$FIRST/build_metrics.json" pretrained.val.task_bleu
restore_cells "$RESULTS" "$GRID"
declare -A SETS=(
  [reinforce_kl]="kl.coef=0.001"
  [er_eta_0.999]="kl.coef=0.001 method.decay=0.999"
)
declare -A METHOD=([reinforce_kl]=kl [er_eta_0.999]=elastic_reset)
for beta in $(${PY:-.venv/bin/python} -c "import sys; sys.path.insert(0, '$HERE'); import attribution as a; \
    print(*a.KL_LM_CANDIDATES)"); do
  METHOD[kl_lm_$beta]=kl SETS[kl_lm_$beta]="kl.reference=lm kl.coef=$beta"
done
run() {  # compare over seeds 0..$1-1 of the arms named after it
  local n=$1
  shift
  run_arms configs/translation.yaml "$n" "$@" -- --score task_bleu --drift drift_bleu "${common[@]}"
}
candidates=$(printf '%s\n' "${!METHOD[@]}" | grep '^kl_lm_' | sort)
# shellcheck disable=SC2086  # the arm lists are words
run 1 reinforce_kl er_eta_0.999 $candidates
chosen=$(${PY:-.venv/bin/python} $HERE/attribution.py "$RESULTS" "$FIRST" --choose-kl-lm)
arms="reinforce_kl er_eta_0.999"
[ "$chosen" = none ] || arms="$arms $chosen"
for n in $(seq 2 "$SEEDS"); do
  run "$n" $arms  # seed by seed: a grid stopped part-way has equal seeds
done
${PY:-.venv/bin/python} $HERE/attribution.py "$RESULTS" "$FIRST"
