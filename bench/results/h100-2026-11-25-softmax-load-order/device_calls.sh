### sbin/ag1.sh
#!/bin/bash
# session ag call 1: register loads before the shared-memory copy on a CTA's first row (test knob 25) - knob build, selftest check with it, variants at 2^26 and 2^28
export TORCH_OSS_RESULTS=$OUT TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=14 TORCH_OSS_SOFTMAX_KNOBS=1 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1
R=$OUT/all.txt
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
(SELFTEST_KNOBS=25=3 timeout 175 ./sbin/sm check > $OUT/selftest.txt 2>&1; echo "selftest check (25=3) rc $? $(( $(date +%s) - t0 )) s" >> $OUT/selftest.txt) &
SPID=$!
rm -rf build torch_oss/_C*.so csrc/cuda/generated
python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 /tmp/build.log >> $R; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" >> $R
wait $SPID; grep -E "rc |fail|FAIL" $OUT/selftest.txt | head -20 >> $R
timeout 200 python3 scripts/softmax_variants.py --points fwd:bfloat16:1048576,fwd:float16:1048576,fwd:bfloat16:262144,fwd:float16:128256,fwd:float32:1048576,fwd:float32:262144,bwd:bfloat16:262144,bwd:bfloat16:1048576,bwd:float16:128256,bwd:float32:262144 \
  --variants "base;25=3" --rounds 5 > $OUT/variants_2p26.txt 2>&1
echo "variants 2^26 rc=$? $(( $(date +%s) - t0 )) s" >> $R
timeout $(( 590 - ($(date +%s) - t0) )) python3 scripts/softmax_variants.py --points fwd:bfloat16:1048576,fwd:float16:1048576,fwd:bfloat16:262144,bwd:bfloat16:262144 --size 28 \
  --variants "base;25=3" --rounds 3 > $OUT/variants_2p28.txt 2>&1
echo "variants 2^28 rc=$? $(( $(date +%s) - t0 )) s" >> $R
### sbin/ag2.sh
#!/bin/bash
# session ag call 6: a linear ramp for the first wave of the chunk kernel's rows (test knobs 25, 26) - knob build, selftest quick with it, variants at 2^26
export TORCH_OSS_RESULTS=$OUT TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=14 TORCH_OSS_SOFTMAX_KNOBS=1 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1
R=$OUT/all.txt
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
(SELFTEST_KNOBS=25=700 timeout 120 ./sbin/sm quick > $OUT/selftest.txt 2>&1; echo "selftest quick (25=700) rc $? $(( $(date +%s) - t0 )) s" >> $OUT/selftest.txt) &
SPID=$!
rm -rf build torch_oss/_C*.so csrc/cuda/generated
python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 /tmp/build.log >> $R; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" >> $R
wait $SPID; grep -E "rc |fail|FAIL" $OUT/selftest.txt | head -20 >> $R
timeout 200 python3 scripts/softmax_variants.py --points fwd:bfloat16:1048576,fwd:float16:1048576,fwd:float32:1048576 \
  --variants "base;25=500;25=700;25=900;25=1200;25=1400" --rounds 5 > $OUT/variants_1m_2p26.txt 2>&1
echo "variants 1M 2^26 rc=$? $(( $(date +%s) - t0 )) s" >> $R
timeout $(( 590 - ($(date +%s) - t0) )) python3 scripts/softmax_variants.py --points fwd:bfloat16:262144,fwd:float16:128256,bwd:bfloat16:262144,bwd:float16:128256,bwd:float32:262144 \
  --variants "base;25=90;25=180;25=300" --rounds 5 > $OUT/variants_narrower_2p26.txt 2>&1
echo "variants narrower 2^26 rc=$? $(( $(date +%s) - t0 )) s" >> $R
### sbin/ag3.sh
#!/bin/bash
# session ag call 7: the first wave's ramp in production form (step = a row's input at 85 % of the DRAM's peak; knob 25 = % of it, -1 off; 26 = 1 the one-row-per-CTA kernel too) - knob build, selftest check (ramp on), variants
export TORCH_OSS_RESULTS=$OUT TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=14 TORCH_OSS_SOFTMAX_KNOBS=1 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1
R=$OUT/all.txt
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
(timeout 170 ./sbin/sm check > $OUT/selftest.txt 2>&1; echo "selftest check (ramp on) rc $? $(( $(date +%s) - t0 )) s" >> $OUT/selftest.txt;
 SELFTEST_KNOBS=26=1 timeout 40 ./sbin/sm quick >> $OUT/selftest.txt 2>&1; echo "selftest quick (26=1) rc $? $(( $(date +%s) - t0 )) s" >> $OUT/selftest.txt) &
