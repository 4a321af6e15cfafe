# ==== sbin/ao1.sh
#!/bin/bash
# session ao call 1 (H100): the two points where torch.compile led the H100 in every run since v33 (16-bit
# backward 4096 columns, float32 forward 4096), planner variants by the test knobs under do_bench's protocol
# (scripts/softmax_variants.py, interleaved rounds beside torch.compile, 2^26 as bench/softmax.py):
# 20=4096 every row released (a window past the call), 25=-1 no first-wave ramp, 22=512 the light tier at
# 512 x 1, 23=1 the light tier releasing every row, 22=2 the light tier at its own shape, 17=2 no release.
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1 TORCH_OSS_SOFTMAX_KNOBS=1
R=$OUT/all.txt; t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
rm -rf build torch_oss/_C*.so csrc/cuda/generated
python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -40 /tmp/build.log >> $R; exit 1; }
echo "knobs build $(( $(date +%s) - t0 )) s" >> $R
V="base;20=4096;25=-1;22=512;22=512,23=1;22=2,23=1;17=2"
timeout 300 python3 scripts/softmax_variants.py --points bwd:bfloat16:4096,bwd:float16:4096,fwd:float32:4096 --variants "$V" --rounds 9 --size 26 > $OUT/variants_2p26.txt 2>&1
echo "variants 26 rc=$? $(( $(date +%s) - t0 )) s" >> $R
left=$(( 580 - ($(date +%s) - t0) )); [ $left -gt 30 ] && { timeout $left python3 scripts/softmax_variants.py --points bwd:bfloat16:4096,fwd:float32:4096 --variants "$V" --rounds 5 --size 26 > $OUT/variants_2p26_again.txt 2>&1; echo "variants again rc=$? $(( $(date +%s) - t0 )) s" >> $R; }

# ==== sbin/ao2.sh
#!/bin/bash
# session ao call 2 (H200): the backward points where torch.compile led the H200 in session an's bench (16-bit
# 4096 columns by 2.2 points, float32 512 and 4096 by under one), planner variants by the test knobs under
# do_bench's protocol (scripts/softmax_variants.py, interleaved rounds beside torch.compile, 2^26):
# 22=1 light tier off (the chunk / warp plans), 22=64/512/1024 the light tier at that CTA size, 17=2 no release,
# 23=1 the light tier releasing every row.
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1 TORCH_OSS_SOFTMAX_KNOBS=1
R=$OUT/all.txt; t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
rm -rf build torch_oss/_C*.so csrc/cuda/generated
python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -40 /tmp/build.log >> $R; exit 1; }
echo "knobs build $(( $(date +%s) - t0 )) s" >> $R
V="base;22=1;22=512;17=2;22=512,17=2;23=1;22=64;22=1024"
timeout 300 python3 scripts/softmax_variants.py --points bwd:bfloat16:4096,bwd:float16:4096,bwd:float32:512,bwd:float32:4096 --variants "$V" --rounds 9 --size 26 > $OUT/variants_2p26.txt 2>&1
echo "variants 26 rc=$? $(( $(date +%s) - t0 )) s" >> $R
left=$(( 580 - ($(date +%s) - t0) )); [ $left -gt 30 ] && { timeout $left python3 scripts/softmax_variants.py --points bwd:bfloat16:4096,bwd:float32:512 --variants "$V" --rounds 7 --size 27 > $OUT/variants_2p27.txt 2>&1; echo "variants 27 rc=$? $(( $(date +%s) - t0 )) s" >> $R; }

