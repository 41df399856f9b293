#!/usr/bin/env bash
# Does the Translation Game's task score move with out-of-domain agents, before any grid?
#   bash experiments/translation_game/check.sh           (after `elastic-reset build translation-agents`; resumable)
#   AGENTS=DIR OUT=runs/other bash experiments/translation_game/check.sh   (agents built with --out DIR)
# Runs, on all 1,014 val sentences (greedy; task = FR→EN→DE BLEU, drift = FR→EN BLEU), every EVERY updates:
#  frozen     FROZEN ENGLISH: the speaker frozen, the listener adapting to Multi30k (lr 1e-4): the paper's +7 BLEU
#  rloo       the speaker too: RLOO 16 prompts x 4 samples (a per-prompt baseline), SIL's optimiser (Adam beta2
#             0.98, eps 1e-9, gradient clip 0.1) at lr 1e-5 and 1e-4, messages of at least 3 tokens, no KL
#             (so no reference forward), updates in minibatches of 32
# The task's gain is read against FROZEN ENGLISH at the same update: what the speaker adds.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/translation_check}
STEPS=${STEPS:-1000}
EVERY=${EVERY:-100}
common=(--set steps="$STEPS" --set eval.every="$EVERY" --set checkpoint_every="$EVERY" --set eval.num_prompts=1014
        --set kl.coef=0 --set kl.log_every=0 --set sampling.min_new_tokens=3 --set progress=false)
# AGENTS: another build's folder (e.g. one with a Multi30k share, --pretrain-lines); default: the cache's.
# The speaker (the policy) and the listener must come from the same build.
if [ -n "${AGENTS:-}" ]; then common+=(--set "task.options.agents=$AGENTS" --set "model.name=$AGENTS/fr-en"); fi
sil=(--set algo.name=rloo --set algo.prompts_per_step=16 --set algo.samples_per_prompt=4 --set algo.minibatch_size=32
     --set algo.epochs=1 --set algo.adam_beta2=0.98 --set algo.adam_eps=1e-9 --set algo.max_grad_norm=0.1
     --set algo.entropy_coef=0)
run() {  # name, then overrides
  local name=$1; shift
  [ -f "$OUT/$name/done" ] && return
  .venv/bin/elastic-reset train configs/translation.yaml --out "$OUT/$name" --resume "${common[@]}" "$@"
  touch "$OUT/$name/done"
}
run frozen --set method.name=frozen --set algo.prompts_per_step=16 --set algo.samples_per_prompt=4
run rloo_1e-5 --set method.name=none "${sil[@]}" --set algo.lr=1e-5
run rloo_1e-4 --set method.name=none "${sil[@]}" --set algo.lr=1e-4
for name in frozen rloo_1e-5 rloo_1e-4; do
  echo "== $name (step: task / drift BLEU, eval reward, message length; length ratios to the references)"
  .venv/bin/python - "$OUT/$name/metrics.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "eval/task_bleu" in r:
        ratios = (f", task {r['eval/task_length_ratio']:.2f} / drift {r['eval/drift_length_ratio']:.2f}"
                  if "eval/task_length_ratio" in r else "")  # recorded since the check of 2026-11-25
        print(f"{r['step']:5d}: {r['eval/task_bleu']:.1f} / {r['eval/drift_bleu']:.1f}, {r['eval/reward']:.3f}, "
              f"{r['eval/response_length']:.1f}{ratios}")
PY
done
