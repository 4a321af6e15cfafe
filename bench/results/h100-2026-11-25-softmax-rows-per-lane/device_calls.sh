### call 1: sbin/ai1.sh
#!/bin/bash
# session ai call 1: the 128-column forward's layouts (scripts/softmax_probe_kernels.cu 60-69) against torch_oss, torch.compile and a copy, by the kernels' own time (CUPTI); the backward 4096 probes 0/6/15 - production build from scratch (head dim 64) of defb838 + the probe changes
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1 TORCH_OSS_COMMIT="defb838+fwd128-probes"
R=$OUT/all.txt
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
rm -rf build torch_oss/_C*.so csrc/cuda/generated
python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 /tmp/build.log >> $R; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" >> $R
timeout $(( 580 - ($(date +%s) - t0) )) python3 scripts/softmax_probe.py --lib sbin/libsoftmax_probe.so --bwd 0,6,15 --fwd 60,61,62,63,64,65,66,67,68,69 --fwd-cols 128 --sizes 26,28 --rounds 2 --calls 100 > $OUT/probe_fwd128.txt 2>&1
echo "probe rc=$? $(( $(date +%s) - t0 )) s" >> $R

### call 2: sbin/ai2.sh
#!/bin/bash
# session ai call 2: rows per lane in the warp tier (aligned forward rows <= 16 slots): the self-test check (locally built sbin/sm) while a knob build compiles, then variants base / 26=1 (the old layout) against torch.compile by kernel time, 2^26 and 2^28
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1 TORCH_OSS_COMMIT="defb838+rows-per-lane"
R=$OUT/all.txt
t0=$(date +%s)
( ./sbin/sm check > $OUT/sm_check.txt 2>&1; echo "sm check rc=$? $(( $(date +%s) - t0 )) s" >> $R ) &
rm -rf build torch_oss/_C*.so csrc/cuda/generated
TORCH_OSS_SOFTMAX_KNOBS=1 python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 /tmp/build.log >> $R; wait; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" >> $R
wait
tail -3 $OUT/sm_check.txt >> $R
grep -E "^FAIL" $OUT/sm_check.txt | head -20 >> $R
P=fwd:bfloat16:128,fwd:float16:128,fwd:float32:64,fwd:bfloat16:64,fwd:bfloat16:96,fwd:float16:32,fwd:float32:128
timeout 240 python3 scripts/softmax_variants.py --points $P --variants "base;26=1" --rounds 5 --kernel-time --kernel-calls 100 > $OUT/variants_rl_2p26.txt 2>&1
echo "variants 2^26 rc=$? $(( $(date +%s) - t0 )) s" >> $R
timeout $(( 585 - ($(date +%s) - t0) )) python3 scripts/softmax_variants.py --points fwd:bfloat16:128,fwd:float16:128,fwd:float32:64 --variants "base;26=1" --rounds 3 --size 28 --kernel-time --kernel-calls 40 > $OUT/variants_rl_2p28.txt 2>&1
echo "variants 2^28 rc=$? $(( $(date +%s) - t0 )) s" >> $R

### call 3: sbin/ai3.sh
#!/bin/bash
# session ai call 3: rows per lane with the rows' reductions interleaved (RL=4 spills 24-68 bytes, RL=2 none): sm check + knob build, then variants base (16 lanes) / 26=8 / 26=1 (old layout) against torch.compile by kernel time
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1 TORCH_OSS_COMMIT="defb838+rows-per-lane-interleaved"
R=$OUT/all.txt
t0=$(date +%s)
( ./sbin/sm check > $OUT/sm_check.txt 2>&1; echo "sm check rc=$? $(( $(date +%s) - t0 )) s" >> $R ) &
rm -rf build torch_oss/_C*.so csrc/cuda/generated
TORCH_OSS_SOFTMAX_KNOBS=1 python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 /tmp/build.log >> $R; wait; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" >> $R
wait
tail -1 $OUT/sm_check.txt >> $R
grep -E "^FAIL" $OUT/sm_check.txt | head -20 >> $R
P=fwd:bfloat16:128,fwd:float16:128,fwd:float32:64,fwd:bfloat16:64,fwd:float16:32,fwd:bfloat16:96,fwd:bfloat16:24,fwd:bfloat16:48
timeout 260 python3 scripts/softmax_variants.py --points $P --variants "base;26=8;26=1" --rounds 5 --kernel-time --kernel-calls 100 > $OUT/variants_rl2_2p26.txt 2>&1
echo "variants 2^26 rc=$? $(( $(date +%s) - t0 )) s" >> $R
timeout $(( 585 - ($(date +%s) - t0) )) python3 scripts/softmax_variants.py --points fwd:bfloat16:128,fwd:float16:128 --variants "base;26=8;26=1" --rounds 3 --size 28 --kernel-time --kernel-calls 40 > $OUT/variants_rl2_2p28.txt 2>&1
echo "variants 2^28 rc=$? $(( $(date +%s) - t0 )) s" >> $R

