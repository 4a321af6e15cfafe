### sbin/call_x1.sh
#!/usr/bin/env bash
# knob build + self-test check + variants: flattened chunk grid at 2^28, bwd 32768 looping, 1M spread
set -u
export TORCH_OSS_RESULTS=$OUT
start=$(date +%s)
(timeout 330 ./sbin/sm check > $OUT/selftest_check.log 2>&1; echo "selftest rc $?" >> $OUT/selftest_check.log) &
SELF=$!
TORCH_OSS_SOFTMAX_KNOBS=1 TORCH_OSS_HEAD_DIMS=64 TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps -e . > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - start )) s"; rm -f $OUT/build.log
wait $SELF
tail -3 $OUT/selftest_check.log; grep -E "^FAIL" $OUT/selftest_check.log | head; grep -E "70001|66001" $OUT/selftest_check.log | head
echo "t $(( $(date +%s) - start )) s"
show() { grep -E "^(fwd|bwd).*(\(|plan)|^  |rror" $1 | grep -v "resident" | sed "s/ chunk_n=.*grid=/ grid=/;s/TJ=0//"; }
P=fwd:bfloat16:2048,fwd:bfloat16:4096,bwd:bfloat16:2048,bwd:bfloat16:4096,fwd:float32:2048,bwd:float32:2048,fwd:float32:4096
timeout 200 python3 scripts/softmax_variants.py --rounds 5 --size 28 --points $P --variants "base;10=65535" > $OUT/flat_28.txt 2>&1; echo "rc $?"
mv $OUT/softmax_variants.json $OUT/flat_28.json; show $OUT/flat_28.txt
echo "t $(( $(date +%s) - start )) s"
for s in 26 28; do
  timeout 120 python3 scripts/softmax_variants.py --rounds 5 --size $s --points bwd:bfloat16:32768,bwd:float16:32768 --variants "base;10=264;10=528" > $OUT/loop32k_$s.txt 2>&1; echo "rc $?"
  mv $OUT/softmax_variants.json $OUT/loop32k_$s.json; show $OUT/loop32k_$s.txt
  echo "t $(( $(date +%s) - start )) s"
done
timeout 120 python3 scripts/softmax_variants.py --rounds 5 --size 26 --points fwd:bfloat16:1048576,fwd:float16:1048576 --variants "base;0=5;0=5,9=256,1=48" > $OUT/spread1m_26.txt 2>&1; echo "rc $?"
mv $OUT/softmax_variants.json $OUT/spread1m_26.json; show $OUT/spread1m_26.txt
echo "total $(( $(date +%s) - start )) s"

### sbin/call_x2.sh
#!/usr/bin/env bash
# knob build (de494e1) + variants: bwd 32768 as 1024 x 4 registers, f32 fwd 4096 at 256 x 4, 1M clusters of 256-thread CTAs
set -u
export TORCH_OSS_RESULTS=$OUT
start=$(date +%s)
TORCH_OSS_SOFTMAX_KNOBS=1 TORCH_OSS_HEAD_DIMS=64 TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps -e . > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - start )) s"; rm -f $OUT/build.log
show() { grep -E "^(fwd|bwd).*(\(|plan)|^  |rror" $1 | sed "s/ chunk_n=.*grid=/ grid=/;s/TJ=0//;s/ G=0//;s/ km=0//"; }
run() { # name size points variants
  timeout 150 python3 scripts/softmax_variants.py --rounds 5 --size $2 --points $3 --variants "$4" > $OUT/$1.txt 2>&1; echo "$1 rc $?"
  mv $OUT/softmax_variants.json $OUT/$1.json; show $OUT/$1.txt
  echo "t $(( $(date +%s) - start )) s"
}
run bwd32k_regs_26 26 bwd:bfloat16:32768,bwd:float16:32768 "base;0=2,1=1"
run bwd32k_regs_28 28 bwd:bfloat16:32768,bwd:float16:32768 "base;0=2,1=1"
run f32_4096_26 26 fwd:float32:4096,fwd:float32:3000 "base;11=4"
run f32_4096_28 28 fwd:float32:4096 "base;11=4"
run fwd1m_256_26 26 fwd:bfloat16:1048576,fwd:float16:1048576 "base;9=256"
echo "total $(( $(date +%s) - start )) s"

