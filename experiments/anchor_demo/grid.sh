#!/usr/bin/env bash
# The anchor family on the demo task (SmolLM2-135M-Instruct + LoRA, VADER reward, RLOO 4 x 4,
# lr 3e-3, 16 iterations: configs/demo.yaml), 3 seeds; every method's own key setting at two values, the same
# budget for all. Then `none`'s policies swept toward their initial model (model averaging, ExPO at 1.25).
#   bash experiments/anchor_demo/grid.sh        (~40 runs of ~40 s on an AVX-512 BF16 CPU; resumable)
#   STAGE=report bash experiments/anchor_demo/grid.sh      (only the sweep and the report)
#
# The settings (decided before any run; the demo's KL to the initial model reaches ~28 nats a sequence by
# iteration 16 without control, so beta 0.01-0.03 is a penalty of 0.1-0.8 against a reward range of 2):
#  none            no KL, no resets (the demo's baseline); its sweep points: lambda 0.25, 0.5, 0.75, 1.25
#  kl_b01, kl_b03  KL to the initial model in the reward, beta 0.01 / 0.03 (fixed)
#  er_d78, er_d90  Elastic Reset, reset every 6 (the demo), EMA decay 0.78 (the demo) / 0.90, no KL (as the demo)
#  erkl_4, erkl_8  Elastic Reset pulled when the iteration's KL to the initial model passes 4 / 8 nats (at most every
#                  3 iterations), decay 0.78, no KL in the reward (the KL is logged every iteration for the trigger)
#  refreset_4, _8  ProRL: KL (beta 0.03) to a reference reset to the policy, optimizer state dropped, every 4 / 8
#  refsync_3, _8   TR-DPO: KL (beta 0.03) to a reference mixed toward the policy every 4 iterations, alpha 0.3 / 0.8
#                  (with LoRA, A and B are mixed separately: an approximation, core/anchor.py says why)
#  ema_80, ema_95  WARP / EMA-PG: KL (beta 0.03) to an EMA of the policy, decay 0.80 / 0.95
set -euo pipefail
cd "$(dirname "$0")/../.."
GRID=${GRID:-runs/anchor_demo}
RESULTS=${RESULTS:-results/anchor_demo}
SEEDS=${SEEDS:-3}
if [ "${STAGE:-all}" != report ]; then
  for n in $(seq 1 "$SEEDS"); do  # seed by seed: a grid stopped part-way has every method at equal seeds
    .venv/bin/elastic-reset compare configs/demo.yaml --out "$GRID" --seeds "$n" --jobs "${JOBS:-1}" \
      --methods none,kl_b01=kl,kl_b03=kl,er_d78=elastic_reset,er_d90=elastic_reset,erkl_4=anchor,erkl_8=anchor,refreset_4=anchor,refreset_8=anchor,refsync_3=anchor,refsync_8=anchor,ema_80=anchor,ema_95=anchor \
      --method-set kl_b01:kl.coef=0.01 --method-set kl_b03:kl.coef=0.03 \
      --method-set er_d78:method.decay=0.78 --method-set er_d90:method.decay=0.90 \
      --method-set erkl_4:method.preset=elastic_reset --method-set erkl_4:method.every=null \
      --method-set erkl_4:method.kl_budget=4 --method-set erkl_4:method.cooldown=3 \
      --method-set erkl_4:method.decay=0.78 --method-set erkl_4:kl.log_every=1 \
      --method-set erkl_8:method.preset=elastic_reset --method-set erkl_8:method.every=null \
      --method-set erkl_8:method.kl_budget=8 --method-set erkl_8:method.cooldown=3 \
      --method-set erkl_8:method.decay=0.78 --method-set erkl_8:kl.log_every=1 \
      --method-set refreset_4:method.preset=ref_reset --method-set refreset_4:method.every=4 \
      --method-set refreset_4:kl.coef=0.03 \
      --method-set refreset_8:method.preset=ref_reset --method-set refreset_8:method.every=8 \
      --method-set refreset_8:kl.coef=0.03 \
      --method-set refsync_3:method.preset=ref_sync --method-set refsync_3:method.every=4 \
      --method-set refsync_3:method.alpha=0.3 --method-set refsync_3:kl.coef=0.03 \
      --method-set refsync_8:method.preset=ref_sync --method-set refsync_8:method.every=4 \
      --method-set refsync_8:method.alpha=0.8 --method-set refsync_8:kl.coef=0.03 \
      --method-set ema_80:method.preset=ema_anchor --method-set ema_80:method.decay=0.80 \
      --method-set ema_80:kl.coef=0.03 \
      --method-set ema_95:method.preset=ema_anchor --method-set ema_95:method.decay=0.95 \
      --method-set ema_95:kl.coef=0.03 \
      --set progress=false
  done
fi
for run in "$GRID"/none/seed*/; do
  [ -f "$run/done" ] || continue
  grep -q '"lambda": 1.25' "$run/sweep.jsonl" 2>/dev/null || \
    .venv/bin/elastic-reset sweep "$run" --lambdas 0.25,0.5,0.75,1.25
done
.venv/bin/python experiments/anchor_demo/report.py "$GRID" "$RESULTS"
