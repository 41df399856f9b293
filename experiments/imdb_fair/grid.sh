#!/usr/bin/env bash
# The fair IMDB study's grid (README.md beside it): 7 arms x 3 seeds of config.yaml, seed by seed, resumable.
#   bash experiments/imdb_fair/grid.sh            # from the repository root; about 15-20 min a cell on an
#                                                 # AVX-512 BF16 CPU, one cell at a time
# Needs the classifier and the policy (elastic-reset build imdb-classifier / imdb-smollm2 --data-dir ../shared/data).
# A seed's cells come from one build: builds made under bf16 autocast differ from machine to machine and the cache
# does not outlive a session, so the grid records, per seed, the policy's held-out perplexity and the classifier's
# final training loss (results/builds/seed<k>/), and a seed begun on one build is finished on it or not at all
# (same_build). Seeds may come from different builds: the paired differences are within a seed, and the verdict's
# SE over seeds then carries the build's randomness with the seed's.
# Finished cells' small files go to results/runs/ (committed) and come back into an empty $GRID, so the grid goes
# on across sessions. SEEDS=1 stops after seed 0; JOBS=N trains N cells at once (a GPU machine: JOBS=6);
# ARMS="a b" trains only those arms; ER and PY name the CLI and Python (default: the .venv's).
#
# Arms (the verdict's labels say what runs: RLOO with a KL penalty in the reward, not PPO):
#  rloo_kl_0.003, rloo_kl_0.01, rloo_kl_0.03   RLOO + KL to the initial model, beta fixed (kl.target null): the
#                                              tuned baseline, three settings
#  elastic_reset     the paper's settings as its authors' IMDB code ran them and the first grid did: decay 0.995,
#                    EMA once an iteration, reset every 17 iterations, KL beta 0.001 (adaptive, target 1.0) to the
#                    EMA. At a reset the EMA holds 0.995^17 = 92 % of the initial weights.
#  er_decay_0.90     the same with decay 0.90: 0.9^17 = 17 % of the initial weights at a reset, an EMA that
#                    carries the policy (does the EMA matter?)
#  reset_to_init     the same KL, reset every 17 iterations to the initial weights
#  gr                RLOO + gradient regularisation (method gradient_reg), no KL (as that paper's runs), at the
#                    strength its own budget picks: candidates gr_0.001 and gr_0.01 (the two its authors' scripts
#                    use) on seed 0, chosen on set A by verdict.py --choose-gr; the chosen candidate's seed 0 is
#                    copied as gr's seed 0 and seeds 1-2 run at its strength
set -euo pipefail
cd "$(dirname "$0")/../.."
HERE=experiments/imdb_fair
GRID=${GRID:-runs/imdb_fair}
RESULTS=${RESULTS:-$HERE/results}
SEEDS=${SEEDS:-3}
ER=${ER:-.venv/bin/elastic-reset} PY=${PY:-.venv/bin/python}
source experiments/grid_cells.sh
CACHE=$($PY -c 'from elastic_reset.models import cache_dir; print(cache_dir())')
restore_cells "$RESULTS" "$GRID"
seed_build() {  # SEED ARM...: before training a seed's cells not yet done, record this machine's builds for it (no
  local s=$1 rec=$RESULTS/builds/seed$1 arm todo=0 began=0  # cell done) or check them against its record
  shift
  for arm in "$@"; do if [ -f "$GRID/$arm/seed$s/done" ]; then began=1; else todo=1; fi; done
  [ $todo = 1 ] || return 0
  [ $began = 1 ] || rm -f "$rec/policy.json" "$rec/classifier.json"
  local rc=0
  same_build "$CACHE/imdb-smollm2/pretrain_metrics.json" "$rec/policy.json" held_out_perplexity &&
    same_build "$CACHE/imdb-sentiment-minilm/metrics.json" "$rec/classifier.json" final_train_loss || rc=$?
  if [ $rc = 1 ]; then
    echo "seed $s: its finished cells ($RESULTS/runs/*/seed$s) come from another build and a seed's cells share" \
      "one; remove them (git keeps them) to run seed $s on this build" >&2
  fi
  [ $rc = 0 ] || exit 1
}
ARMS=${ARMS:-rloo_kl_0.003 rloo_kl_0.01 rloo_kl_0.03 elastic_reset er_decay_0.90 reset_to_init}
declare -A METHOD=([rloo_kl_0.003]=kl [rloo_kl_0.01]=kl [rloo_kl_0.03]=kl [elastic_reset]=elastic_reset
                   [er_decay_0.90]=elastic_reset [reset_to_init]=reset_to_init)
declare -A SETS=(
  [rloo_kl_0.003]="kl.coef=0.003 kl.target=null"
  [rloo_kl_0.01]="kl.coef=0.01 kl.target=null"
  [rloo_kl_0.03]="kl.coef=0.03 kl.target=null"
  [elastic_reset]="kl.coef=0.001 kl.target=1.0 kl.reference=ema method.decay=0.995 method.reset_every=17 method.ema_update=iteration"
  [er_decay_0.90]="kl.coef=0.001 kl.target=1.0 kl.reference=ema method.decay=0.90 method.reset_every=17 method.ema_update=iteration"
  [reset_to_init]="kl.coef=0.001 kl.target=1.0 method.reset_every=17"
)
GR_CANDIDATES=${GR_CANDIDATES-gr_0.001 gr_0.01}
for c in $GR_CANDIDATES; do METHOD[$c]=gradient_reg; SETS[$c]="kl.coef=0 kl.target=null method.strength=${c#gr_}"; done
run() {  # compare over seeds 0..$1-1 of the arms named after it
  local n=$1
  shift
  run_arms $HERE/config.yaml "$n" "$@" -- --set progress=false
}
# shellcheck disable=SC2086  # the arm lists are words
seed_build 0 $ARMS $GR_CANDIDATES
run 1 $ARMS $GR_CANDIDATES
chosen=$($PY $HERE/verdict.py "$RESULTS" --choose-gr)
if [ -n "$GR_CANDIDATES" ] && [ -f "$GRID/$chosen/seed0/done" ]; then
  METHOD[gr]=gradient_reg SETS[gr]=${SETS[$chosen]}
  if [ ! -e "$GRID/gr/seed0" ]; then mkdir -p "$GRID/gr" && cp -r "$GRID/$chosen/seed0" "$GRID/gr/seed0"; fi
  ARMS="$ARMS gr"
fi
for n in $(seq 2 "$SEEDS"); do  # seed by seed: a grid stopped part-way has equal seeds
  for s in $(seq 0 $((n - 1))); do seed_build "$s" $ARMS; done
  run "$n" $ARMS
done
$PY $HERE/verdict.py "$RESULTS"
