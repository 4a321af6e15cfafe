# ===== sbin/ae1.sh =====
#!/bin/bash
# session ae call 1: the light one-row-per-CTA kernel at the chunk kernel's register budget (knob 24) - knob build, selftest check with it, variants against the chunk kernel and torch.compile
export TORCH_OSS_RESULTS=$OUT TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=14 TORCH_OSS_SOFTMAX_KNOBS=1 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1
R=$OUT/all.txt
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
(SELFTEST_KNOBS=24=1 timeout 200 ./sbin/sm check > $OUT/selftest.txt 2>&1; echo "selftest check (24=1) rc $? $(( $(date +%s) - t0 )) s" >> $OUT/selftest.txt) &
SPID=$!
rm -rf build torch_oss/_C*.so csrc/cuda/generated
python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 /tmp/build.log >> $R; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" >> $R
wait $SPID; grep -E "rc |fail|FAIL" $OUT/selftest.txt | head -20 >> $R
timeout $(( 585 - ($(date +%s) - t0) )) python3 scripts/softmax_variants.py --points bwd:bfloat16:32768,bwd:float16:32768,bwd:float32:16384,bwd:bfloat16:24576,fwd:float32:4096,fwd:bfloat16:16384,fwd:bfloat16:32768,fwd:float32:8192,fwd:float32:16384 \
  --variants "base;24=1;11=4;24=1,11=4" --rounds 3 > $OUT/variants_2p26.txt 2>&1
echo "variants rc=$? $(( $(date +%s) - t0 )) s" >> $R

# ===== sbin/ae2.sh =====
#!/bin/bash
# session ae call 2: the light kernel at the chunk kernel's register budget (knob 24 = 1, = 2 also at <= 2 slots) with the L2 policy variants; 2^26 and 2^28
export TORCH_OSS_RESULTS=$OUT TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=14 TORCH_OSS_SOFTMAX_KNOBS=1 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1
R=$OUT/all.txt
t0=$(date +%s)
(SELFTEST_KNOBS=24=2 timeout 200 ./sbin/sm check > $OUT/selftest.txt 2>&1; echo "selftest check (24=2) rc $? $(( $(date +%s) - t0 )) s" >> $OUT/selftest.txt) &
SPID=$!
rm -rf build torch_oss/_C*.so csrc/cuda/generated
python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 /tmp/build.log >> $R; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" >> $R
V=scripts/softmax_variants.py
python3 $V --points bwd:bfloat16:32768,bwd:float16:32768,fwd:float32:4096 --variants "base;24=1;24=1,17=2;24=1,17=1;24=1,23=1" --rounds 5 > $OUT/variants_policy_2p26.txt 2>&1
echo "v1 rc=$? $(( $(date +%s) - t0 )) s" >> $R
python3 $V --points bwd:bfloat16:4096,bwd:float16:4096,bwd:float32:2048,fwd:bfloat16:32768,fwd:float16:32768 --variants "base;24=1;24=2" --rounds 5 > $OUT/variants_grid_2p26.txt 2>&1
echo "v2 rc=$? $(( $(date +%s) - t0 )) s" >> $R
wait $SPID; grep -E "rc |fail|FAIL" $OUT/selftest.txt | head -20 >> $R
timeout $(( 585 - ($(date +%s) - t0) )) python3 $V --points bwd:bfloat16:32768,fwd:float32:4096,bwd:bfloat16:4096,fwd:float32:8192 --variants "base;24=1;24=2" --rounds 3 --size 28 > $OUT/variants_2p28.txt 2>&1
echo "v3 rc=$? $(( $(date +%s) - t0 )) s" >> $R

# ===== sbin/ae3.sh =====
#!/bin/bash
# session ae call 3: the light kernel at the chunk budget as the default (knob 24 = 1 the chunk kernel): selftest, CUDA softmax tests, Inductor's kernels, grid caps for the last wave
export TORCH_OSS_RESULTS=$OUT TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=14 TORCH_OSS_SOFTMAX_KNOBS=1 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1
R=$OUT/all.txt
t0=$(date +%s)
(timeout 200 ./sbin/sm check > $OUT/selftest.txt 2>&1; echo "selftest check (default) rc $? $(( $(date +%s) - t0 )) s" >> $OUT/selftest.txt;
 SELFTEST_KNOBS=24=1 timeout 100 ./sbin/sm quick >> $OUT/selftest.txt 2>&1; echo "selftest quick (24=1) rc $? $(( $(date +%s) - t0 )) s" >> $OUT/selftest.txt) &
