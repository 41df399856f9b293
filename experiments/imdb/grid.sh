#!/usr/bin/env bash
# The IMDB experiments of BENCHMARKS.md: 7 methods x 5 seeds (the paper's seed count) of one config.
#   bash experiments/imdb/grid.sh    configs/imdb.yaml (a 5M GPT-2 trained from scratch on IMDB reviews: the toy
#                                   scale; about 3 hours on 2 CPU cores)
#   CONFIG=configs/imdb_135m.yaml GRID=runs/imdb_135m RESULTS=experiments/imdb/results/135m bash experiments/imdb/grid.sh
#                                   (SmolLM2-135M adapted to IMDB: the paper's scale)
# Resumable: run it again after an interruption (finished cells are skipped; SEEDS=2 stops after two seeds).
# A finished cell's checkpoints are deleted (--prune-finished): 135M weights, Adam and EMA are ~5 GB a cell.
# Across sessions too: finished cells are kept in $RESULTS/runs (after every seed, or COLLECT=1 for a grid stopped
# part-way) and brought back into an empty $GRID, so a later session on a new machine goes on where this one stopped.
# JOBS=N trains N cells at once (compare --jobs; a GPU machine with 16 cores: JOBS=7 runs a seed of every method
# side by side). ONE_GO=1 trains every seed in one compare (no wait for a seed's slowest cell; the cells go method by
# method); SETS="a=1 b=2" adds --set overrides; ER and PY name the CLI and Python (default: the .venv's). Needs the
# reward model and the policy named in the config.
#
# Per-method settings (the paper's §6 and Appendix B, and what the authors' released RL4LMs fork ran):
#  kl            RLOO + KL (the config's algo.name), beta 0.1, adaptive (target 0.5): the paper's baseline, which ran PPO
#  kl_small      RLOO + KL, beta 0.01: a smaller beta (paper Fig. 12: the frontier depends on beta); fixed
#                (KL_SMALL_TARGET=null, the toy grid) or adaptive like kl (the 135M grid: 0.5)
#  elastic_reset authors' code: beta 0.001 (target 1.0), decay 0.995, EMA updated once per iteration, KL
#                reference = the EMA, reset every 17 iterations
#  er_paper      paper's text: beta 0.001 (target 1.0), EMA after every optimizer step, KL reference = the
#                initial model; with one optimizer step per iteration here, that is the authors' clock, so the
#                paper-text variant uses the text's EMA horizon instead: ~2 iterations (0.995 over RL4LMs' 100
#                optimizer steps per iteration): decay 0.6 with one optimizer step an iteration (ER_PAPER_DECAY:
#                0.6 ** (1 / steps an iteration) with more)
#  reset_to_init beta 0.001 (target 1.0), reset every 17 iterations to the initial weights
#  reset_to_ema  as the authors' elastic_reset, but the EMA is never reset to the initial weights
#  nlpo          NLPO as the paper's corrected run: beta 1.0 (target 1.0), sampling inside the top-0.9 set of a
#                mask model (at least 100 tokens) refreshed every 50 iterations
set -euo pipefail
cd "$(dirname "$0")/../.."
CONFIG=${CONFIG:-configs/imdb.yaml}
GRID=${GRID:-runs/imdb}
RESULTS=${RESULTS:-results/imdb}
SEEDS=${SEEDS:-5}
ER=${ER:-.venv/bin/elastic-reset} PY=${PY:-.venv/bin/python}
# What differs between the two scales (BENCHMARKS.md says why): the small beta's controller (null: fixed), and the
# paper-text EMA's per-optimizer-step decay, which keeps its horizon at ~2 iterations (0.6 with one step an iteration).
KL_SMALL_TARGET=${KL_SMALL_TARGET:-null}
ER_PAPER_DECAY=${ER_PAPER_DECAY:-0.6}
source experiments/grid_cells.sh
# A grid that spans sessions must keep its policy: POLICY_METRICS names the policy's pretrain_metrics.json; the
# first run of the grid records it in $RESULTS/policy.json and every later one refuses a policy whose held-out
# perplexity differs (grid_cells.sh: same_build).
if [ -n "${POLICY_METRICS:-}" ]; then same_build "$POLICY_METRICS" "$RESULTS/policy.json" held_out_perplexity; fi
# What BENCHMARKS.md cites, and what a later session (a new machine, whose runs/ is empty) needs to skip the cells
# already trained: each finished cell's small files (grid_cells.sh: collect_cells) and the report. COLLECT=1 only
# does this (for a grid stopped part-way).
# A compare that only skipped finished cells (a restarted grid passing its done seeds) writes a report whose runs
# are all "skipped": the one in $RESULTS, which records how each cell was trained, is kept.
collect() {
  mkdir -p "$RESULTS"
  if [ -f "$GRID/summary.json" ] && { [ ! -f "$RESULTS/summary.json" ] || $PY -c \
      'import json, sys; sys.exit(all(r["action"] == "skipped" for r in json.load(open(sys.argv[1]))["runs"]))' \
      "$GRID/summary.json"; }; then
    for f in summary.json pareto.png pareto_curves.png; do [ -f "$GRID/$f" ] && cp "$GRID/$f" "$RESULTS/"; done
  fi
  collect_cells "$GRID" "$RESULTS"
}
if [ -n "${COLLECT:-}" ]; then collect; exit 0; fi
restore_cells "$RESULTS" "$GRID"  # cells finished in an earlier session: compare skips them
SMALL_KL=(kl.coef=0.001 kl.target=1.0)
sets=()
for m in elastic_reset er_paper reset_to_init reset_to_ema; do
  for kv in "${SMALL_KL[@]}"; do sets+=(--method-set "$m:$kv"); done
done
for kv in ${SETS:-}; do sets+=(--set "$kv"); done
# Seed by seed (every method's seed 0 first, ...), so that a grid stopped part-way has every method at equal seeds.
for n in $(if [ -n "${ONE_GO:-}" ]; then echo "$SEEDS"; else seq 1 "$SEEDS"; fi); do
$ER compare "$CONFIG" --out "$GRID" --seeds "$n" --jobs "${JOBS:-1}" --prune-finished \
  --methods kl,kl_small=kl,elastic_reset,er_paper=elastic_reset,reset_to_init,reset_to_ema,nlpo \
  "${sets[@]}" \
  --method-set kl_small:kl.coef=0.01 --method-set "kl_small:kl.target=$KL_SMALL_TARGET" \
  --method-set elastic_reset:method.ema_update=iteration --method-set elastic_reset:kl.reference=ema \
  --method-set er_paper:method.ema_update=step --method-set er_paper:kl.reference=init \
  --method-set "er_paper:method.decay=$ER_PAPER_DECAY" \
  --method-set reset_to_ema:method.ema_update=iteration --method-set reset_to_ema:kl.reference=ema \
  --method-set nlpo:kl.coef=1.0 --method-set nlpo:kl.target=1.0 --method-set nlpo:method.nlpo_top_p=0.9 \
  --method-set nlpo:method.nlpo_min_tokens=100 --method-set nlpo:method.nlpo_update_every=50 \
  --set progress=false
collect
done