### sbin/call_x3.sh
#!/usr/bin/env bash
# knob build (de494e1) + variants: rows that the first pass holds with shared memory, as 1024-thread CTAs of registers only (0=2,1=1)
set -u
export TORCH_OSS_RESULTS=$OUT
start=$(date +%s)
TORCH_OSS_SOFTMAX_KNOBS=1 TORCH_OSS_HEAD_DIMS=64 TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps -e . > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - start )) s"; rm -f $OUT/build.log
show() { grep -E "^(fwd|bwd).*(\(|plan)|^  |rror" $1 | sed "s/ chunk_n=.*grid=/ grid=/;s/TJ=0//;s/ G=0//;s/ km=0//;s/ keep=1//;s/ al=1//;s/plan //"; }
run() { # name size points variants
  timeout 250 python3 scripts/softmax_variants.py --rounds 4 --size $2 --points $3 --variants "$4" > $OUT/$1.txt 2>&1; echo "$1 rc $?"
  rm -f $OUT/softmax_variants.json; show $OUT/$1.txt
  echo "t $(( $(date +%s) - start )) s"
}
P=bwd:bfloat16:20000,bwd:bfloat16:24576,bwd:bfloat16:32768,bwd:float32:12000,bwd:float32:16384,fwd:bfloat16:40000,fwd:bfloat16:65536,fwd:float32:20000,fwd:float32:32768
run regs1024_26 26 $P "base;0=2,1=1"
run regs1024_28 28 $P "base;0=2,1=1"
echo "total $(( $(date +%s) - start )) s"

### sbin/call_x4.sh
#!/usr/bin/env bash
# knob build + self-test check (1024-thread backward rule) + variants base vs 19=1 + memcheck/racecheck
set -u
export TORCH_OSS_RESULTS=$OUT
start=$(date +%s)
(timeout 300 ./sbin/sm check > $OUT/selftest_check.log 2>&1; echo "selftest rc $?" >> $OUT/selftest_check.log) &
SELF=$!
TORCH_OSS_SOFTMAX_KNOBS=1 TORCH_OSS_HEAD_DIMS=64 TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps -e . > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - start )) s"; rm -f $OUT/build.log
wait $SELF
tail -2 $OUT/selftest_check.log; grep -E "^FAIL" $OUT/selftest_check.log | head
echo "t $(( $(date +%s) - start )) s"
show() { grep -E "^(fwd|bwd).*(\(|plan)|^  |rror" $1 | sed "s/ chunk_n=.*grid=/ grid=/;s/TJ=0//;s/ G=0//;s/ km=0//;s/ keep=1//;s/ al=1//;s/plan //"; }
run() { # name size points variants
  timeout 150 python3 scripts/softmax_variants.py --rounds 4 --size $2 --points $3 --variants "$4" > $OUT/$1.txt 2>&1; echo "$1 rc $?"
  rm -f $OUT/softmax_variants.json; show $OUT/$1.txt
  echo "t $(( $(date +%s) - start )) s"
}
P=bwd:bfloat16:24576,bwd:float16:32768,bwd:float32:16384,bwd:float32:12289,bwd:bfloat16:20000
run rule_26 26 $P "base;19=1"
run rule_28 28 $P "base;19=1"
timeout 120 compute-sanitizer --tool memcheck ./sbin/sm quick > $OUT/memcheck_quick.txt 2>&1; echo "memcheck rc $?"; tail -3 $OUT/memcheck_quick.txt
timeout 60 compute-sanitizer --tool racecheck ./sbin/sm race > $OUT/racecheck_race.txt 2>&1; echo "racecheck rc $?"; tail -3 $OUT/racecheck_race.txt
echo "total $(( $(date +%s) - start )) s"

### sbin/call_x5.sh
#!/usr/bin/env bash
# production build from scratch + self-test quick + CUDA pytest (softmax files) + bench/softmax.py --rounds 3
set -u
export TORCH_OSS_RESULTS=$OUT
start=$(date +%s)
(timeout 200 ./sbin/sm quick > $OUT/selftest_quick.log 2>&1; echo "selftest rc $?" >> $OUT/selftest_quick.log) &
SELF=$!
bash scripts/gpu_check.sh build 2>&1 | tail -8
echo "build $(( $(date +%s) - start )) s"
wait $SELF; tail -2 $OUT/selftest_quick.log; grep -E "^FAIL" $OUT/selftest_quick.log | head
TESTS="tests/test_softmax.py tests/test_errors.py tests/test_patching.py tests/test_extremes.py" PYTEST_ARGS="-k cuda" TEST_JOBS=4 FILE_TIMEOUT=200 STAGE_TIMEOUT=250 bash scripts/gpu_check.sh test 2>&1 | tail -12
echo "tests $(( $(date +%s) - start )) s"
timeout 200 python3 bench/softmax.py --rounds 3 > $OUT/bench_softmax_rounds3.log 2>&1; echo "bench rc $?"
grep -vE "^\s*$" $OUT/bench_softmax_rounds3.log | tail -75
rm -f $OUT/build.log
echo "total $(( $(date +%s) - start )) s"

