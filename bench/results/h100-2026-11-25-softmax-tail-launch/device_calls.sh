# sbin/af1.sh (call 1, on fd4b92b's parent 0973a40 + tail_launch_experiment.patch)
#!/bin/bash
# session af call 1: the tail launch (knobs 25-27: last rows of a one-row-per-CTA plan split over clusters of 2, PDL beside the main launch) - selftest check with it, knob build, variants
export TORCH_OSS_RESULTS=$OUT TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=14 TORCH_OSS_SOFTMAX_KNOBS=1 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1
R=$OUT/all.txt
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
(SELFTEST_KNOBS=25=3 timeout 150 ./sbin/sm check > $OUT/selftest.txt 2>&1; echo "selftest check (25=3) rc $? $(( $(date +%s) - t0 )) s" >> $OUT/selftest.txt;
 SELFTEST_KNOBS=25=5,27=3 timeout 60 ./sbin/sm quick >> $OUT/selftest.txt 2>&1; echo "selftest quick (25=5,27=3) rc $? $(( $(date +%s) - t0 )) s" >> $OUT/selftest.txt) &
SPID=$!
rm -rf build torch_oss/_C*.so csrc/cuda/generated
python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 /tmp/build.log >> $R; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" >> $R
wait $SPID; grep -E "rc |fail|FAIL|tail" $OUT/selftest.txt | head -30 >> $R
timeout $(( 585 - ($(date +%s) - t0) )) python3 scripts/softmax_variants.py --points bwd:bfloat16:32768,bwd:float16:32768,bwd:float32:16384,fwd:float32:4096 \
  --variants "base;25=68;25=132;25=264;25=132,26=1024;25=132,27=1;25=1056" --rounds 3 > $OUT/variants_2p26.txt 2>&1
echo "variants rc=$? $(( $(date +%s) - t0 )) s" >> $R

# sbin/af2.sh (call 2, on fd4b92b)
#!/bin/bash
# session af call 2: production build from scratch of the sm_job_view refactor (host argument checks), the CUDA cases of the softmax test files, memcheck on the softmax smoke grid, self-test check (error paths included)
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 PYTHONUNBUFFERED=1
R=$OUT/all.txt
t0=$(date +%s)
(timeout 250 ./sbin/sm check > $OUT/selftest_check.txt 2>&1; echo "selftest check rc $? $(( $(date +%s) - t0 )) s" >> $OUT/selftest_check.txt) &
SPID=$!
TORCH_OSS_RESULTS=/tmp/gpu bash scripts/gpu_check.sh build > $OUT/build_stage.txt 2>&1
echo "build stage rc=$? $(( $(date +%s) - t0 )) s" >> $R
tail -2 /tmp/gpu/build.log >> $R
wait $SPID; tail -3 $OUT/selftest_check.txt >> $R
TESTS="tests/test_softmax.py tests/test_extremes.py tests/test_patching.py tests/test_errors.py tests/test_concurrency.py tests/test_models.py" \
  PYTEST_ARGS="-k cuda" TEST_JOBS=4 FILE_TIMEOUT=250 TORCH_OSS_RESULTS=/tmp/gpu timeout 270 bash scripts/gpu_check.sh test > $OUT/gpu_tests.txt 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s" >> $R
grep -E "^tests/|FAILED|ERROR" $OUT/gpu_tests.txt | head -30 >> $R
timeout $(( 590 - ($(date +%s) - t0) )) compute-sanitizer --tool memcheck python3 scripts/sanitize_smoke.py softmax > $OUT/memcheck_softmax_smoke.txt 2>&1
echo "memcheck rc=$? $(( $(date +%s) - t0 )) s" >> $R
tail -2 $OUT/memcheck_softmax_smoke.txt >> $R

# sbin/af3.sh (call 3, on fd4b92b + window_normal_experiment.patch)
#!/bin/bash
# session af call 3: evict_normal loads in the release window instead of the release (test knob 17 = 3) - knob build, selftest quick with it, variants at 2^26 and 2^28, what the call leaves in the L2 (ncu)
export TORCH_OSS_RESULTS=$OUT TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=14 TORCH_OSS_SOFTMAX_KNOBS=1 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1
R=$OUT/all.txt
t0=$(date +%s)
(SELFTEST_KNOBS=17=3 timeout 120 ./sbin/sm quick > $OUT/selftest.txt 2>&1; echo "selftest quick (17=3) rc $? $(( $(date +%s) - t0 )) s" >> $OUT/selftest.txt) &
SPID=$!
rm -rf build torch_oss/_C*.so csrc/cuda/generated
python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 /tmp/build.log >> $R; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" >> $R
wait $SPID; tail -2 $OUT/selftest.txt >> $R
timeout 200 python3 scripts/softmax_variants.py --points bwd:bfloat16:32768,bwd:float16:32768,bwd:bfloat16:4096,bwd:float16:4096,fwd:float32:4096,bwd:float32:16384,fwd:bfloat16:32768 \
  --variants "base;17=3;17=2" --rounds 5 > $OUT/variants_2p26.txt 2>&1
echo "variants 2^26 rc=$? $(( $(date +%s) - t0 )) s" >> $R
timeout 150 python3 scripts/softmax_variants.py --points bwd:bfloat16:32768,fwd:float32:4096,bwd:float16:4096 --size 28 \
  --variants "base;17=3;17=2" --rounds 3 > $OUT/variants_2p28.txt 2>&1
echo "variants 2^28 rc=$? $(( $(date +%s) - t0 )) s" >> $R
timeout $(( 590 - ($(date +%s) - t0) )) ncu --profile-from-start off --cache-control none --replay-mode application \
  --metrics lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum \
  python3 scripts/softmax_l2_residue.py --compile --points bwd:bfloat16:32768,fwd:float32:4096,bwd:float16:4096 --variants "17=1;base;17=2;17=3" > $OUT/l2_residue.txt 2>&1
echo "ncu residue rc=$? $(( $(date +%s) - t0 )) s" >> $R

# sbin/af4.sh (call 4, on e9fc3ff)
#!/bin/bash
# session af call 4: production build from scratch of the final tree (kernels as 421c6e0; host code fd4b92b), bench/softmax.py --rounds 3 twice
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 PYTHONUNBUFFERED=1
R=$OUT/all.txt
t0=$(date +%s)
TORCH_OSS_RESULTS=/tmp/gpu bash scripts/gpu_check.sh build > /tmp/build_stage.txt 2>&1
echo "build stage rc=$? $(( $(date +%s) - t0 )) s" >> $R
mkdir -p $OUT/run1 $OUT/run2
TORCH_OSS_RESULTS=$OUT/run1 timeout 200 python3 bench/softmax.py --rounds 3 > $OUT/bench_run1.log 2>&1
echo "bench 1 rc=$? $(( $(date +%s) - t0 )) s" >> $R
TORCH_OSS_RESULTS=$OUT/run2 timeout $(( 590 - ($(date +%s) - t0) )) python3 bench/softmax.py --rounds 3 > $OUT/bench_run2.log 2>&1
echo "bench 2 rc=$? $(( $(date +%s) - t0 )) s" >> $R
