#!/bin/bash
# session ac call 1: forward CTAs shaped like Triton's fused softmax (one row per CTA, 1-4 slots per thread, <= 48 registers) against torch_oss, torch.compile and the Triton peer, bfloat16 1024 and 4096 columns
export TORCH_OSS_RESULTS=$OUT TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1
R=$OUT/all.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
t0=$(date +%s)
rm -rf build torch_oss/_C*.so csrc/cuda/generated
python3 -m pip install -v --no-build-isolation --no-deps -e . > $OUT/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 $OUT/build.log >> $R; exit 1; }
mkdir -p build && nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Xcompiler -fPIC -shared scripts/softmax_probe_kernels.cu -o build/libsoftmax_probe.so >> $R 2>&1
echo "build $(( $(date +%s) - t0 )) s" >> $R
timeout 200 python3 scripts/softmax_probe.py --bwd "" --fwd 11,17,50,51,52,53 --fwd-cols 1024 --sizes 26,28 --rounds 3 >> $R 2>&1
echo "probe 1024 done $(( $(date +%s) - t0 )) s" >> $R
timeout $(( 585 - ($(date +%s) - t0) )) python3 scripts/softmax_probe.py --bwd "" --fwd 54,55,56,57,58,59 --fwd-cols 4096 --sizes 26,28 --rounds 3 >> $R 2>&1
echo "probe 4096 done $(( $(date +%s) - t0 )) s" >> $R
#!/bin/bash
# session ac call 2: the light one-row-per-CTA tier (test knob 22) - correctness (self-test check with the tier wherever it fits) and planner variants against torch.compile
export TORCH_OSS_RESULTS=$OUT TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=14 TORCH_OSS_SOFTMAX_KNOBS=1 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1
R=$OUT/all.txt
t0=$(date +%s)
(SELFTEST_KNOBS=22=2 timeout 300 ./sbin/sm check > $OUT/selftest_check_light.txt 2>&1; echo "selftest check (22=2) rc $? $(( $(date +%s) - t0 )) s" >> $OUT/selftest_check_light.txt) &
SPID=$!
rm -rf build torch_oss/_C*.so csrc/cuda/generated
python3 -m pip install -v --no-build-isolation --no-deps -e . > $OUT/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 $OUT/build.log >> $R; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" >> $R
wait $SPID; tail -4 $OUT/selftest_check_light.txt >> $R
timeout 260 python3 scripts/softmax_variants.py --points fwd:bfloat16:512,fwd:bfloat16:1024,fwd:bfloat16:2048,fwd:bfloat16:4096,fwd:bfloat16:8192,fwd:bfloat16:16384,fwd:float16:1024,fwd:float16:4096,fwd:float32:1024,fwd:float32:4096,fwd:float32:8192,bwd:bfloat16:1024,bwd:bfloat16:4096,bwd:bfloat16:8192,bwd:float32:4096 \
  --variants "base;22=2;22=2,23=1;22=3" --rounds 5 > $OUT/variants_2p26.txt 2>&1
echo "2^26 done $(( $(date +%s) - t0 )) s" >> $R
timeout $(( 585 - ($(date +%s) - t0) )) python3 scripts/softmax_variants.py --size 28 --points fwd:bfloat16:1024,fwd:bfloat16:4096,fwd:float32:4096,bwd:bfloat16:4096 \
  --variants "base;22=2;22=2,23=1" --rounds 3 > $OUT/variants_2p28.txt 2>&1
echo "2^28 done $(( $(date +%s) - t0 )) s" >> $R
#!/bin/bash
# session ac call 3: max-first forward reductions (light tier always; warp/chunk kernels with test knob 24) - self-test check with both, then variants against torch.compile
export TORCH_OSS_RESULTS=$OUT TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=14 TORCH_OSS_SOFTMAX_KNOBS=1 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1
R=$OUT/all.txt
t0=$(date +%s)
(SELFTEST_KNOBS=22=2,24=1 timeout 300 ./sbin/sm check > $OUT/selftest_check_light_maxfirst.txt 2>&1; echo "selftest check (22=2,24=1) rc $? $(( $(date +%s) - t0 )) s" >> $OUT/selftest_check_light_maxfirst.txt) &
SPID=$!
rm -rf build torch_oss/_C*.so csrc/cuda/generated
python3 -m pip install -v --no-build-isolation --no-deps -e . > $OUT/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 $OUT/build.log >> $R; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" >> $R
wait $SPID; tail -3 $OUT/selftest_check_light_maxfirst.txt >> $R
SELFTEST_KNOBS=22=3 timeout 60 ./sbin/sm quick > $OUT/selftest_quick_light_k1.txt 2>&1; echo "quick 22=3 rc $? $(( $(date +%s) - t0 )) s" >> $R; tail -2 $OUT/selftest_quick_light_k1.txt >> $R
timeout 230 python3 scripts/softmax_variants.py --points fwd:bfloat16:512,fwd:bfloat16:1024,fwd:bfloat16:2048,fwd:bfloat16:4096,fwd:bfloat16:8192,fwd:bfloat16:16384,fwd:bfloat16:32768,fwd:float16:1024,fwd:float16:4096,fwd:float32:1024,fwd:float32:4096 \
  --variants "base;24=1;22=2;22=3;22=2,24=1" --rounds 5 > $OUT/variants_fwd.txt 2>&1
