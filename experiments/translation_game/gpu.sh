#!/usr/bin/env bash
# The Translation Game on one GPU, in one device call: what it costs there, measured, so that a lease can be
# sized for the grid at the paper's budget (50k updates) instead of estimated. In turn:
#   1. the CUDA tests, the game's included (its data travels here, so it no longer skips);
#   2. the out-of-domain build on the GPU (translation_grid.sh's recipe: Tatoeba for EPOCHS epochs, then the 3-epoch
#      adaptation on 8,000 Multi30k lines), each model-epoch timed by the build's log, the three agents side by side
#      (BUILD_JOBS processes, under CUDA MPS; an earlier lease built them in turn, beside the tests: BENCHMARKS.md);
#   3. the grid's 7 methods x 1 seed side by side (translation_grid.sh, JOBS cells at once under CUDA MPS) for STEPS
#      updates, stopped at DEADLINE seconds after the call began: each cell's metrics.jsonl times every update.
#   STEPS=400 EPOCHS=1 DEADLINE=520 bash experiments/translation_game/gpu.sh      # carry .whl .trd
# What travels besides the tree (made here once; both folders git-ignored through .git/info/exclude):
#   .whl/  transformers==5.24.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0
#          typing-inspection==0.4.5 vaderSentiment==3.3.2 (downloaded as gpu_session.sh's header says)
#   .trd/  mkdir -p .trd && tar -C ../shared -czf .trd/data.tgz data/multi30k data/translation-pretrain
# A build of one epoch is for the timing only: its agents are not the grid's (4 epochs), and cells of STEPS
# updates are not results. Everything comes back as $OUT/translation_gpu.tgz and the logs beside it.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_translation} KEEP=/tmp/keep
STEPS=${STEPS:-400} EPOCHS=${EPOCHS:-1} DEADLINE=${DEADLINE:-520} T_TESTS=${T_TESTS:-150} BUILD_JOBS=${BUILD_JOBS:-3}
start=$(date +%s)
since() { echo "$(( $(date +%s) - start )) s"; }
mkdir -p "$OUT" "$KEEP/shared"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
tar -C "$KEEP/shared" -xzf .trd/data.tgz || exit 1
# A copy of the tree beside shared/, so that ../shared/data (the configs' and the tests' default) is the data.
rm -rf "$KEEP/tree" && cp -r "$PWD" "$KEEP/tree" && cd "$KEEP/tree" || exit 1
export PYTHONPATH=/tmp/site:$KEEP/tree/src:$KEEP/tree/tests PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export ELASTIC_RESET_CACHE=/tmp/er_cache
ER="python3 -m elastic_reset.cli"
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; lscpu | grep "Model name"
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} 2>&1 | tee "$OUT/machine.txt"

agents=/tmp/agents adapted=/tmp/agents-adapt8000
timeout "$T_TESTS" python3 -m pytest -m cuda -q -p no:cacheprovider tests > "$OUT/cuda_tests.log" 2>&1
echo "CUDA tests done at $(since)" | tee -a "$OUT/machine.txt"
source benchmarks/mps.sh && start_mps
echo "MPS $mps; the build begins at $(since)" | tee -a "$OUT/machine.txt"
(setsid nohup bash -c "$ER build translation-agents --data-dir ../shared/data --max-epochs $EPOCHS --device cuda \
   --jobs $BUILD_JOBS --out $agents && $ER build translation-agents --data-dir ../shared/data --adapt $agents \
   --pretrain-lines 8000 --device cuda --out $adapted; echo \$? > $KEEP/build.rc" > "$KEEP/build.log" 2>&1 &)
while [ ! -f "$KEEP/build.rc" ] && [ "$(( $(date +%s) - start ))" -lt "$DEADLINE" ]; do sleep 2; done
echo "build ended at $(since) with exit code $(cat "$KEEP/build.rc" 2>/dev/null || echo 'none yet')" \
  | tee -a "$OUT/machine.txt"

if [ "$(cat "$KEEP/build.rc" 2>/dev/null)" = 0 ]; then
  echo "the grid begins at $(since)" | tee -a "$OUT/machine.txt"
  (AGENTS=$adapted SEEDS=1 STEPS=$STEPS JOBS=${JOBS:-7} ISA=native ER=$ER PY=python3 PYTHON=python3 GRID=/tmp/grid \
     RESULTS=/tmp/grid_results setsid nohup bash -c \
     'bash experiments/translation_game/grid.sh > "$0/grid.log" 2>&1; echo $? > "$0/grid.rc"' "$KEEP" &)
  while [ ! -f "$KEEP/grid.rc" ] && [ "$(( $(date +%s) - start ))" -lt "$DEADLINE" ]; do sleep 2; done
  echo "stopped waiting at $(since); the grid's exit code: $(cat "$KEEP/grid.rc" 2>/dev/null || echo 'none yet')" \
    | tee -a "$OUT/machine.txt"
  cp "$KEEP/grid.log" "$OUT/" 2>/dev/null
fi
cp "$KEEP/build.log" "$OUT/"
nvidia-smi --query-gpu=memory.used --format=csv,noheader >> "$OUT/machine.txt"
# The cells' small files, finished or not (no checkpoints), and the builds' metrics.
cd /tmp && tar -czf "$OUT/translation_gpu.tgz" --exclude='*.safetensors' --exclude='*.pt' --exclude='checkpoint*' \
  $(ls -d grid agents/build_metrics.json agents-adapt8000/build_metrics.json 2>/dev/null)
echo "done at $(since)"
