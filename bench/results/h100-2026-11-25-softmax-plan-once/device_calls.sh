#!/usr/bin/env bash
# call 1: build this tree and 4ae53ff's (HEAD_DIMS=64), self-test quick, host cost both trees
set -u
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 PYTHONUNBUFFERED=1
R=$OUT; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt
(mkdir -p /tmp/oldb && cd /tmp/oldb && tar xf $OLDPWD/sbin/old.tar && cd old && TORCH_OSS_HEAD_DIMS=64 MAX_JOBS=6 python3 setup.py build_ext --inplace > $R/old_build.log 2>&1; echo "old build rc $?" >> $R/old_build.log) &
OLDPID=$!
start=$(date +%s)
MAX_JOBS=10 bash scripts/gpu_check.sh build > $R/build_stage.log 2>&1
echo "new build $(( $(date +%s) - start )) s" 
wait $OLDPID; tail -1 $R/old_build.log; echo "both built $(( $(date +%s) - start )) s"
cp results/build.log $R/ 2>/dev/null
tail -5 $R/build_stage.log
./sbin/sm quick > $R/selftest_quick.txt 2>&1; echo "selftest quick rc $?"; grep -E 'FAIL|plan|workspace|passed|failures' $R/selftest_quick.txt | tail -8
for tree in new old; do
  if [ $tree = old ]; then PP=/tmp/oldb/old; else PP=$PWD; fi
  echo "== $tree" 
  PYTHONPATH=$PP python3 -c "import torch_oss,sys; print(torch_oss.__file__)"
  PYTHONPATH=$PP timeout 150 python3 scripts/softmax_host_overhead.py --no-compile --reps 9 > $R/host_${tree}.txt 2>&1; cat $R/host_${tree}.txt
done
for tree in new old; do
  if [ $tree = old ]; then PP=/tmp/oldb/old; else PP=$PWD; fi
  echo "== varying $tree"
  PYTHONPATH=$PP timeout 100 python3 $PWD/scripts/softmax_host_overhead.py --varying --reps 9 > $R/varying_${tree}.txt 2>&1; cat $R/varying_${tree}.txt
done
PYTHONPATH=$PWD timeout 60 python3 scripts/softmax_host_overhead.py --breakdown --reps 9 > $R/breakdown_new.txt 2>&1; cat $R/breakdown_new.txt
PYTHONPATH=/tmp/oldb/old timeout 60 python3 scripts/softmax_host_overhead.py --breakdown --reps 9 > $R/breakdown_old.txt 2>&1; cat $R/breakdown_old.txt
echo "total $(( $(date +%s) - start )) s"
#!/usr/bin/env bash
# call 2: build this tree + 4ae53ff's; self-test check (bg); GPU tests; host cost new/old alternating, pinned
set -u
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 PYTHONUNBUFFERED=1
R=$OUT; mkdir -p $R
start=$(date +%s)
(./sbin/sm check > $R/selftest_check.txt 2>&1; echo "selftest check rc $?" >> $R/selftest_check.txt) &
SPID=$!
(mkdir -p /tmp/oldb && cd /tmp/oldb && tar xf $OLDPWD/sbin/old.tar && cd old && TORCH_OSS_HEAD_DIMS=64 MAX_JOBS=6 python3 setup.py build_ext --inplace > $R/old_build.log 2>&1; echo "old build rc $?" >> $R/old_build.log) &
OPID=$!
MAX_JOBS=10 bash scripts/gpu_check.sh build > $R/build_stage.log 2>&1
wait $OPID; tail -1 $R/old_build.log; echo "built $(( $(date +%s) - start )) s"
grep -A3 'summary' $R/build_stage.log
TESTS="tests/test_softmax.py tests/test_models.py tests/test_extremes.py tests/test_patching.py tests/test_errors.py tests/test_export.py tests/test_concurrency.py" PYTEST_ARGS="-k cuda" TEST_JOBS=3 FILE_TIMEOUT=280 STAGE_TIMEOUT=300 TORCH_OSS_RESULTS=$R/gpu bash scripts/gpu_check.sh test > $R/test_stage.log 2>&1
grep -E 'rc [0-9]|FAILED|ERROR' $R/test_stage.log | head -20
echo "tests done $(( $(date +%s) - start )) s"
wait $SPID; tail -3 $R/selftest_check.txt; echo "selftest done $(( $(date +%s) - start )) s"
for round in 1 2 3; do
  for tree in new old; do
    if [ $tree = old ]; then PP=/tmp/oldb/old; else PP=$PWD; fi
    PYTHONPATH=$PP timeout 60 taskset -c 3 python3 scripts/softmax_host_overhead.py --no-compile --reps 9 > $R/host_${tree}_$round.txt 2>&1
  done
