# ---- sbin/ah1.sh
#!/bin/bash
# session ah call 1: the first wave's ramp for the warp kernel's CTAs (test knob 26 = step in %), on 3f5a836 + the knob - knob build (head dim 64), sm check with 26=100 during the build, variants at 2^26
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1 TORCH_OSS_COMMIT="3f5a836+warp-ramp-knob"
R=$OUT/all.txt
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
(SELFTEST_KNOBS="26=100" timeout 200 ./sbin/sm check > $OUT/selftest_check_26_100.txt 2>&1; echo "selftest check rc $? $(( $(date +%s) - t0 )) s" >> $OUT/selftest_check_26_100.txt) &
SPID=$!
rm -rf build torch_oss/_C*.so csrc/cuda/generated
TORCH_OSS_SOFTMAX_KNOBS=1 python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 /tmp/build.log >> $R; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" >> $R
wait $SPID; tail -2 $OUT/selftest_check_26_100.txt >> $R
timeout 260 python3 scripts/softmax_variants.py --points fwd:bfloat16:128,fwd:float16:128,fwd:float16:512,fwd:float32:512,fwd:bfloat16:1024,bwd:bfloat16:128 \
  --variants "base;26=50;26=100;26=200" --rounds 5 > $OUT/variants_warp_ramp_2p26.txt 2>&1
echo "variants warp rc=$? $(( $(date +%s) - t0 )) s" >> $R
timeout $(( 590 - ($(date +%s) - t0) )) python3 scripts/softmax_variants.py --points fwd:float32:4096 \
  --variants "base;25=-1;25=20;25=60;11=4;22=512" --rounds 5 > $OUT/variants_f32_4096_2p26.txt 2>&1
echo "variants f32 4096 rc=$? $(( $(date +%s) - t0 )) s" >> $R
# ---- sbin/ah2.sh
#!/bin/bash
# session ah call 2: warp-tier shapes at the 16-bit forward 128 columns (knobs 5, 15), and the narrow forward points against torch.compile at 2^28 - knob build (head dim 64) of 3f5a836
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1 TORCH_OSS_COMMIT="3f5a836"
R=$OUT/all.txt
t0=$(date +%s)
rm -rf build torch_oss/_C*.so csrc/cuda/generated
TORCH_OSS_SOFTMAX_KNOBS=1 python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 /tmp/build.log >> $R; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" >> $R
timeout 200 python3 scripts/softmax_variants.py --points fwd:bfloat16:128,fwd:float16:128 \
  --variants "base;5=8;15=64;15=32;5=8,15=64" --rounds 7 > $OUT/variants_warp_shapes_2p26.txt 2>&1
echo "variants shapes rc=$? $(( $(date +%s) - t0 )) s" >> $R
timeout 200 python3 scripts/softmax_variants.py --points fwd:bfloat16:128,fwd:float16:128,fwd:float16:512,fwd:float32:512,fwd:float32:4096,fwd:bfloat16:1024,fwd:float32:128 \
  --variants "base" --rounds 5 > $OUT/variants_narrow_2p26.txt 2>&1
echo "variants narrow 2^26 rc=$? $(( $(date +%s) - t0 )) s" >> $R
timeout $(( 590 - ($(date +%s) - t0) )) python3 scripts/softmax_variants.py --points fwd:bfloat16:128,fwd:float16:128,fwd:float16:512,fwd:float32:512,fwd:float32:4096,fwd:bfloat16:1024 --size 28 \
  --variants "base;5=8" --rounds 3 > $OUT/variants_narrow_2p28.txt 2>&1
