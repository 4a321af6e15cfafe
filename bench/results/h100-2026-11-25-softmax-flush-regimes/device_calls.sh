#!/bin/bash
# session aa call 1: knob build; flush regimes; evict_first (knob 17=3) at the wide plans
export TORCH_OSS_RESULTS=$OUT TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_SOFTMAX_KNOBS=1 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1
R=$OUT/all.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
t0=$(date +%s)
rm -rf build torch_oss/_C*.so csrc/cuda/generated
python3 -m pip install -v --no-build-isolation --no-deps -e . > $OUT/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 $OUT/build.log >> $R; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" >> $R
timeout 170 python3 scripts/softmax_variants.py --points fwd:bfloat16:1048576,fwd:float16:1048576,fwd:bfloat16:262144 \
  --variants "base;17=3" --flush dirty,clean,none --same-traffic --rounds 3 >> $R 2>&1
echo "wide done $(( $(date +%s) - t0 )) s" >> $R
timeout 100 python3 scripts/softmax_variants.py --size 28 --points fwd:bfloat16:1048576,fwd:bfloat16:262144 \
  --variants "base;17=3" --flush dirty,clean --same-traffic --rounds 3 >> $R 2>&1
echo "size28 done $(( $(date +%s) - t0 )) s" >> $R
timeout $(( 570 - ($(date +%s) - t0) )) python3 scripts/softmax_variants.py \
  --points bwd:bfloat16:4096,bwd:float16:4096,bwd:bfloat16:32768,fwd:float16:1024,fwd:float32:4096,fwd:float16:128,fwd:float32:512,bwd:float16:32768,bwd:float32:4096 \
  --variants "base" --flush dirty,clean,none --same-traffic --rounds 3 >> $R 2>&1
echo "narrow done $(( $(date +%s) - t0 )) s" >> $R
#!/bin/bash
# session aa call 2: the release and the policy at the narrow compile points, dirty and clean flush
export TORCH_OSS_RESULTS=$OUT TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_SOFTMAX_KNOBS=1 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1
R=$OUT/all.txt
t0=$(date +%s)
if ! python3 -c "import torch_oss" 2>/dev/null; then
  rm -rf build torch_oss/_C*.so csrc/cuda/generated
  python3 -m pip install -v --no-build-isolation --no-deps -e . > $OUT/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 $OUT/build.log >> $R; exit 1; }
fi
echo "build $(( $(date +%s) - t0 )) s" >> $R
timeout $(( 560 - ($(date +%s) - t0) )) python3 scripts/softmax_variants.py \
  --points bwd:bfloat16:4096,fwd:float16:1024,bwd:bfloat16:32768,fwd:float32:4096,fwd:float16:128,fwd:float32:512 \
  --variants "base;17=2;20=16;17=1" --flush dirty,clean --same-traffic --rounds 3 >> $R 2>&1
echo "done $(( $(date +%s) - t0 )) s" >> $R
#!/bin/bash
# session aa call 3: the release window (knob 20) across the narrow grid, dirty and clean flush
export TORCH_OSS_RESULTS=$OUT TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_SOFTMAX_KNOBS=1 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1
R=$OUT/all.txt
t0=$(date +%s)
if ! python3 -c "import torch_oss" 2>/dev/null; then
  rm -rf build torch_oss/_C*.so csrc/cuda/generated
  python3 -m pip install -v --no-build-isolation --no-deps -e . > $OUT/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 $OUT/build.log >> $R; exit 1; }
fi
echo "build $(( $(date +%s) - t0 )) s" >> $R
timeout $(( 480 - ($(date +%s) - t0) )) python3 scripts/softmax_variants.py \
  --points fwd:bfloat16:128,fwd:float32:128,fwd:float16:512,fwd:bfloat16:1024,fwd:float32:1024,fwd:bfloat16:4096,fwd:bfloat16:32768,fwd:float32:32768,bwd:bfloat16:128,bwd:float32:512,bwd:bfloat16:1024,bwd:float16:4096,bwd:float32:4096,bwd:float16:32768,fwd:bfloat16:dim1,bwd:bfloat16:dim1 \
  --variants "base;20=16;20=24" --flush dirty,clean --rounds 4 >> $R 2>&1
