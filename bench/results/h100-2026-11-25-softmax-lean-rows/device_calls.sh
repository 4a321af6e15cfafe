# ---- sbin/ad1.sh
#!/bin/bash
# session ad call 1: lean per-row work in the warp and light kernels (log a constant, max-first group reduction, lg2.approx) - knob build, selftest check, CUDA softmax tests, variants against torch.compile
export TORCH_OSS_RESULTS=$OUT TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=14 TORCH_OSS_SOFTMAX_KNOBS=1 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1
R=$OUT/all.txt
t0=$(date +%s)
(SELFTEST_KNOBS=22=2 timeout 200 ./sbin/sm check > $OUT/selftest.txt 2>&1; echo "selftest check (22=2) rc $? $(( $(date +%s) - t0 )) s" >> $OUT/selftest.txt;
 SELFTEST_KNOBS=22=3 timeout 100 ./sbin/sm quick >> $OUT/selftest.txt 2>&1; echo "selftest quick (22=3) rc $? $(( $(date +%s) - t0 )) s" >> $OUT/selftest.txt) &
SPID=$!
rm -rf build torch_oss/_C*.so csrc/cuda/generated
python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 /tmp/build.log >> $R; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" >> $R
wait $SPID; grep -E "rc |fail|FAIL" $OUT/selftest.txt | head -20 >> $R
timeout 170 python3 -m pytest -q tests/test_softmax.py -k cuda -p no:cacheprovider -x > $OUT/test_softmax_cuda.txt 2>&1 &
timeout 170 python3 -m pytest -q tests/test_extremes.py -k cuda -p no:cacheprovider -x > $OUT/test_extremes_cuda.txt 2>&1 &
wait
echo "tests $(( $(date +%s) - t0 )) s" >> $R; tail -3 $OUT/test_softmax_cuda.txt $OUT/test_extremes_cuda.txt >> $R
timeout $(( 590 - ($(date +%s) - t0) )) python3 scripts/softmax_variants.py --points fwd:bfloat16:128,fwd:float16:128,fwd:bfloat16:512,fwd:float16:512,fwd:bfloat16:1024,fwd:bfloat16:4096,fwd:bfloat16:8192,fwd:float32:4096,fwd:float32:512 \
  --variants "base;22=2;22=3" --rounds 3 > $OUT/variants_2p26.txt 2>&1
echo "variants rc=$? $(( $(date +%s) - t0 )) s" >> $R
# ---- sbin/ad2.sh
#!/bin/bash
# session ad call 2: planner choices after the lean per-row work - warp tier slots per lane at 16-bit 128 columns, the light tier at 1024 forward slots; knob build
export TORCH_OSS_RESULTS=$OUT TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_SOFTMAX_KNOBS=1 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1
R=$OUT/all.txt
t0=$(date +%s)
rm -rf build torch_oss/_C*.so csrc/cuda/generated
python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 /tmp/build.log >> $R; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" >> $R
timeout 200 python3 scripts/softmax_variants.py --points fwd:bfloat16:128,fwd:float16:128 --variants "base;5=2;5=1;15=64" --rounds 5 > $OUT/variants_warp128_2p26.txt 2>&1
echo "A rc=$? $(( $(date +%s) - t0 )) s" >> $R
timeout 200 python3 scripts/softmax_variants.py --points fwd:bfloat16:8192,fwd:float16:8192,fwd:float32:4096,bwd:bfloat16:32768,bwd:float16:32768 --variants "base;22=2" --rounds 5 > $OUT/variants_light1024_2p26.txt 2>&1
echo "B rc=$? $(( $(date +%s) - t0 )) s" >> $R
timeout $(( 590 - ($(date +%s) - t0) )) python3 scripts/softmax_variants.py --size 28 --points fwd:bfloat16:8192,fwd:float32:4096,fwd:bfloat16:128 --variants "base;22=2;5=2" --rounds 3 > $OUT/variants_2p28.txt 2>&1
echo "C rc=$? $(( $(date +%s) - t0 )) s" >> $R
# ---- sbin/ad3.sh
#!/bin/bash
# session ad call 3: production build from scratch (all head dims) of the lean per-row work, the CUDA cases of the softmax-related test files, memcheck on the softmax smoke grid, racecheck on the self-test's race cases, self-test check
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 PYTHONUNBUFFERED=1
R=$OUT/all.txt
t0=$(date +%s)
TORCH_OSS_RESULTS=/tmp/gpu bash scripts/gpu_check.sh build > $OUT/build_stage.txt 2>&1
echo "build stage rc=$? $(( $(date +%s) - t0 )) s" >> $R
tail -2 /tmp/gpu/build.log >> $R
TESTS="tests/test_softmax.py tests/test_extremes.py tests/test_patching.py tests/test_errors.py tests/test_concurrency.py tests/test_models.py" \
  PYTEST_ARGS="-k cuda" TEST_JOBS=4 FILE_TIMEOUT=250 TORCH_OSS_RESULTS=/tmp/gpu timeout 270 bash scripts/gpu_check.sh test > $OUT/gpu_tests.txt 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s" >> $R
