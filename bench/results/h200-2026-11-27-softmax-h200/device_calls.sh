### call 1: sbin/aj1.sh (sbin/sm and sbin/sm_tl built on the development machine from 117af7d with -DOSS_SOFTMAX_TEST_KNOBS, sm_tl also -DOSS_SOFTMAX_TIMELINE; sbin/libsoftmax_probe.so from scripts/softmax_probe_kernels.cu)
#!/bin/bash
# session aj call 1: Nsight Compute on the bfloat16 backward at 4096 columns, 2^26 elements:
# the library's plan (chunk kernel, 256 x 2) and the light tier at 512 x 1 (knob 22=512) through
# the self-test's fixed mode (sbin/sm, built on the development machine from 117af7d), against
# torch.compile's kernel and probe kernels 0 (256 x 2, plain), 6 (512 x 1, evict_last) and 15
# (512 x 1, evict_last + release) through scripts/softmax_ncu_peers.py; then CTA timelines of the
# two library plans (sbin/sm_tl, -DOSS_SOFTMAX_TIMELINE). No extension build.
export PYTHONUNBUFFERED=1
R=$OUT/all.txt
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
NCU="ncu --clock-control none --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats --section InstructionStats --section MemoryWorkloadAnalysis"
for p in bwd:bf16:4096 bwd:bf16:4096:22=512; do
  echo "=== $p" >> $OUT/ncu_lib.txt
  FIXED_SIZES=26 timeout 90 $NCU -k regex:softmax_row --launch-skip 2 --launch-count 1 ./sbin/sm fixed $p >> $OUT/ncu_lib.txt 2>&1
  echo "ncu $p rc=$? $(( $(date +%s) - t0 )) s" >> $R
done
timeout 180 $NCU --profile-from-start off --target-processes all python3 scripts/softmax_ncu_peers.py --lib sbin/libsoftmax_probe.so --bwd 0,6,15 > $OUT/ncu_peers.txt 2>&1
echo "ncu peers rc=$? $(( $(date +%s) - t0 )) s" >> $R
TL_REPS=5 timeout 60 ./sbin/sm_tl timeline bwd:bf16:4096 bwd:bf16:4096:22=512 > $OUT/timeline.txt 2>&1
echo "timeline rc=$? $(( $(date +%s) - t0 )) s" >> $R
grep -E "Duration|Registers Per|Achieved Occupancy|Executed Ipc A|Executed Instructions  |Memory Throughput|L2 Hit Rate  |DRAM Throughput|^  [a-z_]+.*\(|softmax_row|bwd_onepass|triton" $OUT/ncu_lib.txt $OUT/ncu_peers.txt | head -80 >> $R
grep -E "median of" $OUT/timeline.txt >> $R

### call 2: sbin/aj2.sh
#!/bin/bash
# session aj call 2: the H200 picture - production build (head dim 64) of the tree, bench/softmax.py --rounds 3
# (every point, every peer), then the kernels' own time of torch_oss and torch.compile at the backward 4096 and
# the 128-column forward
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1 TORCH_OSS_COMMIT="aed2644"
R=$OUT/all.txt
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
rm -rf build torch_oss/_C*.so csrc/cuda/generated
python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 /tmp/build.log >> $R; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" >> $R
mkdir -p $OUT/run1
TORCH_OSS_RESULTS=$OUT/run1 timeout 260 python3 bench/softmax.py --rounds 3 > $OUT/bench_run1.log 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s" >> $R
timeout $(( 560 - ($(date +%s) - t0) )) python3 scripts/softmax_kernel_durations.py --points bwd:bfloat16:4096,bwd:float16:4096,fwd:bfloat16:128,fwd:float32:4096,bwd:bfloat16:32768 --calls 50 --rounds 2 > $OUT/kernel_durations_2p26.txt 2>&1
echo "durations rc=$? $(( $(date +%s) - t0 )) s" >> $R

### call 3: the command as sent (same warm machine, call 2's build)
export PYTHONUNBUFFERED=1; nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/h200_checks.txt; (timeout 280 ./sbin/sm check > $OUT/selftest_check_h200.txt 2>&1; echo "selftest rc=$?" >> $OUT/h200_checks.txt) & timeout 280 python3 -m pytest tests/test_softmax.py -q -k cuda -x -p no:cacheprovider > $OUT/test_softmax_cuda_h200.txt 2>&1; echo "pytest rc=$?" >> $OUT/h200_checks.txt; wait; tail -2 $OUT/test_softmax_cuda_h200.txt >> $OUT/h200_checks.txt; tail -2 $OUT/selftest_check_h200.txt >> $OUT/h200_checks.txt; grep -m5 "^FAIL" $OUT/selftest_check_h200.txt >> $OUT/h200_checks.txt; cat $OUT/h200_checks.txt