echo "2^26 done $(( $(date +%s) - t0 )) s" >> $R
timeout $(( 585 - ($(date +%s) - t0) )) python3 scripts/softmax_variants.py --size 28 \
  --points bwd:bfloat16:4096,fwd:float16:128,fwd:bfloat16:1024 --variants "base;20=16" --flush dirty --rounds 3 >> $R 2>&1
echo "2^28 done $(( $(date +%s) - t0 )) s" >> $R
#!/bin/bash
# session aa call 4: production build from scratch, softmax GPU tests, memcheck + racecheck on the softmax smoke grid
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 PYTHONUNBUFFERED=1
R=$OUT/all.txt
t0=$(date +%s)
TORCH_OSS_RESULTS=/tmp/gpu bash scripts/gpu_check.sh build > $OUT/build_stage.txt 2>&1
echo "build stage rc=$? $(( $(date +%s) - t0 )) s" >> $R
tail -3 /tmp/gpu/build.log >> $R
TESTS="tests/test_softmax.py tests/test_extremes.py tests/test_patching.py tests/test_errors.py tests/test_export.py tests/test_concurrency.py tests/test_models.py" \
  PYTEST_ARGS="-k cuda" TEST_JOBS=4 FILE_TIMEOUT=300 TORCH_OSS_RESULTS=/tmp/gpu timeout 330 bash scripts/gpu_check.sh test >> $R 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s" >> $R
for f in /tmp/gpu/test_*.log /tmp/gpu/*test*.log; do [ -f "$f" ] && { echo "== $f"; tail -3 "$f"; }; done >> $R 2>&1
timeout 60 compute-sanitizer --tool memcheck python3 scripts/sanitize_smoke.py softmax > $OUT/memcheck.txt 2>&1
echo "memcheck rc=$? $(( $(date +%s) - t0 )) s" >> $R
tail -3 $OUT/memcheck.txt >> $R
# call 5 (warm machine after call 4): TORCH_OSS_RESULTS=$OUT python3 bench/softmax.py --rounds 3
#!/bin/bash
# session aa call 6: L2 residue with the new window (a third of the L2), knob build of a02ccfd's kernels
set -u
export TORCH_OSS_RESULTS=$OUT PYTHONUNBUFFERED=1
start=$(date +%s)
TORCH_OSS_SOFTMAX_KNOBS=1 TORCH_OSS_HEAD_DIMS=64 TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps -e . > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - start )) s"; rm -f $OUT/build.log
M=lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum
P=bwd:bfloat16:4096,fwd:bfloat16:65536,bwd:bfloat16:32768,fwd:float32:4096,fwd:bfloat16:dim1,bwd:bfloat16:dim1
timeout 300 ncu --profile-from-start off --cache-control none --replay-mode application --metrics $M python3 scripts/softmax_l2_residue.py --mib 128 --points $P --variants "17=2;base;20=8;20=1000000" > $OUT/residue_third_of_l2.txt 2>&1; echo "residue rc $?"
python3 - $OUT/residue_third_of_l2.txt <<'PY'
import sys, re
t = open(sys.argv[1]).read().splitlines()
hits = [l.split()[-1] for l in t if 'lookup_hit.sum' in l]
pts, i = [], 0
for l in t:
    if re.match(r'^(fwd|bwd):', l): pts.append([l.split()[0], []])
    elif re.match(r'^  [a-z0-9=,]+$', l) and pts: pts[-1][1].append(l.strip())
for name, steps in pts:
    nt = 1 if name.startswith('fwd') else 2
    out = []
    for s in steps:
        out.append(f"{s} {'+'.join(hits[i:i+nt])}"); i += nt
    print(name + ': ' + '; '.join(out))
PY
grep -iE "error|Traceback" $OUT/residue_third_of_l2.txt | head -5
echo "t $(( $(date +%s) - start )) s"
