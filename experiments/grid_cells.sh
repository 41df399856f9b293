# Sourced by the grids that span sessions (imdb_grid.sh, gold_vs_proxy.sh, translation_grid.sh): what lets a grid
# go on where an earlier session stopped, on this machine or a new one. runs/ need not outlive a session; the
# finished cells' small files under results/ (committed) do.
#   same_build BUILT.json RECORDED.json KEY  the first call records BUILT at RECORDED; a later one refuses a BUILT
#                                            whose KEY (a dotted path to a number) differs: a derived artefact the
#                                            cache lost and rebuilt (another CPU kind, another build) is another
#                                            model, and a grid's cells must share theirs
#   collect_cells GRID RESULTS               each finished cell's config, metrics, label, task, done marker and
#                                            machines.jsonl (not its checkpoints) into RESULTS/runs/, same layout
#   restore_cells RESULTS GRID               cells finished in an earlier session back into GRID, where compare
#                                            finds them finished and skips them
#   run_arms CONFIG N ARM... [-- ARG...]     compare over seeds 0..N-1 of the arms (their methods and settings in
#                                            the caller's METHOD and SETS arrays, compare's further ARGs after --)
#                                            into $GRID, JOBS at once, then collect_cells into $RESULTS
# PYTHON: the interpreter same_build runs (default .venv/bin/python).

same_build() {  # exit status 1: another build; 2: it could not compare (no interpreter)
  mkdir -p "$(dirname "$2")"
  command -v "${PYTHON:-.venv/bin/python}" >/dev/null || {
    echo "same_build: no Python at ${PYTHON:-.venv/bin/python} (set PYTHON)" >&2; return 2; }
  "${PYTHON:-.venv/bin/python}" - "$1" "$2" "$3" <<'PY'
import json, shutil, sys
from pathlib import Path
built, recorded, key = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
if not recorded.exists():
    shutil.copyfile(built, recorded)
    sys.exit(0)
def value(path):
    x = json.loads(path.read_text())
    for part in key.split("."):
        x = x[part]
    return float(x)
now, then = value(built), value(recorded)
if abs(now - then) > 1e-6 * abs(then):
    sys.exit(f"{built}: {key} {now:.6f}, but this grid's build had {then:.6f} ({recorded}): another build; "
             "rebuild it on the CPU kind that built the first (or start a new grid)")
PY
}

collect_cells() {
  local grid=$1 results=$2 done_file run dest f
  while IFS= read -r done_file; do
    run=$(dirname "$done_file")
    dest=$results/runs/${run#"$grid"/}
    mkdir -p "$dest"
    for f in config.yaml metrics.jsonl label task.json done machines.jsonl; do
      if [ -f "$run/$f" ]; then cp "$run/$f" "$dest/"; fi  # machines.jsonl: runs since 2026-11-26
    done
  done < <(find "$grid" -path '*/seed*/done' -type f 2>/dev/null | sort)
}

restore_cells() {
  local results=$1 grid=$2 done_file run dest
  while IFS= read -r done_file; do
    run=$(dirname "$done_file")
    dest=$grid/${run#"$results"/runs/}
    [ -e "$dest/config.yaml" ] || { mkdir -p "$dest" && cp "$run"/* "$dest/"; }
  done < <(find "$results/runs" -path '*/seed*/done' -type f 2>/dev/null | sort)
}

run_arms() {
  local config=$1 n=$2 methods=() sets=() arm kv
  shift 2
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    arm=$1
    shift
    methods+=("$arm=${METHOD[$arm]}")
    for kv in ${SETS[$arm]}; do sets+=(--method-set "$arm:$kv"); done
  done
  [ $# = 0 ] || shift  # the --
  "${ER:-.venv/bin/elastic-reset}" compare "$config" --out "$GRID" --seeds "$n" --jobs "${JOBS:-1}" --prune-finished \
    --methods "$(IFS=,; echo "${methods[*]}")" "${sets[@]}" "$@"
  collect_cells "$GRID" "$RESULTS"
}