echo "variants narrow 2^28 rc=$? $(( $(date +%s) - t0 )) s" >> $R
# ---- sbin/ah3.sh
#!/bin/bash
# session ah call 3: float32 forward 4096 columns - CTA shapes (knobs 11, 22) and the ramp (25), at 2^26 and 2^28 - knob build (head dim 64) of 3f5a836
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1 TORCH_OSS_COMMIT="3f5a836"
R=$OUT/all.txt
t0=$(date +%s)
rm -rf build torch_oss/_C*.so csrc/cuda/generated
TORCH_OSS_SOFTMAX_KNOBS=1 python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 /tmp/build.log >> $R; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" >> $R
V="base;25=-1;25=100;11=4;11=4,25=100;11=4,25=-1;11=2;22=512"
timeout 200 python3 scripts/softmax_variants.py --points fwd:float32:4096 --variants "$V" --rounds 5 > $OUT/variants_f32_4096_2p26.txt 2>&1
echo "variants 2^26 rc=$? $(( $(date +%s) - t0 )) s" >> $R
timeout $(( 590 - ($(date +%s) - t0) )) python3 scripts/softmax_variants.py --points fwd:float32:4096 --size 28 --variants "$V" --rounds 3 > $OUT/variants_f32_4096_2p28.txt 2>&1
echo "variants 2^28 rc=$? $(( $(date +%s) - t0 )) s" >> $R
# ---- sbin/ah4.sh
#!/bin/bash
# session ah call 4: production build from scratch of fe1b187 (all head dims), sm check, bench/softmax.py --rounds 3 (run 1), the CUDA cases of the softmax test files, memcheck on the softmax smoke grid, racecheck on the self-test's race suite
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 PYTHONUNBUFFERED=1 TORCH_OSS_COMMIT="fe1b187"
R=$OUT/all.txt
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
(timeout 200 ./sbin/sm check > $OUT/selftest_check.txt 2>&1; echo "selftest check rc $? $(( $(date +%s) - t0 )) s" >> $OUT/selftest_check.txt) &
SPID=$!
TORCH_OSS_RESULTS=/tmp/gpu bash scripts/gpu_check.sh build > $OUT/build_stage.txt 2>&1
echo "build stage rc=$? $(( $(date +%s) - t0 )) s" >> $R
wait $SPID; tail -2 $OUT/selftest_check.txt >> $R
mkdir -p $OUT/run1
TORCH_OSS_RESULTS=$OUT/run1 timeout 200 python3 bench/softmax.py --rounds 3 > $OUT/bench_run1.log 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s" >> $R
TESTS="tests/test_softmax.py tests/test_extremes.py tests/test_patching.py tests/test_errors.py tests/test_concurrency.py tests/test_models.py" \
  PYTEST_ARGS="-k cuda" TEST_JOBS=4 FILE_TIMEOUT=220 TORCH_OSS_RESULTS=/tmp/gpu timeout 230 bash scripts/gpu_check.sh test > $OUT/gpu_tests.txt 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s" >> $R
grep -E "^tests/|FAILED|ERROR" $OUT/gpu_tests.txt | head -30 >> $R
timeout 40 compute-sanitizer --tool memcheck python3 scripts/sanitize_smoke.py softmax > $OUT/memcheck_softmax_smoke.txt 2>&1
echo "memcheck rc=$? $(( $(date +%s) - t0 )) s" >> $R
tail -2 $OUT/memcheck_softmax_smoke.txt >> $R
timeout $(( 595 - ($(date +%s) - t0) )) compute-sanitizer --tool racecheck ./sbin/sm race > $OUT/racecheck_selftest_race.txt 2>&1
echo "racecheck rc=$? $(( $(date +%s) - t0 )) s" >> $R
tail -3 $OUT/racecheck_selftest_race.txt >> $R
# ---- sbin/ah5.sh
#!/bin/bash
# session ah call 5: kernel durations by CUPTI (torch.profiler) against CUDA-event times, torch_oss and torch.compile, at the narrow points where the events disagree - production build from scratch (head dim 64) of fe1b187 + scripts/softmax_kernel_durations.py
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1 TORCH_OSS_COMMIT="fe1b187+durations-script"
R=$OUT/all.txt
t0=$(date +%s)
rm -rf build torch_oss/_C*.so csrc/cuda/generated
python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 /tmp/build.log >> $R; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" >> $R
timeout 200 python3 scripts/softmax_kernel_durations.py --points fwd:bfloat16:128,fwd:float16:128,fwd:float32:128,fwd:float16:512,fwd:float32:4096,bwd:bfloat16:4096,bwd:float16:4096 --calls 200 --rounds 3 > $OUT/kernel_durations_2p26.txt 2>&1
echo "durations 2^26 rc=$? $(( $(date +%s) - t0 )) s" >> $R
timeout $(( 590 - ($(date +%s) - t0) )) python3 scripts/softmax_kernel_durations.py --points fwd:bfloat16:128,fwd:float16:128,fwd:float32:4096 --size 28 --calls 60 --rounds 3 > $OUT/kernel_durations_2p28.txt 2>&1
echo "durations 2^28 rc=$? $(( $(date +%s) - t0 )) s" >> $R
# ---- call 6 (right after call 5, on its build, the machine still warm): bench run 2
export TORCH_OSS_COMMIT=fe1b187 PYTHONUNBUFFERED=1; python3 -c "import torch_oss,torch; print(torch_oss.build_info())" > $OUT/buildinfo.txt 2>&1; mkdir -p $OUT/run2; TORCH_OSS_RESULTS=$OUT/run2 timeout 250 python3 bench/softmax.py --rounds 3 > $OUT/bench_run2.log 2>&1; echo rc=$?; tail -5 $OUT/bench_run2.log
# ---- sbin/ah6.sh
#!/bin/bash
# session ah call 8: the chunk kernel's first-wave ramp (knob 25) at the grid's one-CTA chunk rows (4096 columns), events and kernel times (--kernel-time) - knob build (head dim 64) of fe1b187 + the kernel-time option
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1 TORCH_OSS_COMMIT="fe1b187+kernel-time"
R=$OUT/all.txt
t0=$(date +%s)
rm -rf build torch_oss/_C*.so csrc/cuda/generated
TORCH_OSS_SOFTMAX_KNOBS=1 python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 /tmp/build.log >> $R; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" >> $R
timeout 250 python3 scripts/softmax_variants.py --points bwd:bfloat16:4096,bwd:float16:4096,bwd:float32:4096,fwd:bfloat16:4096,fwd:float16:4096,fwd:float32:32768 \
  --variants "base;25=-1;25=40" --rounds 5 --kernel-time > $OUT/variants_chunk_ramp_2p26.txt 2>&1