### call 4: sbin/ai4.sh
#!/bin/bash
# session ai call 4: production build from scratch of ba6adf5 (rows per lane) (all head dims), sm check, bench/softmax.py --rounds 3 (run 1), the CUDA cases of the softmax test files, memcheck on the softmax smoke grid, racecheck on the self-test's race suite
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 PYTHONUNBUFFERED=1 TORCH_OSS_COMMIT="ba6adf5"
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

### call 5: sbin/ai5.sh
#!/bin/bash
# session ai call 5: production build from scratch (head dim 64) of ba6adf5, bench/softmax.py --rounds 3 (run 2), kernel durations (CUPTI) of torch_oss and torch.compile at the narrow points
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1 TORCH_OSS_COMMIT="ba6adf5"
R=$OUT/all.txt
t0=$(date +%s)
rm -rf build torch_oss/_C*.so csrc/cuda/generated
python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 /tmp/build.log >> $R; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" >> $R
mkdir -p $OUT/run2
TORCH_OSS_RESULTS=$OUT/run2 timeout 200 python3 bench/softmax.py --rounds 3 > $OUT/bench_run2.log 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s" >> $R
rm -f $OUT/run2/*.png
timeout $(( 585 - ($(date +%s) - t0) )) python3 scripts/softmax_kernel_durations.py --points fwd:bfloat16:128,fwd:float16:128,fwd:bfloat16:64,fwd:float16:32,bwd:bfloat16:4096,bwd:float16:4096,fwd:float32:4096 --calls 100 --rounds 2 > $OUT/kernel_durations_ba6adf5_2p26.txt 2>&1
echo "durations rc=$? $(( $(date +%s) - t0 )) s" >> $R

### call 6: sbin/ai6.sh
#!/bin/bash
# session ai call 6: the 16-bit backward at 4096 columns (512 slots), chunk kernel (base) against the light one-row-per-CTA tier at 512 x 1 (22=512), 256 x 2 (22=256) and 128 x 4 (22=128), by kernel time - knob build of f35a77d
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1 TORCH_OSS_COMMIT="f35a77d"
R=$OUT/all.txt
t0=$(date +%s)
rm -rf build torch_oss/_C*.so csrc/cuda/generated
TORCH_OSS_SOFTMAX_KNOBS=1 python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 /tmp/build.log >> $R; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" >> $R
timeout 200 python3 scripts/softmax_variants.py --points bwd:bfloat16:4096,bwd:float16:4096 --variants "base;22=512;22=256;22=128" --rounds 5 --kernel-time --kernel-calls 100 > $OUT/variants_bwd4096_2p26.txt 2>&1
echo "variants 2^26 rc=$? $(( $(date +%s) - t0 )) s" >> $R
timeout $(( 400 - ($(date +%s) - t0) )) python3 scripts/softmax_variants.py --points bwd:bfloat16:4096,bwd:float16:4096 --variants "base;22=512;22=256" --rounds 3 --size 28 --kernel-time --kernel-calls 40 > $OUT/variants_bwd4096_2p28.txt 2>&1
echo "variants 2^28 rc=$? $(( $(date +%s) - t0 )) s" >> $R

### call 7: sbin/ai7.sh
#!/bin/bash
# session ai call 7: the 16-bit backward at 4096 columns, the chunk kernel's shapes: base (256 x 2) against 512 x 1 (11=1) and 128 x 4 (11=4), and the first wave's ramp off (25=-1), by kernel time - knob build of 486643e
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1 TORCH_OSS_COMMIT="486643e"
R=$OUT/all.txt
t0=$(date +%s)
rm -rf build torch_oss/_C*.so csrc/cuda/generated
TORCH_OSS_SOFTMAX_KNOBS=1 python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 /tmp/build.log >> $R; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" >> $R
timeout 150 python3 scripts/softmax_variants.py --points bwd:bfloat16:4096,bwd:float16:4096 --variants "base;11=1;11=4;25=-1" --rounds 5 --kernel-time --kernel-calls 100 > $OUT/variants_bwd4096_shapes_2p26.txt 2>&1
echo "variants 2^26 rc=$? $(( $(date +%s) - t0 )) s" >> $R
timeout $(( 330 - ($(date +%s) - t0) )) python3 scripts/softmax_variants.py --points bwd:bfloat16:4096 --variants "base;11=1;11=4" --rounds 3 --size 28 --kernel-time --kernel-calls 40 > $OUT/variants_bwd4096_shapes_2p28.txt 2>&1
echo "variants 2^28 rc=$? $(( $(date +%s) - t0 )) s" >> $R

