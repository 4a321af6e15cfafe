#!/usr/bin/env bash
# ab.sh - same-run comparisons of source revisions: build several trees side by
# side, then run one command in each, in interleaved rounds, so that a drift of
# clocks or memory falls on all of them alike.
#
#   bash scripts/ab.sh prepare REV...                # export git revisions into ab_<name>/ (git-ignored)
#   bash scripts/ab.sh run [ROUNDS] -- CMD [ARG...]  # build ab_*/ and this tree, run CMD in each
#
#   bash scripts/ab.sh prepare main                  # then, on the GPU machine:
#   TORCH_OSS_HEAD_DIMS=64,128 bash scripts/ab.sh run 2 -- python bench/decode.py --quick
#
# prepare needs git (run it where the history is); run needs none (a GPU machine
# with torch and no network, as for gpu_check.sh). run builds every tree in place
# (setup.py build_ext --inplace, MAX_JOBS shared between the trees, all at once),
# checks that `import torch_oss` from each tree's root finds that tree's build,
# then runs CMD from each tree's root with PYTHONPATH set to it (so bench/ and
# torch_oss are that tree's), the trees in alternating order from round to round.
# CMD names its script relative to the root (an absolute path is refused: the
# script's directory would come before PYTHONPATH and one tree's torch_oss would
# run in every round).
# Logs: $TORCH_OSS_RESULTS (default results/)/ab_<tree>_r<round>.log; the last
# AB_TAIL lines of each (default 20) are printed. The working tree is "work".
#
# Knobs: TORCH_OSS_HEAD_DIMS (a reduced build is what lets several trees build in
# a few minutes), TORCH_CUDA_ARCH_LIST (default 9.0a), MAX_JOBS (all trees
# together, default 16), AB_TAIL.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

usage() { sed -n '2,12p' "$0" >&2; exit 2; }

prepare() {
  [ $# -ge 1 ] || usage
  for rev in "$@"; do
    name=ab_$(printf '%s' "$rev" | sed 's/[^A-Za-z0-9_.-]/_/g')
    rm -rf "$name" && mkdir "$name" || exit 1
    git archive "$rev" | tar -x -C "$name" || { echo "ab.sh: cannot export $rev" >&2; exit 1; }
    echo "$name: $(git rev-parse --short "$rev") $(git log -1 --format=%s "$rev")"
  done
}

run() {
  local rounds=1
  if [ $# -ge 1 ] && [ "$1" != "--" ]; then rounds=$1; shift; fi
  if [ $# -lt 2 ] || [ "$1" != "--" ]; then usage; fi
  shift
  local arg
  for arg in "$@"; do
    case "$arg" in
      /*.py) echo "ab.sh: $arg is an absolute path: Python puts a script's own directory first on" \
           "sys.path, so every tree would import the torch_oss beside it; name the script relative" \
           "to the trees' root (copy it into each tree)" >&2; exit 2 ;;
    esac
  done
  local results=${TORCH_OSS_RESULTS:-results}
  mkdir -p "$results"
  results=$(cd "$results" && pwd)
  export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a} PYTHONUNBUFFERED=1
  local trees=(.) names=(work)
  for d in ab_*/; do
    [ -f "$d/setup.py" ] && trees+=("${d%/}") && names+=("${d%/}")
  done
  local n=${#trees[@]} jobs=$(( ${MAX_JOBS:-16} / ${#trees[@]} ))
  [ "$jobs" -ge 1 ] || jobs=1
  local t0 status=0
  t0=$(date +%s)
  for i in "${!trees[@]}"; do
    (cd "${trees[$i]}" && MAX_JOBS=$jobs python3 setup.py -q build_ext --inplace \
      >"$results/ab_${names[$i]}_build.log" 2>&1) &
  done
  wait
  echo "built $n trees in $(( $(date +%s) - t0 )) s (MAX_JOBS $jobs each)"
  for i in "${!trees[@]}"; do
    local dir
    dir=$(cd "${trees[$i]}" && pwd)
    if ! (cd "$dir" && PYTHONPATH=$dir python3 -c "import os, sys, torch_oss
sys.exit(os.path.dirname(os.path.abspath(torch_oss.__file__)) != os.path.join(os.getcwd(), 'torch_oss'))" \
        >>"$results/ab_${names[$i]}_build.log" 2>&1); then
      echo "ab.sh: ${names[$i]} did not build or imports another torch_oss:"; tail -20 "$results/ab_${names[$i]}_build.log"
      status=1
    fi
  done
  [ $status -eq 0 ] || exit 1
  for r in $(seq 1 "$rounds"); do
    local order=("${!trees[@]}")
    if [ $(( r % 2 )) -eq 0 ]; then
      order=(); for (( i = n - 1; i >= 0; i-- )); do order+=("$i"); done
    fi
    for i in "${order[@]}"; do
      local dir log
      dir=$(cd "${trees[$i]}" && pwd)
      log=$results/ab_${names[$i]}_r$r.log
      (cd "$dir" && PYTHONPATH=$dir "$@" >"$log" 2>&1) || { echo "ab.sh: ${names[$i]} round $r failed (rc $?)"; status=1; }
      echo "=== ${names[$i]}, round $r ($(( $(date +%s) - t0 )) s)"
      tail -n "${AB_TAIL:-20}" "$log"
    done
  done
  return $status
}

case "${1:-}" in
  prepare) shift; prepare "$@" ;;
  run) shift; run "$@" ;;
  *) usage ;;
esac
