### call 1: sbin/ak1.sh
#!/bin/bash
# session ak call 1: A/B of the lean backward block sum (sm_block_sum, plain butterflies for 16-bit
# outputs) by the self-test's fixed mode at 2^27 elements: sbin/sm_old (3eda713) against sbin/sm (the
# working tree), interleaved twice, the new one also with the light tier forced (knob 22 = 2: two slots
# per thread, 3: one); then the new binary's correctness check.
export PYTHONUNBUFFERED=1
R=$OUT/all.txt
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
BASE="bwd:bf16:4096 bwd:f16:4096 bwd:f32:1024 bwd:f32:2048 bwd:f32:4096 bwd:bf16:2048 bwd:bf16:1024 bwd:bf16:8192 bwd:bf16:128 bwd:f32:512 bwd:bf16:32768"
NEWV="bwd:bf16:4096:22=3 bwd:bf16:4096:22=2 bwd:f16:4096:22=3 bwd:f32:1024:22=2 bwd:f32:1024:22=3 bwd:f32:2048:22=2 bwd:f32:2048:22=3 bwd:f32:4096:22=2 bwd:bf16:2048:22=2 bwd:bf16:2048:22=3 bwd:bf16:1024:22=3"
for pass in 1 2; do
  FIXED_SIZES=27 timeout 150 ./sbin/sm_old fixed $BASE bwd:bf16:4096:22=3 > $OUT/fixed_old_$pass.txt 2>&1
  echo "old pass $pass rc=$? $(( $(date +%s) - t0 )) s" >> $R
  FIXED_SIZES=27 timeout 200 ./sbin/sm fixed $BASE $NEWV > $OUT/fixed_new_$pass.txt 2>&1
  echo "new pass $pass rc=$? $(( $(date +%s) - t0 )) s" >> $R
done
timeout $(( 570 - ($(date +%s) - t0) )) ./sbin/sm check > $OUT/check.txt 2>&1
echo "check rc=$? $(( $(date +%s) - t0 )) s" >> $R
tail -3 $OUT/check.txt >> $R
grep -m10 "^FAIL" $OUT/check.txt >> $R
grep -h "^fixed\|plan" $OUT/fixed_*_1.txt | head -5 >> $R

### call 2: sbin/ak2.sh
#!/bin/bash
# session ak call 2: production build (head dim 64) of 5ee9b5b; while it builds, the self-test's fixed
# mode at 2^27 (sbin/sm_old = 3eda713, sbin/sm = 5ee9b5b) on the backward rows the new rules did not
# measure in call 1; then bench/softmax.py --rounds 3 and the CUDA cases of tests/test_softmax.py.
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1 TORCH_OSS_COMMIT="5ee9b5b"
R=$OUT/all.txt
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
rm -rf build torch_oss/_C*.so csrc/cuda/generated
( python3 -m pip install -v --no-build-isolation --no-deps -e . > $OUT/build.log 2>&1; echo $? > $OUT/build.rc ) &
PTS="bwd:bf16:8192 bwd:f32:512 bwd:bf16:512 bwd:f32:256 bwd:f16:512 bwd:bf16:3000 bwd:f32:1500 fwd:bf16:4096 bwd:f16:1024"
NEWV="bwd:bf16:8192:22=1024 bwd:f32:512:22=3 bwd:bf16:512:22=3 bwd:f32:256:22=3 bwd:f16:512:22=3 bwd:bf16:3000:24=1 bwd:f32:1500:24=1"
for pass in 1 2; do
  FIXED_SIZES=27 timeout 100 ./sbin/sm_old fixed $PTS > $OUT/fixed_old_$pass.txt 2>&1
  echo "old pass $pass rc=$? $(( $(date +%s) - t0 )) s" >> $R
  FIXED_SIZES=27 timeout 100 ./sbin/sm fixed $PTS $NEWV > $OUT/fixed_new_$pass.txt 2>&1
  echo "new pass $pass rc=$? $(( $(date +%s) - t0 )) s" >> $R