SPID=$!
rm -rf build torch_oss/_C*.so csrc/cuda/generated
python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 /tmp/build.log >> $R; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" >> $R
python3 sbin/inductor_dump.py >> $R 2>&1
timeout 170 python3 -m pytest -q tests/test_softmax.py -k cuda -p no:cacheprovider -x > $OUT/test_softmax_cuda.txt 2>&1 &
timeout 170 python3 -m pytest -q tests/test_extremes.py -k "cuda and softmax" -p no:cacheprovider -x > $OUT/test_extremes_cuda.txt 2>&1 &
wait
echo "tests $(( $(date +%s) - t0 )) s" >> $R; tail -2 $OUT/test_softmax_cuda.txt $OUT/test_extremes_cuda.txt >> $R
grep -E "rc |fail|FAIL" $OUT/selftest.txt | head -20 >> $R
V=scripts/softmax_variants.py
python3 $V --points bwd:bfloat16:32768,bwd:float16:32768 --variants "base;24=1;10=128;10=124" --rounds 5 > $OUT/variants_bwd32k_2p26.txt 2>&1
echo "v1 rc=$? $(( $(date +%s) - t0 )) s" >> $R
python3 $V --points fwd:float32:4096 --variants "base;24=1;10=1024;11=4;22=2" --rounds 5 > $OUT/variants_f32_4096_2p26.txt 2>&1
echo "v2 rc=$? $(( $(date +%s) - t0 )) s" >> $R
timeout $(( 585 - ($(date +%s) - t0) )) python3 $V --points fwd:float32:4096 --variants "base;24=1;11=4;22=2" --rounds 3 --size 28 > $OUT/variants_2p28.txt 2>&1
timeout $(( 585 - ($(date +%s) - t0) )) python3 $V --points bwd:bfloat16:32768 --variants "base;24=1" --rounds 3 --size 28 >> $OUT/variants_2p28.txt 2>&1
echo "v3 rc=$? $(( $(date +%s) - t0 )) s" >> $R

# ===== sbin/inductor_dump.py =====
# dumps the Triton source Inductor generates for two softmax points (to see its launch shape)
import os, torch, torch.nn.functional as F
import torch._inductor.config as ic
ic.debug = False
out = os.environ["OUT"]
from torch._inductor.utils import run_and_get_code
fwd = torch.compile(lambda x: F.softmax(x, -1), dynamic=False)
bwd = torch.compile(lambda dy, y: torch._softmax_backward_data(dy, y, -1, y.dtype), dynamic=False)
x = torch.randn(16384, 4096, device="cuda")
_, code = run_and_get_code(fwd, x)
open(f"{out}/inductor_fwd_f32_4096.py", "w").write("\n\n".join(code))
for dt in (torch.bfloat16,):
    y = torch.randn(2048, 32768, device="cuda", dtype=dt).softmax(-1)
    dy = torch.randn_like(y)
    _, code = run_and_get_code(bwd, dy, y)
    open(f"{out}/inductor_bwd_bf16_32768.py", "w").write("\n\n".join(code))
print("dumped")

# ===== sbin/ae4.sh =====
#!/bin/bash
# session ae call 4: fixed cost per call vs streaming rate (selftest fixed) and CTA timelines for the light kernel at the chunk budget, the chunk kernel (24=1) and grid caps that even out the last wave
R=$OUT/all.txt
t0=$(date +%s)
P="bwd:bf16:32768 bwd:bf16:32768:24=1 bwd:bf16:32768:10=128 bwd:bf16:32768:10=124 fwd:f32:4096 fwd:f32:4096:24=1 fwd:f32:4096:10=1024 fwd:f32:4096:11=4"
for rep in 1 2; do FIXED_SIZES=26,28 timeout 200 ./sbin/sm fixed $P >> $R 2>&1; echo "fixed rep $rep rc $? $(( $(date +%s) - t0 )) s" >> $R; done
TL_REPS=5 timeout 200 ./sbin/smtl timeline bwd:bf16:32768 bwd:bf16:32768:24=1 bwd:bf16:32768:10=128 fwd:f32:4096 fwd:f32:4096:24=1 >> $R 2>&1
echo "timeline rc $? $(( $(date +%s) - t0 )) s" >> $R

# ===== sbin/ae5.sh =====
#!/bin/bash
# session ae call 5: production build from scratch (all head dims) of a3e2501 (the light kernel at the chunk budget), the CUDA cases of the softmax-related test files, memcheck on the softmax smoke grid, racecheck on the self-test's race cases, self-test check
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

# ===== sbin/ae6.sh =====
#!/bin/bash
# session ae call 6: production build from scratch (all head dims) of the final kernels, memcheck on the softmax smoke grid (now with 16384/32768 aligned rows), bench/softmax.py --rounds 3 twice
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 PYTHONUNBUFFERED=1
R=$OUT/all.txt
t0=$(date +%s)
TORCH_OSS_RESULTS=/tmp/gpu bash scripts/gpu_check.sh build > /tmp/build_stage.txt 2>&1
echo "build stage rc=$? $(( $(date +%s) - t0 )) s" >> $R
timeout 90 compute-sanitizer --tool memcheck python3 scripts/sanitize_smoke.py softmax > $OUT/memcheck_softmax_smoke.txt 2>&1
echo "memcheck rc=$? $(( $(date +%s) - t0 )) s" >> $R; tail -2 $OUT/memcheck_softmax_smoke.txt >> $R
mkdir -p $OUT/run1 $OUT/run2
TORCH_OSS_RESULTS=$OUT/run1 timeout 200 python3 bench/softmax.py --rounds 3 > $OUT/bench_run1.log 2>&1
echo "bench 1 rc=$? $(( $(date +%s) - t0 )) s" >> $R
TORCH_OSS_RESULTS=$OUT/run2 timeout $(( 590 - ($(date +%s) - t0) )) python3 bench/softmax.py --rounds 3 > $OUT/bench_run2.log 2>&1
echo "bench 2 rc=$? $(( $(date +%s) - t0 )) s" >> $R

