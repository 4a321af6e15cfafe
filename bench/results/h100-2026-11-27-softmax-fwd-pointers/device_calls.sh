### call 1: sbin/al1.sh
#!/bin/bash
# session al call 1 (H100): A/B of the kernels' per-thread row pointers (90c36cc) by the self-test's fixed
# mode, sbin/sm_base (852be5e) against sbin/sm (90c36cc), interleaved twice at 2^26 and 2^27, default plans
# and forced light / other shapes (knob 22); a production build beside it; the self-test check;
# bench/softmax.py --rounds 3; the CUDA cases of tests/test_softmax.py.
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1 TORCH_OSS_COMMIT="${COMMIT:-90c36cc}"
R=$OUT/all.txt
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
rm -rf build torch_oss/_C*.so csrc/cuda/generated
( python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1; echo $? > /tmp/build.rc ) &
PTS="bwd:bf16:4096 bwd:f16:4096 bwd:f32:4096 bwd:f32:1024 bwd:bf16:8192 bwd:bf16:3000 bwd:f32:1500 bwd:bf16:128 bwd:f32:128 bwd:bf16:1024 bwd:bf16:32768 fwd:bf16:128 fwd:f32:128 fwd:bf16:1024 fwd:bf16:4096 fwd:f32:4096 fwd:bf16:8192 fwd:bf16:32768 fwd:f32:1024"
VAR="bwd:bf16:4096:22=2 bwd:f16:4096:22=2 bwd:bf16:2048:22=2 bwd:f32:1024:22=2 bwd:f32:2048:22=2 bwd:bf16:1024:22=3 bwd:bf16:512:22=3 bwd:f32:512:22=3 bwd:f32:4096:22=1 bwd:f32:4096:22=1024"
for pass in 1 2; do
  FIXED_SIZES=26,27 timeout 100 ./sbin/sm_base fixed $PTS $VAR > $OUT/fixed_base_$pass.txt 2>&1
  echo "base pass $pass rc=$? $(( $(date +%s) - t0 )) s" >> $R
  FIXED_SIZES=26,27 timeout 100 ./sbin/sm fixed $PTS $VAR > $OUT/fixed_new_$pass.txt 2>&1
  echo "new pass $pass rc=$? $(( $(date +%s) - t0 )) s" >> $R
done
python3 sbin/summ.py $OUT > $OUT/summary.txt 2>&1
for f in $OUT/fixed_*_?.txt; do echo "== $(basename $f)"; cat $f; done > $OUT/fixed_raw.txt; rm -f $OUT/fixed_*_?.txt
timeout 300 ./sbin/sm check > /tmp/check.txt 2>&1
echo "check rc=$? $(( $(date +%s) - t0 )) s" >> $R
tail -2 /tmp/check.txt >> $R; grep -m10 "^FAIL" /tmp/check.txt >> $R
wait
echo "build rc=$(cat /tmp/build.rc) $(( $(date +%s) - t0 )) s" >> $R
[ "$(cat /tmp/build.rc)" = 0 ] || { tail -40 /tmp/build.log >> $R; exit 1; }
grep -E "spill" /tmp/build.log | grep -v " 0 bytes spill" | head -5 >> $R
mkdir -p $OUT/run1
TORCH_OSS_RESULTS=$OUT/run1 timeout 200 python3 bench/softmax.py --rounds 3 > $OUT/bench_run1.log 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s" >> $R
left=$(( 590 - ($(date +%s) - t0) ))
timeout $left python3 -m pytest tests/test_softmax.py -q -k cuda -p no:cacheprovider > /tmp/t.txt 2>&1
echo "test_softmax rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 /tmp/t.txt)" >> $R
grep -E "^(FAILED|ERROR)" /tmp/t.txt | head -5 >> $R

