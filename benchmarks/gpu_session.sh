#!/usr/bin/env bash
# What a GPU lease runs for issue 40, prepared so that its 15 minutes go on the checks, not on set-up (~8 min).
#
# Here, once (the GPU image lacks pydantic and vaderSentiment and has an older transformers; .whl/ is git-ignored):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 -d .whl transformers==5.24.0 pydantic==2.14.4 pydantic-core==2.50.5 \
#     annotated-types==0.8.0 typing-inspection==0.4.5 vaderSentiment==3.3.2
# Then one device call that carries .whl:  bash benchmarks/gpu_session.sh   (logs and JSON under $OUT)
#
#  1. the CUDA tests (pytest -m cuda): graph-captured decoding against eager, in-place updates seen by the graphs,
#     the engine through graphs, the earlier CUDA tests;
#  2. decoding per token, eager against graphs, batch 16 and 64, against the bandwidth limit (decode_gpu.py: a
#     random model of SmolLM2-135M's shape, since SmolLM2's own weights (94 MB) are over what a call carries);
#  3. grid throughput against compare --jobs N on the one GPU (N = 1, 2, 4, 8; 8 cells of a 4-layer, 512-wide
#     tiny Llama, 10 iterations each, decoding through graphs), each N's wall time in $OUT/jobs.txt.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_session}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, transformers, peft, accelerate; print('torch', torch.__version__, 'transformers',
transformers.__version__, 'peft', peft.__version__, 'accelerate', accelerate.__version__)"
} 2>&1 | tee "$OUT/machine.txt"

timeout 300 python3 -m pytest -m cuda -q -p no:cacheprovider -x tests 2>&1 | tee "$OUT/cuda_tests.log"
timeout 150 python3 benchmarks/decode_gpu.py 2>&1 | tee "$OUT/decode_gpu.log"

sets=(--set model.device=cuda --set sampling.cuda_graphs=true --set model.tiny_hidden=512 --set model.tiny_layers=4
      --set steps=10 --set eval.every=10 --set checkpoint_every=0 --set threads=2)
for n in 1 2 4 8; do
  start=$(date +%s.%N)
  timeout 150 python3 -m elastic_reset.cli compare configs/tiny.yaml --out "/tmp/jobs$n" \
    --methods kl,elastic_reset,none,reset_to_init --seeds 2 --jobs "$n" "${sets[@]}" > "$OUT/jobs$n.log" 2>&1
  code=$?
  echo "jobs $n: exit $code, $(python3 -c "import time; print(round(time.time() - $start, 1))") s for 8 cells" \
    | tee -a "$OUT/jobs.txt"
done
grep -h "peaks at" "$OUT"/jobs*.log | head -1 | tee -a "$OUT/jobs.txt"
