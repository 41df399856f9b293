# Sourced by stage0.sh and grid.sh: what the study stands on, built where the cache lacks it and checked against
# the build its first cell used (grid_cells.sh's same_build on the records in $RESULTS).
#   need_base            the gold, the policy and the 4,000 gold pairs: sets CACHE and PAIRS
#   need_proxy KIND N    the KIND (rm, am) proxy on the first N pairs: prints its folder
# Needs ER, PY and RESULTS set, and grid_cells.sh sourced.

need_base() {
  local gold policy
  CACHE=$($PY -c 'from elastic_reset.models import cache_dir; print(cache_dir())')
  { read -r gold; read -r policy; read -r PAIRS; } < <($PY -c "from elastic_reset.models import gold_pairs_path, \
    imdb_classifier_path as gold, imdb_smollm2_path as policy; print(gold(), policy(False), \
    gold_pairs_path(4000, 0.5, 0), sep='\n')")
  [ -f "$gold/config.json" ] || $ER build imdb-classifier --data-dir ../shared/data >&2
  [ -f "$policy/config.json" ] || $ER build imdb-smollm2 --data-dir ../shared/data --resume >&2
  same_build "$policy/pretrain_metrics.json" "$RESULTS/policy.json" held_out_perplexity
  [ -f "$PAIRS/pairs.jsonl" ] || $ER build gold-pairs --data-dir ../shared/data --n-pairs 4000 --temperature 0.5 \
    --resume >&2
  same_build "$PAIRS/metrics.json" "$RESULTS/pairs-n4000.json" gold_p_positive_mean
}

need_proxy() {  # KIND N
  local kind=$1 n=$2 first=$CACHE/reward-hacking/pairs-first$2.jsonl
  local proxy=$CACHE/reward-models/hacking-minilm-$1-first$2
  mkdir -p "$(dirname "$first")"
  [ -f "$first" ] || { head -n "$n" "$PAIRS/pairs.jsonl" > "$first.tmp" && mv "$first.tmp" "$first"; }
  local flag=(); [ "$kind" = am ] && flag=(--advantage)
  [ -f "$proxy/reward_model.json" ] || $ER reward-model train --backbone minilm --data "$first" "${flag[@]}" \
    --out "$proxy" --resume >&2
  same_build "$proxy/reward_model.json" "$RESULTS/proxy-$kind-$n.json" metrics.test.log_loss
  echo "$proxy"
}