done
for round in 1 2; do
  for tree in new old; do
    if [ $tree = old ]; then PP=/tmp/oldb/old; else PP=$PWD; fi
    PYTHONPATH=$PP timeout 60 taskset -c 3 python3 scripts/softmax_host_overhead.py --varying --reps 9 > $R/varying_${tree}_$round.txt 2>&1
    PYTHONPATH=$PP timeout 60 taskset -c 3 python3 scripts/softmax_host_overhead.py --breakdown --reps 9 > $R/breakdown_${tree}_$round.txt 2>&1
  done
done
head -2 $R/host_old_1.txt $R/varying_old_1.txt | grep from
echo "total $(( $(date +%s) - start )) s"
#!/usr/bin/env bash
# call 4: build this tree and 4ae53ff's (HEAD_DIMS=64 each), then host cost, processes alternating new/old, pinned
set -u
export TORCH_CUDA_ARCH_LIST=9.0a PYTHONUNBUFFERED=1 TORCH_OSS_HEAD_DIMS=64
R=$OUT; start=$(date +%s)
(mkdir -p /tmp/oldb && cd /tmp/oldb && tar xf $OLDPWD/sbin/old.tar && cd old && MAX_JOBS=8 python3 setup.py build_ext --inplace > /tmp/old_build.log 2>&1; echo "old build rc $?") &
OPID=$!
MAX_JOBS=8 python3 setup.py build_ext --inplace > /tmp/new_build.log 2>&1; echo "new build rc $?"
wait $OPID; echo "built $(( $(date +%s) - start )) s"
run() { # tree args...
  local tree=$1; shift
  if [ $tree = old ]; then PP=/tmp/oldb/old; else PP=$PWD; fi
  echo "=== $tree $*"
  PYTHONPATH=$PP timeout 90 taskset -c 3 python3 scripts/softmax_host_overhead.py "$@"
}
{
for round in 1 2 3; do for tree in new old; do run $tree --no-compile; done; done
for round in 1 2; do for tree in new old; do run $tree --varying; run $tree --breakdown; done; done
} > $R/host_cost_new_old.txt 2>&1
grep -c 'torch_oss from /tmp/oldb' $R/host_cost_new_old.txt
echo "total $(( $(date +%s) - start )) s"
#!/usr/bin/env bash
# call 5: staggered first wave of clusters (experiment build sbin/sm_stagger) vs main's knob build sbin/sm, fixed mode
set -u
R=$OUT
{
for round in 1 2 3; do
  echo "=== round $round main"
  FIXED_SIZES=26,28 ./sbin/sm fixed fwd:bf16:1048576 fwd:f16:1048576 fwd:bf16:262144 2>&1 | grep -E '^fixed fwd|^fit fwd'
  echo "=== round $round stagger"
  FIXED_SIZES=26,28 ./sbin/sm_stagger fixed fwd:bf16:1048576 fwd:bf16:1048576:22=2000 fwd:bf16:1048576:22=4000 fwd:bf16:1048576:22=8000 fwd:bf16:1048576:22=4000\;23=28 fwd:f16:1048576 fwd:f16:1048576:22=4000 fwd:bf16:262144 fwd:bf16:262144:22=2000 2>&1 | grep -E '^fixed fwd|^fit fwd'
done
} > $R/stagger.txt 2>&1
cat $R/stagger.txt | grep -v '^fit'
# call 6 (inline):
for round in 1 2; do FIXED_SIZES=26,27,28 ./sbin/sm_stagger fixed fwd:bf16:1048576 fwd:bf16:1048576:22=250 fwd:bf16:1048576:22=1000 fwd:bf16:1048576:22=4000\;23=2 fwd:bf16:1048576:22=4000\;23=28 fwd:bf16:1048576:22=4000\;23=64 2>&1 | grep -E '^fixed fwd'; done | tee $OUT/stagger2.txt
# call 7 (inline; sbin/sm_spin = the experiment patch with the wait as a clock64() spin of knob-22 SM cycles):
for round in 1 2; do echo "== main"; FIXED_SIZES=26,27,28 ./sbin/sm fixed fwd:bf16:1048576 fwd:f16:1048576 2>&1 | grep -E '^fixed fwd'; echo "== spin"; FIXED_SIZES=26,27,28 ./sbin/sm_spin fixed fwd:bf16:1048576 fwd:bf16:1048576:22=440 fwd:bf16:1048576:22=3500 fwd:bf16:1048576:22=7000 fwd:bf16:1048576:22=3500\;23=28 fwd:bf16:1048576:22=7000\;23=28 fwd:f16:1048576 fwd:f16:1048576:22=3500\;23=28 2>&1 | grep -E '^fixed fwd'; done | tee $OUT/spin.txt
#!/usr/bin/env bash
# call A: production build of this tree (from scratch) + old tree (bd3dd53, head dims 64,128); GPU tests
set -u
export TORCH_CUDA_ARCH_LIST=9.0a PYTHONUNBUFFERED=1
R=$OUT; start=$(date +%s)
(mkdir -p /tmp/oldb && cd /tmp/oldb && tar xf $OLDPWD/sbin/old.tar && cd old && TORCH_OSS_HEAD_DIMS=64,128 MAX_JOBS=6 python3 setup.py build_ext --inplace > /tmp/old_build.log 2>&1; echo "old build rc $?") &
OPID=$!
MAX_JOBS=10 bash scripts/gpu_check.sh build > /tmp/build_stage.log 2>&1
grep -A2 'summary' /tmp/build_stage.log; grep -E 'spill' /tmp/build_stage.log | head -3
wait $OPID; echo "built $(( $(date +%s) - start )) s"
TESTS="tests/test_attention.py tests/test_softmax.py tests/test_patching.py tests/test_models.py tests/test_export.py tests/test_errors.py tests/test_concurrency.py tests/test_determinism.py" PYTEST_ARGS="-k cuda" TEST_JOBS=3 FILE_TIMEOUT=360 STAGE_TIMEOUT=380 TORCH_OSS_RESULTS=/tmp/gpu bash scripts/gpu_check.sh test > /tmp/test_stage.log 2>&1
grep -E 'rc [0-9]|^FAILED|^ERROR' /tmp/test_stage.log | head -30 | tee $R/gpu_tests.txt
grep -h -B2 -A25 'node_only' /tmp/gpu/test_test_attention.py.log | grep -E 'Error|assert|FAILED' | head -10
echo "tests done $(( $(date +%s) - start )) s"
# call B (inline, right after call A on the same machine):
for round in 1 2 3; do for tree in new old; do if [ $tree = old ]; then PP=/tmp/oldb/old; else PP=$PWD; fi; echo "=== $tree"; PYTHONPATH=$PP:$PWD/scripts timeout 40 taskset -c 3 python3 scripts/attention_host_overhead.py --reps 11; done; done > $OUT/attn_host.txt 2>&1
#!/usr/bin/env bash
# call C: production build of the final tree, then bench/softmax.py --rounds 3 (README table run)
set -u
export TORCH_CUDA_ARCH_LIST=9.0a PYTHONUNBUFFERED=1 MAX_JOBS=16
start=$(date +%s)
bash scripts/gpu_check.sh build > /tmp/build_stage.log 2>&1; grep -A2 summary /tmp/build_stage.log
echo "built $(( $(date +%s) - start )) s"
TORCH_OSS_RESULTS=$OUT timeout 420 python3 bench/softmax.py --rounds 3 > $OUT/bench_softmax_rounds3.log 2>&1; echo "bench rc $?"
echo "total $(( $(date +%s) - start )) s"
tail -60 $OUT/bench_softmax_rounds3.log
#!/usr/bin/env bash
# call D: production build of the final tree; compute-sanitizer memcheck on the softmax and attention smoke grids
set -u
export TORCH_CUDA_ARCH_LIST=9.0a PYTHONUNBUFFERED=1 MAX_JOBS=16
start=$(date +%s)
bash scripts/gpu_check.sh build > /tmp/build_stage.log 2>&1; grep -A2 summary /tmp/build_stage.log
echo "built $(( $(date +%s) - start )) s"
for part in softmax attention; do
  timeout 220 compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 20 python3 scripts/sanitize_smoke.py $part > $OUT/memcheck_$part.log 2>&1
  echo "memcheck $part rc $? at $(( $(date +%s) - start )) s"; tail -3 $OUT/memcheck_$part.log
done
# call E (inline, same machine): timeout 200 compute-sanitizer --tool racecheck --error-exitcode 99 --print-limit 20 python3 scripts/sanitize_smoke.py softmax > $OUT/racecheck_softmax.log 2>&1