echo "variants 2^26 rc=$? $(( $(date +%s) - t0 )) s" >> $R
timeout $(( 560 - ($(date +%s) - t0) )) python3 scripts/softmax_variants.py --points bwd:bfloat16:4096,bwd:float16:4096 --size 28 \
  --variants "base;25=-1" --rounds 3 --kernel-time --kernel-calls 40 > $OUT/variants_chunk_ramp_2p28.txt 2>&1
echo "variants 2^28 rc=$? $(( $(date +%s) - t0 )) s" >> $R
# ---- sbin/ah7.sh
#!/bin/bash
# session ah call 9: what the fixed per-call cost at the 16-bit narrow points is - the L2 policy (knob 17), the release window (20, 21) and a plain copy of the same bytes (--same-traffic), by kernel time - knob build (head dim 64) of fe1b187 + the kernel-time option
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1 TORCH_OSS_COMMIT="fe1b187+kernel-time"
R=$OUT/all.txt
t0=$(date +%s)
rm -rf build torch_oss/_C*.so csrc/cuda/generated
TORCH_OSS_SOFTMAX_KNOBS=1 python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 /tmp/build.log >> $R; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" >> $R
timeout $(( 560 - ($(date +%s) - t0) )) python3 scripts/softmax_variants.py --points fwd:bfloat16:128,fwd:float16:128,bwd:bfloat16:4096 \
  --variants "base;17=1;17=2;20=1;20=1,21=1" --rounds 5 --kernel-time --same-traffic > $OUT/variants_policy_kernel_time_2p26.txt 2>&1
echo "variants 2^26 rc=$? $(( $(date +%s) - t0 )) s" >> $R
# ---- sbin/ah8.sh
#!/bin/bash
# session ah call 10: scripts/softmax_kernel_durations.py in its committed form (helpers in bench/common.py) - production build from scratch (head dim 64) of 9d44da1
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1 TORCH_OSS_COMMIT="9d44da1"
R=$OUT/all.txt
t0=$(date +%s)
rm -rf build torch_oss/_C*.so csrc/cuda/generated
python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 /tmp/build.log >> $R; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" >> $R
timeout 120 python3 scripts/softmax_kernel_durations.py --points fwd:bfloat16:128,bwd:bfloat16:4096 --calls 100 --rounds 2 > $OUT/kernel_durations_9d44da1_2p26.txt 2>&1
echo "durations rc=$? $(( $(date +%s) - t0 )) s" >> $R