# ==== sbin/ao3.sh
#!/bin/bash
# session ao call 3 (H100): #3's "done when" on main's code (8eda357's kernels): a production build from scratch
# beside racecheck on the self-test's race cases (sbin/sm_an = b023175, the same kernel code), then memcheck on
# the softmax smoke grid and the CUDA cases of test_softmax, test_errors and test_concurrency.
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1 TORCH_OSS_COMMIT="${COMMIT:-8eda357}"
R=$OUT/all.txt; t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
rm -rf build torch_oss/_C*.so csrc/cuda/generated
( python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1; echo $? > /tmp/build.rc ) &
timeout 280 compute-sanitizer --tool racecheck ./sbin/sm_an race > $OUT/racecheck_selftest_race.txt 2>&1
echo "racecheck rc=$? $(( $(date +%s) - t0 )) s: $(tail -2 $OUT/racecheck_selftest_race.txt | tr '\n' ' ')" >> $R
wait
echo "build rc=$(cat /tmp/build.rc) $(( $(date +%s) - t0 )) s" >> $R
grep -E "spill" /tmp/build.log | grep -v " 0 bytes spill" | head -5 >> $R
[ "$(cat /tmp/build.rc)" = 0 ] || { tail -40 /tmp/build.log >> $R; exit 1; }
python3 -c "import torch_oss; print(torch_oss.build_info())" >> $R 2>&1
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 20 python3 scripts/sanitize_smoke.py softmax > $OUT/memcheck_softmax.txt 2>&1
echo "memcheck rc=$? $(( $(date +%s) - t0 )) s: $(tail -2 $OUT/memcheck_softmax.txt | tr '\n' ' ')" >> $R
for f in test_softmax test_errors test_concurrency; do
  left=$(( 590 - ($(date +%s) - t0) )); [ $left -gt 15 ] || break
  timeout $left python3 -m pytest tests/$f.py -q -k cuda -p no:cacheprovider > $OUT/$f.txt 2>&1
  echo "$f [cuda] rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 $OUT/$f.txt)" >> $R
  grep -E "^(FAILED|ERROR)" $OUT/$f.txt | head -5 >> $R
done

