# session am: the scripts as sent to the device (sbin/ is not tracked)
# ---- call 1 (H100): sbin/am1.sh
#!/bin/bash
# session am call 1 (H100): fixed-mode A/B of sbin/sm_base (852be5e), sbin/sm (3b057f6: the spill-free light
# kernel) and sbin/sm_new (6bb0efa: the spill-free warp forward at 2-4 rows per lane), interleaved twice at
# 2^26 and 2^27; then a production build from scratch beside the self-test's full check of sm_new; the CUDA
# cases of the softmax test files; memcheck on the softmax smoke grid; racecheck on race mode.
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1 TORCH_OSS_COMMIT="${COMMIT:-6bb0efa}"
R=$OUT/all.txt
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
PTS=${PTS:-"fwd:bf16:128 fwd:f16:128 fwd:bf16:64 fwd:bf16:32 fwd:f32:32 fwd:f32:64 fwd:bf16:1024 fwd:bf16:4096 fwd:bf16:8192 fwd:f32:4096 bwd:bf16:8192 bwd:bf16:3000 bwd:bf16:4096 bwd:bf16:4096:22=2 bwd:bf16:4096:22=512 bwd:bf16:128 bwd:f32:4096"}
for pass in 1 2; do
  for b in base mid new; do
    bin=./sbin/sm_$b; [ $b = mid ] && bin=./sbin/sm
    FIXED_SIZES=26,27 timeout 60 $bin fixed $PTS > $OUT/fixed_${b}_$pass.txt 2>&1
  done
