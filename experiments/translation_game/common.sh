# Sourced by the Translation Game's grids (grid.sh, attribution.sh): the AVX2 kernels, the settings every cell
# shares, and the agents (built where the cache lacks them). Sets `common` (compare's --set items) and AGENTS.
# The grid's agents and first cells are an AVX2 machine's (fp32: autocast none). A CPU with wider vectors runs the
# AVX2 kernels (torch's, MKL's, oneDNN's) so as to compute as that machine did: under these caps an AVX-512 machine
# (an AMD EPYC) gave fr-en's first epoch val BLEU 32.48, the AVX2 machine 32.5, an AVX-512 Xeon uncapped 32.8
# (BENCHMARKS.md). The build's record decides (same_build below). ISA=native leaves the kernels alone.
if [ "${ISA:-avx2}" = avx2 ]; then
  export ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2
fi
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
source experiments/grid_cells.sh
