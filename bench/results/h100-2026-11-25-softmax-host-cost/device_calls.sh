#!/usr/bin/env bash
# fixed-cost timing, 4 rounds: base (HEAD) / L2 (hi group after the register loads) / L3 (same, lo = 3/4)
set -u
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
P="fwd:bf16:1048576 fwd:f16:1048576 fwd:f32:1048576 fwd:bf16:262144 fwd:f16:128256 fwd:f32:262144 fwd:bf16:65536 bwd:bf16:1048576 bwd:bf16:262144 bwd:f32:262144"
for r in 1 2 3 4; do
  for b in base L2 L3; do
    echo "== round $r $b"
    FIXED_SIZES=26,28 timeout 120 ./sbin/sm_$b fixed $P 2>&1 | grep -E "^fixed [a-z]|fail|FAIL|error" | awk '{printf "%s %s %s | ", $2, $3, $NF} END {print ""}'
  done
done
#!/usr/bin/env bash
# timelines (sm_tl = HEAD kernels with -DOSS_SOFTMAX_TIMELINE): 1M / 256K forward, 32768 backward at 2^26; 1M at 2^28
set -u
TL_REPS=5 timeout 120 ./sbin/sm_tl timeline fwd:bf16:1048576 fwd:bf16:262144 bwd:bf16:32768 fwd:f16:1024 2>&1 | grep -v "^check\|^ok"
TL_LOG2=28 TL_REPS=3 timeout 120 ./sbin/sm_tl timeline fwd:bf16:1048576 2>&1 | grep -v "^check\|^ok"
#!/usr/bin/env bash
# wave quantisation at the 16-bit forward of ~1M columns (14 clusters of 16 at once):
# 1048576 -> 64 rows (4.57 waves) at 2^26; 1198080 -> 56 rows (4.0); 917504 -> 73 (5.2); 1118480 -> 60 (4.3)
set -u
P="fwd:bf16:1048576 fwd:bf16:1198080 fwd:bf16:917504 fwd:bf16:1118480 fwd:f16:1048576 fwd:f16:1198080"
for r in 1 2 3 4 5; do
  echo "== round $r"
  FIXED_SIZES=26,27 timeout 120 ./sbin/sm_base fixed $P 2>&1 | grep -E "^fixed [a-z]|FAIL" | awk '{printf "%s %s %s | ", $2, $3, $NF} END {print ""}'
done
./sbin/sm_base fixed fwd:bf16:1198080 2>&1 | grep -E "^plan" | head -3
#!/usr/bin/env bash
# persistent bulk-copy (TMA) prototypes against torch_oss and torch.compile (scripts/softmax_probe.py)
set -u
TORCH_OSS_HEAD_DIMS=64 bash scripts/gpu_check.sh build 2>&1 | tail -3
mkdir -p build && nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Xcompiler -fPIC -shared \
  scripts/softmax_probe_kernels.cu -o build/libsoftmax_probe.so || exit 1
timeout 400 python3 scripts/softmax_probe.py --bwd 0,20,21,22,23 --fwd 11,30,31,32,33 --sizes 26,28 --rounds 2 2>&1 | grep -v "Online softmax\|warnings.warn\|split the reduction\|important use case\|^softmax.$\|^$"
#!/usr/bin/env bash
# host cost per call (scripts/softmax_host_overhead.py), production build of HEAD (+ probe variants, not in the library)
set -u
TORCH_OSS_HEAD_DIMS=64 bash scripts/gpu_check.sh build 2>&1 | tail -2
timeout 400 python3 scripts/softmax_host_overhead.py 2>&1 | grep -v "Online softmax\|warnings.warn\|split the reduction\|important use case\|^softmax.$\|^$"
#!/usr/bin/env bash
# C++ autograd for softmax/log_softmax: production build, GPU tests of the op stack, host cost per call
set -u
bash scripts/gpu_check.sh build 2>&1 | tail -2
TESTS="tests/test_softmax.py tests/test_errors.py tests/test_patching.py tests/test_extremes.py tests/test_models.py tests/test_export.py tests/test_concurrency.py" PYTEST_ARGS="-k cuda" TEST_JOBS=4 FILE_TIMEOUT=250 STAGE_TIMEOUT=280 bash scripts/gpu_check.sh test 2>&1 | tail -12
timeout 200 python3 scripts/softmax_host_overhead.py 2>&1 | grep -v "Online softmax\|warnings.warn\|split the reduction\|important use case\|^softmax.$\|^$\|UserWarning"
#!/usr/bin/env bash
# residency cache in the planner (host code only): build, self-test check (every tier), GPU tests, host cost per call
set -u
bash scripts/gpu_check.sh build 2>&1 | tail -2
(timeout 420 ./sbin/sm check > $OUT/selftest_check.log 2>&1; echo "selftest rc $?" >> $OUT/selftest_check.log) &
TESTS="tests/test_softmax.py tests/test_errors.py tests/test_extremes.py tests/test_concurrency.py tests/test_patching.py" PYTEST_ARGS="-k cuda" TEST_JOBS=3 FILE_TIMEOUT=300 STAGE_TIMEOUT=330 bash scripts/gpu_check.sh test 2>&1 | tail -8
wait
tail -3 $OUT/selftest_check.log
timeout 150 python3 scripts/softmax_host_overhead.py --no-compile 2>&1 | grep -v "UserWarning\|^$"
#!/usr/bin/env bash
# device attributes remembered per device (host code only): build, self-test check, GPU tests (attention included), host cost
set -u
bash scripts/gpu_check.sh build 2>&1 | tail -2
(timeout 400 ./sbin/sm check > $OUT/selftest_check.log 2>&1; echo "selftest rc $?" >> $OUT/selftest_check.log) &
TESTS="tests/test_attention.py tests/test_softmax.py tests/test_extremes.py tests/test_errors.py tests/test_concurrency.py tests/test_patching.py" PYTEST_ARGS="-k cuda" TEST_JOBS=4 FILE_TIMEOUT=300 STAGE_TIMEOUT=320 bash scripts/gpu_check.sh test 2>&1 | tail -9
wait
tail -2 $OUT/selftest_check.log
timeout 40 python3 scripts/softmax_host_overhead.py --breakdown 2>&1 | grep -v "UserWarning\|^$"
timeout 100 python3 scripts/softmax_host_overhead.py --no-compile 2>&1 | grep -v "UserWarning\|^$"
