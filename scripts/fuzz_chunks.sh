#!/usr/bin/env bash
# fuzz_chunks.sh TEST SECONDS [EXAMPLES]: runs the long fuzz profile of one
# tests/test_fuzz.py test in chunks of EXAMPLES fresh cases (default 500)
# until SECONDS have passed, without shrinking and without replaying saved
# failures. Prints each chunk's counts and the first line and blob of any failure, then
# a total; keeps the logs in $TORCH_OSS_RESULTS (default results/). A chunk
# cut off by the time limit (rc 124) counts nothing and is not a failure.
# FUZZ_DEVICE picks the device (default cuda). Exit status 1 if a case failed.
test=$1; budget=$2; n=${3:-500}; device=${FUZZ_DEVICE:-cuda}
out=${TORCH_OSS_RESULTS:-results}; mkdir -p "$out"
end=$(( $(date +%s) + budget )); i=0; total=0; failed=0
while [ $(( end - $(date +%s) )) -gt 30 ]; do
  i=$((i + 1)); left=$(( end - $(date +%s) )); log="$out/${test}_${device}_$i.log"
  TORCH_OSS_FUZZ_PROFILE=long TORCH_OSS_FUZZ_NO_SHRINK=1 TORCH_OSS_FUZZ_LONG_EXAMPLES=$n timeout $left \
    python3 -m pytest "tests/test_fuzz.py::${test}[${device}]" -q -p no:cacheprovider --hypothesis-show-statistics \
    >"$log" 2>&1
  rc=$?
  counts=$(grep -E 'passing' "$log" | head -1 | sed 's/^ *- *//')
  echo "chunk $i rc $rc: ${counts:-(cut off by the time limit)}"
  [ $rc = 124 ] && continue
  total=$(( total + $(echo "$counts" | grep -oE '^[0-9]+' || echo 0) ))
  if [ $rc != 0 ]; then
    failed=$((failed + 1))
    grep -E "^E +AssertionError|^E +[A-Za-z.]*Error" "$log" | head -1 | cut -c1-400
    grep -oE "@reproduce_failure\([^)]*\)" "$log" | head -1  # the blob, to replay the case anywhere
  fi
done
echo "total: $total passing cases, $failed failing chunks ($test, $device)"
[ $failed = 0 ]