done
echo "fixed done $(( $(date +%s) - t0 )) s" >> $R
python3 sbin/summ.py $OUT > $OUT/summary.txt 2>&1
for f in $OUT/fixed_*_?.txt; do echo "== $(basename $f)"; cat $f; done > $OUT/fixed_raw.txt; rm -f $OUT/fixed_*_?.txt
rm -rf build torch_oss/_C*.so csrc/cuda/generated
( python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1; echo $? > /tmp/build.rc ) &
timeout 330 ./sbin/sm_new check > /tmp/check.txt 2>&1
echo "check rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 /tmp/check.txt)" >> $R
grep -m8 "^FAIL" /tmp/check.txt >> $R
wait
echo "build rc=$(cat /tmp/build.rc) $(( $(date +%s) - t0 )) s" >> $R
[ "$(cat /tmp/build.rc)" = 0 ] || { tail -40 /tmp/build.log >> $R; exit 1; }
python3 -c "import torch_oss; print(torch_oss.build_info())" >> $R 2>&1
for tk in "tests/test_softmax.py:cuda" "tests/test_errors.py:cuda" "tests/test_patching.py:cuda" "tests/test_concurrency.py:cuda" "tests/test_large.py:softmax" "tests/test_extremes.py:cuda and softmax" "tests/test_determinism.py:cuda and softmax" "tests/test_models.py:cuda"; do
  t=${tk%%:*}; k=${tk#*:}
  left=$(( 560 - ($(date +%s) - t0) )); [ $left -gt 10 ] || { echo "no time for $tk" >> $R; continue; }
  timeout $left python3 -m pytest $t -q -k "$k" -p no:cacheprovider > /tmp/t.txt 2>&1
  echo "$t [$k] rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 /tmp/t.txt)" >> $R
  grep -E "^(FAILED|ERROR)" /tmp/t.txt | head -5 >> $R
done
# ---- call 2 (H100, warm after call 1): the command
export PYTHONUNBUFFERED=1 TORCH_OSS_COMMIT=6bb0efa; t0=$(date +%s); R=$OUT/all.txt; ls torch_oss/_C*.so >> $R 2>&1 || { TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 python3 -m pip install --no-build-isolation --no-deps -e . > /tmp/b.log 2>&1; echo "rebuilt $?" >> $R; }; mkdir -p $OUT/run1; TORCH_OSS_RESULTS=$OUT/run1 timeout 220 python3 bench/softmax.py --rounds 3 > $OUT/bench_run1.log 2>&1; echo "bench rc=$? $(( $(date +%s) - t0 )) s" >> $R; timeout 150 compute-sanitizer --tool memcheck python3 scripts/sanitize_smoke.py softmax > /tmp/mc.txt 2>&1; echo "memcheck rc=$? ..." >> $R; timeout 100 compute-sanitizer --tool racecheck ./sbin/sm_new race > /tmp/rc.txt 2>&1; echo "racecheck rc=$? ..." >> $R
# ---- call 3 (H200): sbin/am3.sh
#!/bin/bash
# session am call 3 (H200): fixed-mode A/B of sbin/sm_base (852be5e), sbin/sm (3b057f6) and sbin/sm_new
# (6bb0efa), interleaved twice at 2^26 and 2^27, with the narrow backward's shapes (knobs); a production
# build of 6bb0efa from scratch; bench/softmax.py --rounds 3; the CUDA cases of test_softmax.
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1 TORCH_OSS_COMMIT="${COMMIT:-6bb0efa}"
R=$OUT/all.txt
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
rm -rf build torch_oss/_C*.so csrc/cuda/generated
PTS=${PTS:-"fwd:bf16:128 fwd:bf16:64 fwd:bf16:32 fwd:f32:32 fwd:bf16:1024 fwd:bf16:4096 bwd:bf16:4096 bwd:bf16:4096:22=512 bwd:bf16:4096:24=1 bwd:bf16:128 bwd:bf16:128:15=64 bwd:bf16:128:5=4 bwd:f32:128 bwd:bf16:512 bwd:f32:4096"}
for pass in 1 2; do
  for b in base mid new; do
    bin=./sbin/sm_$b; [ $b = mid ] && bin=./sbin/sm
    FIXED_SIZES=26,27 timeout 60 $bin fixed $PTS > $OUT/fixed_${b}_$pass.txt 2>&1
  done
done
echo "fixed done $(( $(date +%s) - t0 )) s" >> $R
python3 sbin/summ.py $OUT > $OUT/summary.txt 2>&1
for f in $OUT/fixed_*_?.txt; do echo "== $(basename $f)"; cat $f; done > $OUT/fixed_raw.txt; rm -f $OUT/fixed_*_?.txt
python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1
echo "build rc=$? $(( $(date +%s) - t0 )) s" >> $R
mkdir -p $OUT/run1
TORCH_OSS_RESULTS=$OUT/run1 timeout 220 python3 bench/softmax.py --rounds 3 > $OUT/bench_run1.log 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s" >> $R
left=$(( 560 - ($(date +%s) - t0) ))
timeout $left python3 -m pytest tests/test_softmax.py -q -k cuda -p no:cacheprovider > /tmp/t.txt 2>&1
echo "test_softmax [cuda] rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 /tmp/t.txt)" >> $R
grep -E "^(FAILED|ERROR)" /tmp/t.txt | head -5 >> $R
# ---- call 4 (H200): sbin/am4.sh
#!/bin/bash
# session am call 4 (H200): Inductor's generated softmax backward at 128 and 4096 columns (bfloat16), and
# Nsight Compute of one launch each: ours (sbin/sm_new fixed) against torch.compile's, at 2^26 elements.
R=$OUT/all.txt; t0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv >> $R
SEC="--section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats --section InstructionStats --section MemoryWorkloadAnalysis"
for c in 128 4096; do
  TORCH_LOGS=output_code timeout 120 python3 sbin/peer_bwd.py $c bf16 > /tmp/code_$c.txt 2>&1
  grep -n -E "triton_heuristics|@triton.jit|def triton|num_warps|XBLOCK|R0_BLOCK|RBLOCK|tl.load|tl.store|tl.sum|max err" /tmp/code_$c.txt | head -60 > $OUT/inductor_bwd_bf16_$c.txt
  timeout 120 ncu --clock-control none --profile-from-start off --target-processes all $SEC python3 sbin/peer_bwd.py $c bf16 > $OUT/ncu_compile_bwd_bf16_$c.txt 2>&1
  FIXED_SIZES=26 timeout 60 ncu --clock-control none -k regex:"softmax_row|softmax_rows_in_warp" --launch-skip 3 --launch-count 1 $SEC ./sbin/sm_new fixed bwd:bf16:$c > $OUT/ncu_ours_bwd_bf16_$c.txt 2>&1
  echo "$c done $(( $(date +%s) - t0 )) s" >> $R
done
# ---- sbin/peer_bwd.py (used by call 4)
# """torch.compile's softmax backward at one point (2^26 elements): prints Inductor's generated code
# (TORCH_LOGS=output_code does that), checks the result, warms up, then one launch between
# cudaProfilerStart/Stop for ncu --profile-from-start off."""
# import sys, torch
# cols = int(sys.argv[1]); dt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[sys.argv[2]]
# rows = 2**26 // cols
# torch._dynamo.config.recompile_limit = 64
# x = torch.randn(rows, cols, device="cuda", dtype=dt)
# y = torch.softmax(x.float(), -1).to(dt); dy = torch.randn_like(y)
# f = torch.compile(lambda dy, y: torch._softmax_backward_data(dy, y, -1, y.dtype), dynamic=False)
# out = f(dy, y)
# ref = torch._softmax_backward_data(dy.double(), y.double(), -1, torch.float64)
# print("max err", (out.double() - ref).abs().max().item())
# for _ in range(3): f(dy, y)
# torch.cuda.synchronize()
# torch.cuda.profiler.start(); f(dy, y); torch.cuda.synchronize(); torch.cuda.profiler.stop()
# ---- call 5 (H100): the command
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1 TORCH_OSS_COMMIT=6bb0efa; R=$OUT/all.txt; t0=$(date +%s); nvidia-smi --query-gpu=name --format=csv >> $R; rm -rf build torch_oss/_C*.so csrc/cuda/generated; ( python3 -m pip install --no-build-isolation --no-deps -e . > /tmp/b.log 2>&1; echo $? > /tmp/b.rc ) & SELFTEST_KNOBS="22=2" timeout 120 ./sbin/sm_new quick > /tmp/q.txt 2>&1; echo "quick 22=2 rc=$? ..." >> $R; wait; echo "build rc=$(cat /tmp/b.rc) ..." >> $R; mkdir -p $OUT/run2; TORCH_OSS_RESULTS=$OUT/run2 timeout 220 python3 bench/softmax.py --rounds 3 > $OUT/bench_run2.log 2>&1; echo "bench rc=$? ..." >> $R
# ---- call 6 (H200): sbin/am6.sh (sbin/sm_exp built from branch exp/warp-bwd-static-lanes)
#!/bin/bash
# session am call 6 (H200), experiment on branch exp/warp-bwd-static-lanes: the warp kernel's aligned light
# backward with the lanes per row fixed at compile time (8, 16, 32) for full rows (G x 2 slots), sbin/sm_exp,
# against sbin/sm_new (6bb0efa), fixed mode interleaved twice at 2^26 and 2^27; then sm_exp quick and race.
R=$OUT/all.txt; t0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv >> $R
PTS="bwd:bf16:128 bwd:f16:128 bwd:f32:128 bwd:bf16:256 bwd:f32:64 bwd:bf16:64 bwd:bf16:200"
for pass in 1 2; do
  FIXED_SIZES=26,27 timeout 60 ./sbin/sm_new fixed $PTS > $OUT/fixed_base_$pass.txt 2>&1
  FIXED_SIZES=26,27 timeout 60 ./sbin/sm_exp fixed $PTS > $OUT/fixed_new_$pass.txt 2>&1
done
echo "fixed done $(( $(date +%s) - t0 )) s" >> $R
python3 sbin/summ.py $OUT > $OUT/summary.txt 2>&1
for f in $OUT/fixed_*_?.txt; do echo "== $(basename $f)"; cat $f; done > $OUT/fixed_raw.txt; rm -f $OUT/fixed_*_?.txt
timeout 70 ./sbin/sm_exp quick > /tmp/q.txt 2>&1; echo "quick rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 /tmp/q.txt)" >> $R
timeout 40 ./sbin/sm_exp race > /tmp/r.txt 2>&1; echo "race rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 /tmp/r.txt)" >> $R
grep -m5 "^FAIL" /tmp/q.txt /tmp/r.txt >> $R
# ---- call 7 (H200, warm): the command
R=$OUT/all.txt; PTS="bwd:bf16:128 bwd:bf16:128:17=1 bwd:bf16:128:17=2 bwd:f32:128 bwd:f32:128:17=1 bwd:bf16:4096 bwd:bf16:4096:17=1 bwd:bf16:4096:17=2"; for pass in 1 2; do FIXED_SIZES=26,27 timeout 60 ./sbin/sm_new fixed $PTS > $OUT/fixed_new_$pass.txt 2>&1; done; python3 sbin/summ.py $OUT > $OUT/summary.txt 2>&1; (raw files concatenated into fixed_raw.txt)
# ---- call 8 (H200, warm): the command
PTS=""; for p in bwd:bf16:128 bwd:f16:128 bwd:f32:128 bwd:bf16:256 bwd:f32:64 fwd:bf16:128 fwd:bf16:512 fwd:f32:128 fwd:bf16:64; do PTS="$PTS $p $p:20=20 $p:17=2"; done; for pass in 1 2; do FIXED_SIZES=26,27 timeout 60 ./sbin/sm_new fixed $PTS > $OUT/fixed_new_$pass.txt 2>&1; done; python3 sbin/summ.py $OUT > $OUT/summary.txt 2>&1
# ---- call 9 (refused: the device time was spent): sbin/am9.sh, the A/B and checks of branch exp/h200-warp-window
#!/bin/bash
# session am call 9 (H200): the warp tier's 16-bit rows take the release window where memory is fast per SM
# (sbin/sm_win) against every row (sbin/sm_new, 6bb0efa); fixed mode interleaved twice at 2^26 and 2^27; then
# sm_win quick and race.
R=$OUT/all.txt; t0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv >> $R
PTS="bwd:bf16:128 bwd:f16:128 bwd:bf16:256 bwd:f16:64 fwd:bf16:64 fwd:bf16:128 fwd:f16:128 fwd:bf16:512 fwd:f16:512 fwd:bf16:32 bwd:f32:128 fwd:f32:128"
for pass in 1 2; do
  FIXED_SIZES=26,27 timeout 60 ./sbin/sm_new fixed $PTS > $OUT/fixed_base_$pass.txt 2>&1
  FIXED_SIZES=26,27 timeout 60 ./sbin/sm_win fixed $PTS > $OUT/fixed_new_$pass.txt 2>&1
done
echo "fixed done $(( $(date +%s) - t0 )) s" >> $R
python3 sbin/summ.py $OUT > $OUT/summary.txt 2>&1
for f in $OUT/fixed_*_?.txt; do echo "== $(basename $f)"; cat $f; done > $OUT/fixed_raw.txt; rm -f $OUT/fixed_*_?.txt
timeout 70 ./sbin/sm_win quick > /tmp/q.txt 2>&1; echo "quick rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 /tmp/q.txt)" >> $R
timeout 40 ./sbin/sm_win race > /tmp/r.txt 2>&1; echo "race rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 /tmp/r.txt)" >> $R
grep -m5 "^FAIL" /tmp/q.txt /tmp/r.txt >> $R