grep -E "^tests/|FAILED|ERROR" $OUT/gpu_tests.txt | head -30 >> $R
timeout 70 compute-sanitizer --tool memcheck python3 scripts/sanitize_smoke.py softmax > $OUT/memcheck_softmax_smoke.txt 2>&1
echo "memcheck rc=$? $(( $(date +%s) - t0 )) s" >> $R
tail -2 $OUT/memcheck_softmax_smoke.txt >> $R
timeout $(( 590 - ($(date +%s) - t0) )) compute-sanitizer --tool racecheck ./sbin/sm race > $OUT/racecheck_selftest_race.txt 2>&1
echo "racecheck rc=$? $(( $(date +%s) - t0 )) s" >> $R
tail -2 $OUT/racecheck_selftest_race.txt >> $R
# ---- call 4 (warm after call 3, production build of 9e4c6ec)
python3 -c "import torch_oss" && TORCH_OSS_RESULTS=$OUT timeout 280 python3 bench/softmax.py --rounds 3 > $OUT/bench_softmax_rounds3.log 2>&1
# ---- call 5 (same machine): the same again -> bench_softmax_rounds3_9e4c6ec_run2.log
# ---- call 6 (same machine): knob build (head dim 64), then
python3 scripts/softmax_variants.py --points bwd:bfloat16:4096,bwd:float16:4096,bwd:bfloat16:2048,bwd:bfloat16:32768 --variants "base;22=2;22=3" --rounds 5
# ---- sbin/ad7.sh (call 7)
#!/bin/bash
# session ad call 7: the shared register-slot output (chunk kernel) - production build from scratch with head dim 64, the CUDA softmax cases of test_softmax and test_extremes, memcheck on the softmax smoke grid
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 PYTHONUNBUFFERED=1 TORCH_OSS_HEAD_DIMS=64
R=$OUT/all.txt
t0=$(date +%s)
TORCH_OSS_RESULTS=/tmp/gpu bash scripts/gpu_check.sh build > $OUT/build_stage.txt 2>&1
echo "build stage rc=$? $(( $(date +%s) - t0 )) s" >> $R
timeout 200 python3 -m pytest -q tests/test_softmax.py -k cuda -p no:cacheprovider > $OUT/test_softmax_cuda.txt 2>&1 &
timeout 200 python3 -m pytest -q tests/test_extremes.py -k "cuda and softmax" -p no:cacheprovider > $OUT/test_extremes_softmax_cuda.txt 2>&1 &
wait
echo "tests $(( $(date +%s) - t0 )) s" >> $R; tail -1 $OUT/test_softmax_cuda.txt >> $R; tail -1 $OUT/test_extremes_softmax_cuda.txt >> $R
timeout 70 compute-sanitizer --tool memcheck python3 scripts/sanitize_smoke.py softmax > $OUT/memcheck_softmax_smoke.txt 2>&1
echo "memcheck rc=$? $(( $(date +%s) - t0 )) s" >> $R; tail -2 $OUT/memcheck_softmax_smoke.txt >> $R
# ---- call 8: knob build (head dim 64) of 3f8a51a, then
python3 scripts/softmax_variants.py --points fwd:float32:4096,fwd:float32:2048 --variants "base;11=4;11=2;22=2" --rounds 5
python3 scripts/softmax_variants.py --size 28 --points fwd:float32:4096 --variants "base;11=4;11=2;22=2" --rounds 3
