#!/usr/bin/env bash
# The Translation Game's grid (paper §4, Table 1, Appendix A): 7 methods x SEEDS seeds on the
# agents `elastic-reset build translation-agents` wrote (out of domain, as the paper's). Resumable: run it again
# after an interruption (finished cells are skipped; SEEDS=2 stops after two seeds).
#   STEPS=1000 JOBS=2 THREADS=1 bash experiments/translation_game/grid.sh
#     (1,000 updates: the CPU budget of the learning check, ~25 min an RLOO run alone)
# JOBS=2 THREADS=1: two cells side by side at one torch thread each, ~10-15 % more updates an hour on 2 cores.
# STEPS: updates per run (the paper's 50k on a GPU; on a CPU a reduced budget, stated with the results). Run the
# learning check (experiments/translation_game/check.sh) at the same budget first: with no task gain over FROZEN ENGLISH
# there, the grid tests nothing.
#
# Common to every method, from the learning check (part 2): validation on all 1,014 val sentences every EVERY
# updates (greedy), the test split once at the end; RLOO with 16 prompts x 4 samples (a per-prompt baseline) for
# REINFORCE's variance; SIL's optimiser (Adam beta2 0.98, eps 1e-9, gradient clip 0.1) at LR (default 1e-5, SIL's);
# messages of at least 3 tokens; updates in minibatches of 32; the listener learning at lr 1e-4.
# Per method (the paper's values, §4: "a minimal search ... for each method"):
#  frozen         FROZEN ENGLISH: the speaker never updates; only the listener learns
#  reinforce      REINFORCE (here RLOO), no drift control, no KL
#  kl_lm          + KL PENALTY to the English LM pretrained beside the agents, beta 0.05
#  multitask      + MULTITASK / S2P: supervised FR→EN on the speaker's pretraining pairs, weight 1, 16 pairs an
#                 update (one per prompt), no KL
#  reset_to_init  + RESET to the pretrained weights (Appendix A.2), beta 0.001
#  reset_to_ema   + RESET TO EMA (the EMA is never reset), beta 0.001, eta 0.99
#  elastic_reset  + ELASTIC RESET, beta 0.001, eta 0.99
# Resets every 0.46 x STEPS (the paper's 23k of 50k updates: two resets, three iterations).
# ER, PY, PYTHON: the CLI and the interpreters it runs (default .venv/bin/...; gpu_translation.sh runs it there).
set -euo pipefail
cd "$(dirname "$0")/../.."
GRID=${GRID:-runs/translation-game}
RESULTS=${RESULTS:-results/translation-game}
SEEDS=${SEEDS:-5}
source experiments/translation_game/common.sh
# Across sessions (grid_cells.sh): the agents must be the build the first cells played with, finished cells come
# back from $RESULTS, and each seed's cells are kept there as they finish.
same_build "$AGENTS/build_metrics.json" "$RESULTS/build_metrics.json" pretrained.val.task_bleu
restore_cells "$RESULTS" "$GRID"
for n in $(seq 1 "$SEEDS"); do
  $ER compare configs/translation.yaml --out "$GRID" --seeds "$n" --jobs "${JOBS:-1}" \
    --score task_bleu --drift drift_bleu \
    --methods frozen,reinforce=none,kl_lm=kl,multitask,reset_to_init,reset_to_ema,elastic_reset \
    --method-set frozen:kl.coef=0 --method-set frozen:kl.log_every=0 \
    --method-set reinforce:kl.coef=0 --method-set reinforce:kl.log_every=0 \
    --method-set kl_lm:kl.reference=lm --method-set kl_lm:kl.coef=0.05 \
    --method-set multitask:kl.coef=0 --method-set multitask:kl.log_every=0 \
    --method-set multitask:method.multitask_batch=16 \
    --method-set reset_to_init:kl.coef=0.001 \
    --method-set reset_to_ema:kl.coef=0.001 \
    --method-set elastic_reset:kl.coef=0.001 \
    "${common[@]}"
  collect_cells "$GRID" "$RESULTS"
done
# What BENCHMARKS.md cites besides the cells and the agents' build metrics (the PRETRAINED row): the report, the
# figures and the verdict.
cp "$GRID"/summary.json "$GRID"/pareto.png "$GRID"/pareto_curves.png "$RESULTS/"
${PY:-.venv/bin/python} experiments/translation_game/verdict.py "$RESULTS"