done
wait
echo "build rc=$(cat $OUT/build.rc) $(( $(date +%s) - t0 )) s" >> $R
[ "$(cat $OUT/build.rc)" = 0 ] || { tail -40 $OUT/build.log >> $R; exit 1; }
grep -E "spill" $OUT/build.log | grep -v " 0 bytes spill" | head -5 >> $R
mkdir -p $OUT/run1
TORCH_OSS_RESULTS=$OUT/run1 timeout 260 python3 bench/softmax.py --rounds 3 > $OUT/bench_run1.log 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s" >> $R
timeout $(( 580 - ($(date +%s) - t0) )) python3 -m pytest tests/test_softmax.py -q -k cuda -x -p no:cacheprovider > $OUT/test_softmax_cuda.txt 2>&1
echo "pytest rc=$? $(( $(date +%s) - t0 )) s" >> $R
tail -2 $OUT/test_softmax_cuda.txt >> $R

### call 3: sbin/ak3.sh
#!/bin/bash
# session ak call 3: production build (head dim 64) of 456cf7c with the self-test check (sbin/sm,
# 456cf7c) beside it; bench/softmax.py --rounds 3; then the CUDA cases of the softmax test files.
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1 TORCH_OSS_COMMIT="456cf7c"
R=$OUT/all.txt
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
rm -rf build torch_oss/_C*.so csrc/cuda/generated
( python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1; echo $? > /tmp/build.rc ) &
timeout 300 ./sbin/sm check > /tmp/check.txt 2>&1
echo "check rc=$? $(( $(date +%s) - t0 )) s" >> $R
tail -2 /tmp/check.txt >> $R; grep -m10 "^FAIL" /tmp/check.txt >> $R
wait
echo "build rc=$(cat /tmp/build.rc) $(( $(date +%s) - t0 )) s" >> $R
[ "$(cat /tmp/build.rc)" = 0 ] || { tail -40 /tmp/build.log >> $R; exit 1; }
grep -E "spill" /tmp/build.log | grep -v " 0 bytes spill" | head -5 >> $R
mkdir -p $OUT/run1
TORCH_OSS_RESULTS=$OUT/run1 timeout 240 python3 bench/softmax.py --rounds 3 > $OUT/bench_run1.log 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s" >> $R
for tk in tests/test_softmax.py:cuda tests/test_extremes.py:cuda tests/test_errors.py:cuda tests/test_patching.py:cuda tests/test_concurrency.py:cuda tests/test_models.py:cuda tests/test_determinism.py:cuda tests/test_large.py:softmax; do
  t=${tk%%:*}; k=${tk##*:}
  left=$(( 585 - ($(date +%s) - t0) )); [ $left -gt 10 ] || { echo "no time for $tk" >> $R; continue; }
  timeout $left python3 -m pytest $t -q -k $k -p no:cacheprovider > /tmp/t.txt 2>&1
  echo "$t rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 /tmp/t.txt)" >> $R
  grep -E "^(FAILED|ERROR)" /tmp/t.txt | head -5 >> $R
done

### call 4: the command as sent (same warm machine, call 3's build of 456cf7c kept)
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64; t0=$(date +%s); ls torch_oss/_C*.so 2>/dev/null || python3 -m pip install --no-build-isolation --no-deps -e . > /tmp/b.log 2>&1; echo "build done $(( $(date +%s) - t0 )) s"; (timeout 200 compute-sanitizer --tool racecheck --error-exitcode 99 --print-limit 20 ./sbin/sm race > $OUT/racecheck.txt 2>&1; echo "racecheck rc=$?" >> $OUT/racecheck.txt) ; echo "race $(( $(date +%s) - t0 )) s"; timeout $(( 560 - ($(date +%s) - t0) )) compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 20 python3 scripts/sanitize_smoke.py softmax > $OUT/memcheck.txt 2>&1; echo "memcheck rc=$? $(( $(date +%s) - t0 )) s"; tail -4 $OUT/racecheck.txt; tail -4 $OUT/memcheck.txt

### call 5: the command as sent (same warm machine and build)
export PYTHONUNBUFFERED=1 TORCH_OSS_COMMIT=456cf7c; t0=$(date +%s); mkdir -p $OUT/run2; TORCH_OSS_RESULTS=$OUT/run2 timeout 200 python3 bench/softmax.py --rounds 3 > $OUT/bench_run2.log 2>&1; echo "bench rc=$? $(( $(date +%s) - t0 )) s"; timeout $(( 330 - ($(date +%s) - t0) )) python3 scripts/softmax_kernel_durations.py --points bwd:bfloat16:4096,bwd:float16:4096,bwd:float32:1024,bwd:float32:4096,bwd:bfloat16:128,bwd:bfloat16:8192 --calls 50 --rounds 2 > $OUT/kernel_durations_2p26.txt 2>&1; echo "durations rc=$? $(( $(date +%s) - t0 )) s"

### call 6 (H100): sbin/ak6.sh
#!/bin/bash
# session ak call 6 (H100): the self-test's fixed mode at 2^26 and 2^27, sbin/sm_old (3eda713) against
# sbin/sm (456cf7c), interleaved twice, at the backward points whose plan changed (no extension build).
export PYTHONUNBUFFERED=1
R=$OUT/all.txt
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
PTS="bwd:bf16:4096 bwd:f16:4096 bwd:f32:1024 bwd:f32:2048 bwd:f32:4096 bwd:bf16:2048 bwd:bf16:1024 bwd:f16:1024 bwd:bf16:512 bwd:f32:512 bwd:f32:256 bwd:bf16:8192 bwd:bf16:3000 bwd:f32:1500 bwd:bf16:128 bwd:f32:128 bwd:bf16:32768 fwd:bf16:4096"
for pass in 1 2; do
  FIXED_SIZES=26,27 timeout 100 ./sbin/sm_old fixed $PTS > $OUT/fixed_old_$pass.txt 2>&1
  echo "old pass $pass rc=$? $(( $(date +%s) - t0 )) s" >> $R
  FIXED_SIZES=26,27 timeout 100 ./sbin/sm fixed $PTS > $OUT/fixed_new_$pass.txt 2>&1
  echo "new pass $pass rc=$? $(( $(date +%s) - t0 )) s" >> $R
done

### calls 7 and 8 (both H100; call 8 asked for an H200 and was given the warm H100): sbin/ak7.sh, call 8 with PTS="bwd:bf16:4096 bwd:f32:1024 bwd:bf16:1024 bwd:bf16:512 bwd:bf16:8192 bwd:bf16:3000" QUICK_S=100
#!/bin/bash
# session ak calls 7 (H100) and 8 (H200): the memory-keyed backward plans (sm_fast_memory_per_sm) - the
# self-test's fixed mode at 2^26 and 2^27, sbin/sm_old (3eda713) against sbin/sm (the tree after 6fdf2b0),
# interleaved twice, with each new plan printed; then the self-test's quick check.
export PYTHONUNBUFFERED=1
R=$OUT/all.txt
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
PTS=${PTS:-"bwd:bf16:4096 bwd:f16:4096 bwd:f32:1024 bwd:f32:2048 bwd:f32:4096 bwd:bf16:2048 bwd:bf16:1024 bwd:bf16:512 bwd:f32:512 bwd:bf16:8192 bwd:bf16:3000 bwd:f32:1500"}
for pass in 1 2; do
  FIXED_SIZES=26,27 timeout 100 ./sbin/sm_old fixed $PTS > $OUT/fixed_old_$pass.txt 2>&1
  echo "old pass $pass rc=$? $(( $(date +%s) - t0 )) s" >> $R
  FIXED_SIZES=26,27 timeout 100 ./sbin/sm fixed $PTS > $OUT/fixed_new_$pass.txt 2>&1
  echo "new pass $pass rc=$? $(( $(date +%s) - t0 )) s" >> $R
done
grep "^plan bwd: [a-z]" $OUT/fixed_new_1.txt | cut -c1-60 >> $R
timeout ${QUICK_S:-150} ./sbin/sm quick > $OUT/quick.txt 2>&1
echo "quick rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 $OUT/quick.txt)" >> $R
grep -m5 "^FAIL" $OUT/quick.txt >> $R

### sbin/summ.py (the summaries: % of copy per pass, new / old)
import os,re,collections,sys
out=sys.argv[1]; d=collections.defaultdict(list)
for f in sorted(os.listdir(out)):
    if not f.startswith('fixed_'): continue
    tag=f.split('_')[1]
    for line in open(os.path.join(out,f)):
        m=re.match(r'fixed (\S+)\s+2\^(\d+):\s+([\d.]+) us\s+([\d.]+)%',line)
        if m and m.group(1)!='copy': d[(m.group(1),m.group(2))].append((tag,float(m.group(3)),float(m.group(4))))
for k in d: print(k[0],k[1],' '.join(f"{t}:{p:.1f}" for t,us,p in d[k]))