echo "fwd done $(( $(date +%s) - t0 )) s" >> $R
timeout $(( 585 - ($(date +%s) - t0) )) python3 scripts/softmax_variants.py --points bwd:bfloat16:1024,bwd:bfloat16:4096,bwd:bfloat16:8192,bwd:float32:4096,bwd:float16:32768 \
  --variants "base;22=2;22=3" --rounds 5 > $OUT/variants_bwd.txt 2>&1
echo "bwd done $(( $(date +%s) - t0 )) s" >> $R
#!/bin/bash
# session ac call 4: production build from scratch (light tier on by default), softmax GPU tests, memcheck on the softmax smoke grid, racecheck on the self-test's race cases
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 PYTHONUNBUFFERED=1
R=$OUT/all.txt
t0=$(date +%s)
TORCH_OSS_RESULTS=/tmp/gpu bash scripts/gpu_check.sh build > $OUT/build_stage.txt 2>&1
echo "build stage rc=$? $(( $(date +%s) - t0 )) s" >> $R
tail -3 /tmp/gpu/build.log >> $R
TESTS="tests/test_softmax.py tests/test_extremes.py tests/test_patching.py tests/test_errors.py tests/test_concurrency.py tests/test_models.py" \
  PYTEST_ARGS="-k cuda" TEST_JOBS=4 FILE_TIMEOUT=280 TORCH_OSS_RESULTS=/tmp/gpu timeout 300 bash scripts/gpu_check.sh test >> $R 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s" >> $R
for f in /tmp/gpu/test_*.log; do [ -f "$f" ] && { echo "== $f"; tail -3 "$f"; }; done >> $R 2>&1
timeout 70 compute-sanitizer --tool memcheck python3 scripts/sanitize_smoke.py softmax > $OUT/memcheck_softmax_smoke.txt 2>&1
echo "memcheck rc=$? $(( $(date +%s) - t0 )) s" >> $R
tail -3 $OUT/memcheck_softmax_smoke.txt >> $R
timeout $(( 590 - ($(date +%s) - t0) )) compute-sanitizer --tool racecheck ./sbin/sm race > $OUT/racecheck_selftest_race.txt 2>&1
echo "racecheck rc=$? $(( $(date +%s) - t0 )) s" >> $R
tail -3 $OUT/racecheck_selftest_race.txt >> $R
#!/bin/bash
# session ac call 5 (warm machine after call 4, the production build of c915d99)
python3 -c "import torch_oss" && TORCH_OSS_RESULTS=$OUT timeout 280 python3 bench/softmax.py --rounds 3 > $OUT/bench_softmax_rounds3.log 2>&1
#!/bin/bash
# session ac call 6: after the output helpers were shared (warp and light kernels): build from scratch (head dim 64 only), the CUDA cases of test_softmax, memcheck on the softmax smoke grid, the refactored probe's results checked
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 PYTHONUNBUFFERED=1 TORCH_OSS_HEAD_DIMS=64
R=$OUT/all.txt
t0=$(date +%s)
TORCH_OSS_RESULTS=/tmp/gpu bash scripts/gpu_check.sh build > $OUT/build_stage.txt 2>&1
echo "build stage rc=$? $(( $(date +%s) - t0 )) s" >> $R
(mkdir -p build && nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Xcompiler -fPIC -shared scripts/softmax_probe_kernels.cu -o build/libsoftmax_probe.so > /tmp/probe_build.txt 2>&1) &
timeout 200 python3 -m pytest -q -x tests/test_softmax.py -k cuda -p no:cacheprovider > $OUT/test_softmax_cuda.txt 2>&1
echo "test_softmax rc=$? $(( $(date +%s) - t0 )) s" >> $R; tail -2 $OUT/test_softmax_cuda.txt >> $R
timeout 60 compute-sanitizer --tool memcheck python3 scripts/sanitize_smoke.py softmax > $OUT/memcheck_softmax_smoke.txt 2>&1
echo "memcheck rc=$? $(( $(date +%s) - t0 )) s" >> $R; tail -2 $OUT/memcheck_softmax_smoke.txt >> $R
wait
left=$(( 330 - ($(date +%s) - t0) )); [ $left -gt 15 ] && timeout $left python3 scripts/softmax_probe.py --bwd "" --fwd 55,57 --fwd-cols 4096 --sizes 26 --rounds 1 > $OUT/probe_check.txt 2>&1
echo "probe rc=$? $(( $(date +%s) - t0 )) s" >> $R; grep relerr $OUT/probe_check.txt >> $R