### call 2: sbin/al2.sh
#!/bin/bash
# session al call 2 (H200): the self-test's fixed-mode A/B, sbin/sm_base (852be5e) against sbin/sm (90c36cc's
# kernels + the float32 1024-slot plan), interleaved twice at 2^26 and 2^27, with the plans printed (the
# H200 branch of sm_fast_memory_per_sm); racecheck on the race mode beside a production build; then
# bench/softmax.py --rounds 3 and memcheck on scripts/sanitize_smoke.py softmax.
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1 TORCH_OSS_COMMIT="${COMMIT:-90c36cc}"
R=$OUT/all.txt
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
rm -rf build torch_oss/_C*.so csrc/cuda/generated
( python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1; echo $? > /tmp/build.rc ) &
PTS="bwd:bf16:4096 bwd:f16:4096 bwd:f32:4096 bwd:f32:1024 bwd:bf16:8192 bwd:bf16:3000 bwd:f32:1500 bwd:bf16:128 bwd:f16:128 bwd:f32:128 bwd:bf16:1024 bwd:bf16:512 bwd:f32:512 bwd:bf16:32768 fwd:bf16:128 fwd:f16:512 fwd:bf16:1024 fwd:bf16:4096 fwd:f32:4096 fwd:bf16:8192 fwd:bf16:32768"
VAR="bwd:f32:4096:22=1024 bwd:bf16:4096:22=1"
for pass in 1 2; do
  FIXED_SIZES=26,27 timeout 100 ./sbin/sm_base fixed $PTS $VAR > $OUT/fixed_base_$pass.txt 2>&1
  echo "base pass $pass rc=$? $(( $(date +%s) - t0 )) s" >> $R
  FIXED_SIZES=26,27 timeout 100 ./sbin/sm fixed $PTS $VAR > $OUT/fixed_new_$pass.txt 2>&1
  echo "new pass $pass rc=$? $(( $(date +%s) - t0 )) s" >> $R
done
python3 sbin/summ.py $OUT > $OUT/summary.txt 2>&1
grep "^plan bwd: [a-z]" $OUT/fixed_new_1.txt | cut -c1-70 > $OUT/plans.txt
grep "^plan bwd: [a-z]" $OUT/fixed_base_1.txt | cut -c1-70 | diff - $OUT/plans.txt >> $OUT/plans.txt
for f in $OUT/fixed_*_?.txt; do echo "== $(basename $f)"; cat $f; done > $OUT/fixed_raw.txt; rm -f $OUT/fixed_*_?.txt
timeout 150 compute-sanitizer --tool racecheck --error-exitcode 99 --print-limit 20 ./sbin/sm race > /tmp/race.txt 2>&1
echo "racecheck rc=$? $(( $(date +%s) - t0 )) s" >> $R; tail -3 /tmp/race.txt >> $R
wait
echo "build rc=$(cat /tmp/build.rc) $(( $(date +%s) - t0 )) s" >> $R
[ "$(cat /tmp/build.rc)" = 0 ] || { tail -40 /tmp/build.log >> $R; exit 1; }
mkdir -p $OUT/run1
TORCH_OSS_RESULTS=$OUT/run1 timeout 200 python3 bench/softmax.py --rounds 3 > $OUT/bench_run1.log 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s" >> $R
timeout $(( 590 - ($(date +%s) - t0) )) compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 20 python3 scripts/sanitize_smoke.py softmax > /tmp/mem.txt 2>&1
echo "memcheck rc=$? $(( $(date +%s) - t0 )) s" >> $R; tail -3 /tmp/mem.txt >> $R

### call 3: sbin/al3.sh
#!/bin/bash
# session al call 3 (H100): a production build of 7586a5a (forward kernels of 90c36cc, backward kernels of
# 852be5e, the float32 1024-slot plan) with the self-test's quick check beside it; the fixed-mode A/B
# against sbin/sm_base (852be5e) at 2^26 and 2^27, interleaved twice; bench/softmax.py --rounds 3; the CUDA
# cases of the softmax test files.
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1 TORCH_OSS_COMMIT="${COMMIT:-7586a5a}"
R=$OUT/all.txt
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
rm -rf build torch_oss/_C*.so csrc/cuda/generated
( python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1; echo $? > /tmp/build.rc ) &
timeout 150 ./sbin/sm quick > /tmp/quick.txt 2>&1
echo "quick rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 /tmp/quick.txt)" >> $R
grep -m5 "^FAIL" /tmp/quick.txt >> $R
wait
echo "build rc=$(cat /tmp/build.rc) $(( $(date +%s) - t0 )) s" >> $R
[ "$(cat /tmp/build.rc)" = 0 ] || { tail -40 /tmp/build.log >> $R; exit 1; }
PTS="bwd:f32:4096 bwd:bf16:4096 bwd:bf16:128 bwd:bf16:8192 fwd:bf16:8192 fwd:bf16:4096 fwd:f16:512 fwd:bf16:32768 fwd:bf16:1024 fwd:f32:4096 fwd:bf16:128 fwd:f32:1024"
for pass in 1 2; do
  FIXED_SIZES=26,27 timeout 60 ./sbin/sm_base fixed $PTS > $OUT/fixed_base_$pass.txt 2>&1
  FIXED_SIZES=26,27 timeout 60 ./sbin/sm fixed $PTS > $OUT/fixed_new_$pass.txt 2>&1