# ==== sbin/ao4.sh
#!/bin/bash
# session ao call 4 (H100, warm after call 3 with its production build): the other softmax test files' CUDA cases,
# then bench/softmax.py --rounds 3.
export PYTHONUNBUFFERED=1
R=$OUT/all.txt; t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
python3 -c "import torch_oss; print(torch_oss.build_info())" >> $R 2>&1
mkdir -p $OUT/run1
TORCH_OSS_RESULTS=$OUT/run1 timeout 240 python3 bench/softmax.py --rounds 3 > $OUT/bench_run1.log 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s" >> $R
for t in "test_patching.py -k cuda" "test_models.py -k cuda" "test_large.py -k softmax and cuda" "test_extremes.py -k softmax and cuda" "test_determinism.py -k softmax and cuda"; do
  left=$(( 590 - ($(date +%s) - t0) )); [ $left -gt 15 ] || break
  f=${t%% *}; k=${t#* -k }
  timeout $left python3 -m pytest tests/$f -q -k "$k" -p no:cacheprovider > $OUT/${f%.py}.txt 2>&1
  echo "$f [$k] rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 $OUT/${f%.py}.txt)" >> $R
  grep -E "^(FAILED|ERROR)" $OUT/${f%.py}.txt | head -5 >> $R
done

# ==== sbin/ao5.sh
#!/bin/bash
# session ao call 5 (H100): the columns kernel's backward from a 16-bit y to a float32 dx at 512 threads compiled
# for one CTA per SM (no spill). The self-test's column suites (new `columns` mode, sbin/sm_ao) with every case
# forced onto 512-thread CTAs (knob 8) and with the planner's sizes, memcheck and racecheck with 8=512; beside
# them a production build from scratch, then the CUDA cases of test_softmax and memcheck on the softmax smoke grid.
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1 TORCH_OSS_COMMIT="${COMMIT:-wip}"
R=$OUT/all.txt; t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
rm -rf build torch_oss/_C*.so csrc/cuda/generated
( python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1; echo $? > /tmp/build.rc ) &
SELFTEST_KNOBS=8=512 timeout 150 ./sbin/sm_ao columns > $OUT/columns_512.txt 2>&1
echo "columns 8=512 rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 $OUT/columns_512.txt)" >> $R; grep -m8 "^FAIL" $OUT/columns_512.txt >> $R
timeout 120 ./sbin/sm_ao columns > $OUT/columns_planner.txt 2>&1
echo "columns rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 $OUT/columns_planner.txt)" >> $R; grep -m8 "^FAIL" $OUT/columns_planner.txt >> $R
wait
echo "build rc=$(cat /tmp/build.rc) $(( $(date +%s) - t0 )) s" >> $R
grep -E "spill" /tmp/build.log | grep -v " 0 bytes spill" | head -5 >> $R
[ "$(cat /tmp/build.rc)" = 0 ] || { tail -40 /tmp/build.log >> $R; exit 1; }
python3 -c "import torch_oss; print(torch_oss.build_info())" >> $R 2>&1
timeout 150 python3 -m pytest tests/test_softmax.py -q -k cuda -p no:cacheprovider > $OUT/test_softmax.txt 2>&1
echo "test_softmax [cuda] rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 $OUT/test_softmax.txt)" >> $R
grep -E "^(FAILED|ERROR)" $OUT/test_softmax.txt | head -5 >> $R
left=$(( 560 - ($(date +%s) - t0) )); [ $left -gt 20 ] && { SELFTEST_KNOBS=8=512 timeout $left compute-sanitizer --tool racecheck ./sbin/sm_ao race > $OUT/racecheck_race_512.txt 2>&1; echo "racecheck race 8=512 rc=$? $(( $(date +%s) - t0 )) s: $(tail -2 $OUT/racecheck_race_512.txt | tr '\n' ' ')" >> $R; }
left=$(( 590 - ($(date +%s) - t0) )); [ $left -gt 20 ] && { SELFTEST_KNOBS=8=512 timeout $left compute-sanitizer --tool memcheck --error-exitcode 99 ./sbin/sm_ao columns > $OUT/memcheck_columns_512.txt 2>&1; echo "memcheck columns 8=512 rc=$? $(( $(date +%s) - t0 )) s: $(tail -2 $OUT/memcheck_columns_512.txt | tr '\n' ' ')" >> $R; }

# ==== sbin/ao6.sh
#!/bin/bash
# session ao call 6 (H100): b315313 (the session's code) built from scratch; bench/softmax.py --rounds 3 (the second
# H100 run of the session: call 4 ran 8eda357, whose kernels in the benchmark are the same); the CUDA cases of the
# other softmax test files.
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1 TORCH_OSS_COMMIT="${COMMIT:-b315313}"
R=$OUT/all.txt; t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
rm -rf build torch_oss/_C*.so csrc/cuda/generated
python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -40 /tmp/build.log >> $R; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" >> $R
python3 -c "import torch_oss; print(torch_oss.build_info())" >> $R 2>&1
mkdir -p $OUT/run2
TORCH_OSS_RESULTS=$OUT/run2 timeout 240 python3 bench/softmax.py --rounds 3 > $OUT/bench_run2.log 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s" >> $R
for t in "test_errors.py -k cuda" "test_concurrency.py -k cuda" "test_patching.py -k cuda" "test_models.py -k cuda" "test_large.py -k softmax and cuda" "test_extremes.py -k softmax and cuda" "test_determinism.py -k softmax and cuda"; do
  left=$(( 590 - ($(date +%s) - t0) )); [ $left -gt 15 ] || break
  f=${t%% *}; k=${t#* -k }
  timeout $left python3 -m pytest tests/$f -q -k "$k" -p no:cacheprovider > $OUT/${f%.py}.txt 2>&1
  echo "$f [$k] rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 $OUT/${f%.py}.txt)" >> $R
  grep -E "^(FAILED|ERROR)" $OUT/${f%.py}.txt | head -5 >> $R
done