SPID=$!
rm -rf build torch_oss/_C*.so csrc/cuda/generated
python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 /tmp/build.log >> $R; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" >> $R
wait $SPID; grep -E "rc |fail|FAIL" $OUT/selftest.txt | head -20 >> $R
timeout 220 python3 scripts/softmax_variants.py --points fwd:bfloat16:1048576,fwd:float16:1048576,fwd:bfloat16:262144,fwd:float16:128256,fwd:float32:262144,bwd:bfloat16:262144,bwd:float16:128256,bwd:float32:262144 \
  --variants "25=-1;base;25=70;25=130" --rounds 3 > $OUT/variants_chunks_2p26.txt 2>&1
echo "variants chunks rc=$? $(( $(date +%s) - t0 )) s" >> $R
timeout $(( 590 - ($(date +%s) - t0) )) python3 scripts/softmax_variants.py --points bwd:bfloat16:32768,bwd:float16:32768,fwd:float32:4096,bwd:bfloat16:4096,fwd:bfloat16:32768,bwd:float32:16384 \
  --variants "base;26=1;26=1,25=60;26=1,25=150" --rounds 3 > $OUT/variants_cta_row_2p26.txt 2>&1
echo "variants cta-row rc=$? $(( $(date +%s) - t0 )) s" >> $R
### sbin/ag4.sh
#!/bin/bash
# session ag call 8: production build from scratch of the ramp commit, self-test check, the CUDA cases of the softmax test files, bench/softmax.py --rounds 3, memcheck on the softmax smoke grid
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 PYTHONUNBUFFERED=1
R=$OUT/all.txt
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
(timeout 200 ./sbin/sm check > $OUT/selftest_check.txt 2>&1; echo "selftest check rc $? $(( $(date +%s) - t0 )) s" >> $OUT/selftest_check.txt) &
SPID=$!
TORCH_OSS_RESULTS=/tmp/gpu bash scripts/gpu_check.sh build > $OUT/build_stage.txt 2>&1
echo "build stage rc=$? $(( $(date +%s) - t0 )) s" >> $R
tail -2 /tmp/gpu/build.log >> $R
wait $SPID; tail -3 $OUT/selftest_check.txt >> $R
TESTS="tests/test_softmax.py tests/test_extremes.py tests/test_patching.py tests/test_errors.py tests/test_concurrency.py tests/test_models.py" \
  PYTEST_ARGS="-k cuda" TEST_JOBS=4 FILE_TIMEOUT=200 TORCH_OSS_RESULTS=/tmp/gpu timeout 210 bash scripts/gpu_check.sh test > $OUT/gpu_tests.txt 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s" >> $R
