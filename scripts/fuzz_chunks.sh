#!/usr/bin/env bash
# fuzz_chunks.sh TEST SECONDS [EXAMPLES]: runs the long fuzz profile of one
# test_fuzz.py test on CUDA in chunks of EXAMPLES fresh cases (default 500)
# until SECONDS have passed, without shrinking; prints each chunk's counts
# and the first line of any failure, and keeps the logs in $TORCH_OSS_RESULTS.
test=$1; budget=$2; n=${3:-500}
out=${TORCH_OSS_RESULTS:-results}; mkdir -p "$out"
end=$(( $(date +%s) + budget )); i=0
while [ $(( end - $(date +%s) )) -gt 30 ]; do
  i=$((i + 1)); left=$(( end - $(date +%s) ))
  TORCH_OSS_FUZZ_PROFILE=long TORCH_OSS_FUZZ_NO_SHRINK=1 TORCH_OSS_FUZZ_LONG_EXAMPLES=$n timeout $left \
    python3 -m pytest "tests/test_fuzz.py::${test}[cuda]" -q -p no:cacheprovider --hypothesis-show-statistics \
    >"$out/${test}_$i.log" 2>&1
  rc=$?
  echo "chunk $i rc $rc: $(grep -E 'passing' "$out/${test}_$i.log" | head -1 | sed 's/^ *- *//')"
  grep -E "^E +AssertionError|^E +[A-Za-z.]*Error" "$out/${test}_$i.log" | head -1 | cut -c1-400
done
