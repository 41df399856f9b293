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
# The grid's agents and first cells are an AVX2 machine's (fp32: autocast none). A CPU with wider vectors runs the
# AVX2 kernels (torch's, MKL's, oneDNN's) so as to compute as that machine did: under these caps an AVX-512 machine
# (an AMD EPYC) gave fr-en's first epoch val BLEU 32.48, the AVX2 machine 32.5, an AVX-512 Xeon uncapped 32.8
# (BENCHMARKS.md). The build's record decides (same_build below). ISA=native leaves the kernels alone.
if [ "${ISA:-avx2}" = avx2 ]; then
  export ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2
fi
GRID=${GRID:-runs/translation-game}
RESULTS=${RESULTS:-results/translation-game}
SEEDS=${SEEDS:-5}
STEPS=${STEPS:-2000}
EVERY=${EVERY:-100}
LR=${LR:-1e-5}
RESET=$(( STEPS * 46 / 100 ))
ER=${ER:-.venv/bin/elastic-reset}
common=(--set steps="$STEPS" --set eval.every="$EVERY" --set checkpoint_every="$EVERY" --set eval.num_prompts=1014
        --set sampling.min_new_tokens=3 --set progress=false --set method.reset_every="$RESET"
        --set algo.name=rloo --set algo.prompts_per_step=16 --set algo.samples_per_prompt=4
        --set algo.minibatch_size=32 --set algo.epochs=1 --set algo.adam_beta2=0.98 --set algo.adam_eps=1e-9
        --set algo.max_grad_norm=0.1 --set algo.entropy_coef=0 --set algo.lr="$LR")
if [ -n "${THREADS:-}" ]; then common+=(--set "threads=$THREADS"); fi
# AGENTS: another build's folder (`build translation-agents --out DIR`); default: the out-of-domain agents, built here
# where the cache lacks them (a new machine), as BENCHMARKS.md's "Out-of-domain agents" built them: 4 epochs on
# Tatoeba (~75 min on the AVX-512 CPU), then adapted on 8,000 lines of Multi30k train (~5 min).
# The speaker (the policy) and the listener must come from the same build.
if [ -z "${AGENTS:-}" ]; then
  base=$(${PY:-.venv/bin/python} -c "from elastic_reset.models import translation_agents_path as p; print(p(False))")
  AGENTS=$base-adapt8000
  if [ ! -f "$AGENTS/build_metrics.json" ]; then
    [ -f "$base/build_metrics.json" ] || $ER build translation-agents --data-dir ../shared/data --max-epochs 4 \
      --device cpu --resume
    $ER build translation-agents --data-dir ../shared/data --adapt "$base" --pretrain-lines 8000 --device cpu \
      --out "$AGENTS"
  fi
fi
common+=(--set "task.options.agents=$AGENTS" --set "model.name=$AGENTS/fr-en")
# Across sessions (grid_cells.sh): the agents must be the build the first cells played with, finished cells come
# back from $RESULTS, and each seed's cells are kept there as they finish.
source experiments/grid_cells.sh
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