done
echo "fixed done $(( $(date +%s) - t0 )) s" >> $R
python3 sbin/summ.py $OUT > $OUT/summary.txt 2>&1
for f in $OUT/fixed_*_?.txt; do echo "== $(basename $f)"; cat $f; done > $OUT/fixed_raw.txt; rm -f $OUT/fixed_*_?.txt
mkdir -p $OUT/run1
TORCH_OSS_RESULTS=$OUT/run1 timeout 200 python3 bench/softmax.py --rounds 3 > $OUT/bench_run1.log 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s" >> $R
for tk in "tests/test_softmax.py:cuda" "tests/test_errors.py:cuda" "tests/test_patching.py:cuda" "tests/test_concurrency.py:cuda" "tests/test_large.py:softmax" "tests/test_extremes.py:cuda and softmax" "tests/test_determinism.py:cuda and softmax" "tests/test_models.py:cuda"; do
  t=${tk%%:*}; k=${tk#*:}
  left=$(( 595 - ($(date +%s) - t0) )); [ $left -gt 10 ] || { echo "no time for $tk" >> $R; continue; }
  timeout $left python3 -m pytest $t -q -k "$k" -p no:cacheprovider > /tmp/t.txt 2>&1
  echo "$t [$k] rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 /tmp/t.txt)" >> $R
  grep -E "^(FAILED|ERROR)" /tmp/t.txt | head -5 >> $R
done


### call 4: sbin/al4.sh
#!/bin/bash
# session al call 4 (H200): why the backward slowed with per-thread row pointers (v37). Nsight Compute on
# one launch of the bfloat16 backward at 1024 columns (light 128 x 1) and 128 columns (warp kernel), 2^27
# elements, sbin/sm_base (852be5e, the kept backward) against sbin/sm_all (62901c1, the pointers in the backward).
R=$OUT/all.txt
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
for pt in bwd:bf16:1024 bwd:bf16:128; do
  for b in sm_base sm_all; do
    FIXED_SIZES=27 timeout 60 ncu --clock-control none -k regex:"softmax_row_in_cta|softmax_rows_in_warp" --launch-skip 3 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section MemoryWorkloadAnalysis \
      --metrics smsp__inst_executed.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum \
      ./sbin/$b fixed $pt > $OUT/ncu_${pt//:/_}_$b.txt 2>&1
    echo "$pt $b rc=$? $(( $(date +%s) - t0 )) s" >> $R
  done
done

### call 5: sbin/al5.sh (default PTS)
#!/bin/bash
# session al calls 5 (H200) and 6 (H100): the light kernel without its spilled slot count (nv per row;
# the 16-bit backward's 8-byte stack gone) and the warp forward's row pointers at one row per lane only.
# Fixed-mode A/B, sbin/sm_base (852be5e) against sbin/sm, interleaved twice at 2^26 and 2^27; then the
# light tier's checks: race mode (its light cases), quick with the light tier forced (knob 22 = 2).
R=$OUT/all.txt
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
PTS=${PTS:-"bwd:bf16:4096 bwd:f16:4096 bwd:bf16:1024 bwd:bf16:512 bwd:bf16:3000 bwd:bf16:8192 bwd:f32:4096 bwd:bf16:128 fwd:f16:512 fwd:bf16:4096 fwd:bf16:8192 fwd:bf16:64"}
for pass in 1 2; do
  FIXED_SIZES=26,27 timeout 60 ./sbin/sm_base fixed $PTS > $OUT/fixed_base_$pass.txt 2>&1
  FIXED_SIZES=26,27 timeout 60 ./sbin/sm fixed $PTS > $OUT/fixed_new_$pass.txt 2>&1
done
echo "fixed done $(( $(date +%s) - t0 )) s" >> $R
python3 sbin/summ.py $OUT > $OUT/summary.txt 2>&1
for f in $OUT/fixed_*_?.txt; do echo "== $(basename $f)"; cat $f; done > $OUT/fixed_raw.txt; rm -f $OUT/fixed_*_?.txt
timeout 60 ./sbin/sm race > /tmp/race.txt 2>&1
echo "race rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 /tmp/race.txt)" >> $R
SELFTEST_KNOBS="22=3" timeout 60 ./sbin/sm race > /tmp/race3.txt 2>&1
echo "race 22=3 rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 /tmp/race3.txt)" >> $R
SELFTEST_KNOBS="22=2" timeout ${QUICK_S:-80} ./sbin/sm quick > /tmp/quick.txt 2>&1
echo "quick 22=2 rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 /tmp/quick.txt)" >> $R
grep -m5 "^FAIL" /tmp/race.txt /tmp/race3.txt /tmp/quick.txt >> $R

### calls 6 and 7: see call6_7_h200_checks.txt