### sbin/call_x6.sh
#!/usr/bin/env bash
# final kernels (72d382e): self-test check, memcheck quick, racecheck race (no build needed)
set -u
start=$(date +%s)
timeout 280 ./sbin/sm check > $OUT/selftest_check_final.log 2>&1; echo "check rc $?"; tail -2 $OUT/selftest_check_final.log; grep -E "^FAIL" $OUT/selftest_check_final.log | head
echo "t $(( $(date +%s) - start )) s"
timeout 120 compute-sanitizer --tool memcheck ./sbin/sm quick > $OUT/memcheck_quick_final.txt 2>&1; echo "memcheck rc $?"; tail -2 $OUT/memcheck_quick_final.txt
timeout 60 compute-sanitizer --tool racecheck ./sbin/sm race > $OUT/racecheck_race_final.txt 2>&1; echo "racecheck rc $?"; tail -2 $OUT/racecheck_race_final.txt
echo "total $(( $(date +%s) - start )) s"

### sbin/call_x7.sh
#!/usr/bin/env bash
# final kernels (72d382e), self-test with aligned rule cases in quick/race: self-test check, memcheck quick, racecheck race (no build needed)
set -u
start=$(date +%s)
timeout 280 ./sbin/sm check > $OUT/selftest_check_final2.log 2>&1; echo "check rc $?"; tail -2 $OUT/selftest_check_final2.log; grep -E "^FAIL" $OUT/selftest_check_final2.log | head
echo "t $(( $(date +%s) - start )) s"
timeout 120 compute-sanitizer --tool memcheck ./sbin/sm quick > $OUT/memcheck_quick_final2.txt 2>&1; echo "memcheck rc $?"; tail -2 $OUT/memcheck_quick_final2.txt
timeout 60 compute-sanitizer --tool racecheck ./sbin/sm race > $OUT/racecheck_race_final2.txt 2>&1; echo "racecheck rc $?"; tail -2 $OUT/racecheck_race_final2.txt
echo "total $(( $(date +%s) - start )) s"

### sbin/call_x8.sh
#!/usr/bin/env bash
# production build (6e0c2df + test_large's rows of 4096) + the softmax cases of tests/test_large.py
set -u
export TORCH_OSS_RESULTS=$OUT
start=$(date +%s)
bash scripts/gpu_check.sh build 2>&1 | grep -E "build took|^build:|H100"
rm -f $OUT/build.log
timeout 330 python3 -m pytest -q -p no:cacheprovider tests/test_large.py -k softmax --durations=0 2>&1 | tail -15 | tee $OUT/test_large_softmax.txt
echo "total $(( $(date +%s) - start )) s"

### sbin/call_x9.sh
#!/usr/bin/env bash
# knob build (final kernels) + variants: rows of 2/3-3/4 of 1024 x 4 slots in the 1024-thread plan; the release under it at 32768
set -u
export TORCH_OSS_RESULTS=$OUT
start=$(date +%s)
TORCH_OSS_SOFTMAX_KNOBS=1 TORCH_OSS_HEAD_DIMS=64 TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps -e . > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - start )) s"; rm -f $OUT/build.log
show() { grep -E "^(fwd|bwd).*(\(|plan)|^  |rror" $1 | sed "s/ chunk_n=.*grid=/ grid=/;s/TJ=0//;s/ G=0//;s/ km=0//;s/ keep=1//;s/ al=1//;s/plan //"; }
run() { # name size points variants
  timeout 200 python3 scripts/softmax_variants.py --rounds 4 --size $2 --points $3 --variants "$4" > $OUT/$1.txt 2>&1; echo "$1 rc $?"
  rm -f $OUT/softmax_variants.json; show $OUT/$1.txt
  echo "t $(( $(date +%s) - start )) s"
}
P=bwd:float32:11000,bwd:bfloat16:22528,bwd:float32:12000,bwd:bfloat16:23552
run band_26 26 $P "base;0=2,1=1"
run band_28 28 $P "base;0=2,1=1"
run release32k_26 26 bwd:bfloat16:32768,bwd:float16:32768 "base;17=2"
echo "total $(( $(date +%s) - start )) s"