grep -E "^tests/|FAILED|ERROR|passed|failed" $OUT/gpu_tests.txt | head -30 >> $R
mkdir -p $OUT/run1
TORCH_OSS_RESULTS=$OUT/run1 timeout 200 python3 bench/softmax.py --rounds 3 > $OUT/bench_run1.log 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s" >> $R
timeout $(( 595 - ($(date +%s) - t0) )) compute-sanitizer --tool memcheck python3 scripts/sanitize_smoke.py softmax > $OUT/memcheck_softmax_smoke.txt 2>&1
echo "memcheck rc=$? $(( $(date +%s) - t0 )) s" >> $R
tail -2 $OUT/memcheck_softmax_smoke.txt >> $R
### calls 1, 3, 4, 5: ./sbin/probe_sm_bw, ./sbin/probe_1m_bulk (twice), ./sbin/probe_1m_stagger (nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a <probe>.cu, built locally)
### sbin/ag5.sh
#!/bin/bash
# session ag call 9: build (head dim 64) of the tree with the first-wave test, that test on CUDA, racecheck on the self-test's race suite
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1
R=$OUT/all.txt
t0=$(date +%s)
(timeout 250 compute-sanitizer --tool racecheck ./sbin/sm race > $OUT/racecheck_selftest_race.txt 2>&1; echo "racecheck rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/racecheck_selftest_race.txt) &
SPID=$!
rm -rf build torch_oss/_C*.so csrc/cuda/generated
python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 /tmp/build.log >> $R; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" >> $R
timeout 150 python3 -m pytest -q tests/test_softmax.py -k "beyond_the_first_wave or more_rows_than_a_grid" > $OUT/test_first_wave.txt 2>&1
echo "test rc=$? $(( $(date +%s) - t0 )) s" >> $R
tail -3 $OUT/test_first_wave.txt >> $R
wait $SPID; tail -3 $OUT/racecheck_selftest_race.txt >> $R
### sbin/ag6.sh
#!/bin/bash
# session ag call 10: the first wave's ramp in the one-row-per-CTA kernel (experiment: knob 26 = step in %) - knob build, selftest quick with it, variants at 2^26 and 2^28
export TORCH_OSS_RESULTS=$OUT TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=14 TORCH_OSS_SOFTMAX_KNOBS=1 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1
R=$OUT/all.txt
t0=$(date +%s)
(SELFTEST_KNOBS=26=60 timeout 60 ./sbin/sm quick > $OUT/selftest.txt 2>&1; echo "selftest quick (26=60) rc $? $(( $(date +%s) - t0 )) s" >> $OUT/selftest.txt) &
SPID=$!
rm -rf build torch_oss/_C*.so csrc/cuda/generated
python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 /tmp/build.log >> $R; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" >> $R
wait $SPID; grep -E "rc |fail|FAIL" $OUT/selftest.txt | head -5 >> $R
timeout 250 python3 scripts/softmax_variants.py --points bwd:bfloat16:32768,bwd:float16:32768,fwd:float32:4096,bwd:bfloat16:4096,bwd:float16:4096,fwd:bfloat16:32768,bwd:float32:16384,fwd:float16:8192 \
  --variants "base;26=40;26=60;26=80" --rounds 5 > $OUT/variants_cta_row_2p26.txt 2>&1
echo "variants 2^26 rc=$? $(( $(date +%s) - t0 )) s" >> $R
timeout $(( 560 - ($(date +%s) - t0) )) python3 scripts/softmax_variants.py --points bwd:bfloat16:32768,bwd:float16:32768 --size 28 \
  --variants "base;26=60" --rounds 3 > $OUT/variants_cta_row_2p28.txt 2>&1
echo "variants 2^28 rc=$? $(( $(date +%s) - t0 )) s" >> $R
### sbin/ag7.sh
#!/bin/bash
# session ag call 11: the ramp in the one-row-per-CTA kernel's chunk-budget rows at 40 % of the step (working tree on 21bfd56) - build from scratch (head dim 64: the softmax code is the production one), self-test check, the CUDA cases of the softmax tests, bench/softmax.py --rounds 3
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1
R=$OUT/all.txt
t0=$(date +%s)
(timeout 170 ./sbin/sm check > $OUT/selftest_check.txt 2>&1; echo "selftest check rc $? $(( $(date +%s) - t0 )) s" >> $OUT/selftest_check.txt) &
SPID=$!
rm -rf build torch_oss/_C*.so csrc/cuda/generated
python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 /tmp/build.log >> $R; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" >> $R
wait $SPID; tail -2 $OUT/selftest_check.txt >> $R
TESTS="tests/test_softmax.py tests/test_extremes.py tests/test_errors.py tests/test_concurrency.py" \
  PYTEST_ARGS="-k cuda" TEST_JOBS=4 FILE_TIMEOUT=150 TORCH_OSS_RESULTS=/tmp/gpu timeout 160 bash scripts/gpu_check.sh test > $OUT/gpu_tests.txt 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s" >> $R
grep -E "^tests/|FAILED|ERROR" $OUT/gpu_tests.txt | head -20 >> $R
mkdir -p $OUT/run1
TORCH_OSS_RESULTS=$OUT/run1 timeout 200 python3 bench/softmax.py --rounds 3 > $OUT/bench_run1.log 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s" >> $R
