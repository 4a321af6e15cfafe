# ==== sbin/an1.sh
#!/bin/bash
# session an call 1 (H200): fixed-mode A/B, sbin/sm_new (6bb0efa: the warp tier releases every row) against
# sbin/sm_win (3c126b6's kernels: the warp tier's 16-bit rows take the release window where memory is fast per
# SM), interleaved twice at 2^26 and 2^27; then a production build of 3c126b6 from scratch beside sm_win's full
# check; the CUDA cases of test_softmax; sm_win race mode.
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1 TORCH_OSS_COMMIT="${COMMIT:-3c126b6}"
R=$OUT/all.txt; t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
PTS="bwd:bf16:128 bwd:f16:128 bwd:bf16:256 bwd:bf16:512 bwd:f16:64 fwd:bf16:64 fwd:f16:64 fwd:bf16:128 fwd:f16:128 fwd:bf16:256 fwd:bf16:512 fwd:bf16:32 bwd:f32:128 fwd:f32:128"
for pass in 1 2; do
  FIXED_SIZES=26,27 timeout 70 ./sbin/sm_new fixed $PTS > $OUT/fixed_base_$pass.txt 2>&1
  FIXED_SIZES=26,27 timeout 70 ./sbin/sm_win fixed $PTS > $OUT/fixed_new_$pass.txt 2>&1
done
echo "fixed done $(( $(date +%s) - t0 )) s" >> $R
python3 sbin/summ.py $OUT > $OUT/summary.txt 2>&1
for f in $OUT/fixed_*_?.txt; do echo "== $(basename $f)"; cat $f; done > $OUT/fixed_raw.txt; rm -f $OUT/fixed_*_?.txt
rm -rf build torch_oss/_C*.so csrc/cuda/generated
( python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1; echo $? > /tmp/build.rc ) &
timeout 300 ./sbin/sm_win check > /tmp/check.txt 2>&1
echo "check rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 /tmp/check.txt)" >> $R
grep -m8 "^FAIL" /tmp/check.txt >> $R
wait
echo "build rc=$(cat /tmp/build.rc) $(( $(date +%s) - t0 )) s" >> $R
[ "$(cat /tmp/build.rc)" = 0 ] || { tail -40 /tmp/build.log >> $R; exit 1; }
python3 -c "import torch_oss; print(torch_oss.build_info())" >> $R 2>&1
left=$(( 540 - ($(date +%s) - t0) ))
timeout $left python3 -m pytest tests/test_softmax.py -q -k cuda -p no:cacheprovider > /tmp/t.txt 2>&1
echo "test_softmax [cuda] rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 /tmp/t.txt)" >> $R
grep -E "^(FAILED|ERROR)" /tmp/t.txt | head -5 >> $R
left=$(( 585 - ($(date +%s) - t0) )); [ $left -gt 10 ] && { timeout $left ./sbin/sm_win race > /tmp/r.txt 2>&1; echo "race rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 /tmp/r.txt)" >> $R; grep -m5 "^FAIL" /tmp/r.txt >> $R; }

# ==== sbin/an2.sh
#!/bin/bash
# session an call 2 (H200, warm after call 1 with 3c126b6's production build): bench/softmax.py --rounds 3 twice,
# then memcheck on scripts/sanitize_smoke.py softmax.
export PYTHONUNBUFFERED=1
R=$OUT/all.txt; t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
python3 -c "import torch_oss; print(torch_oss.build_info())" >> $R 2>&1
for run in 1 2; do
  mkdir -p $OUT/run$run
  TORCH_OSS_RESULTS=$OUT/run$run timeout 230 python3 bench/softmax.py --rounds 3 > $OUT/bench_run$run.log 2>&1
  echo "bench $run rc=$? $(( $(date +%s) - t0 )) s" >> $R
done
left=$(( 590 - ($(date +%s) - t0) )); [ $left -gt 20 ] && { timeout $left compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 20 python3 scripts/sanitize_smoke.py softmax > /tmp/mem.txt 2>&1; echo "memcheck rc=$? $(( $(date +%s) - t0 )) s: $(tail -2 /tmp/mem.txt | tr '\n' ' ')" >> $R; }
ls -R $OUT >> $R

# ==== sbin/an3.sh
#!/bin/bash
# session an call 3 (H200): float32 warp rows, every row released (default) against the release window (20 = 20,
# the planner's L2/3 window on the H200). First the self-test's fixed mode (sbin/sm_win), 4 passes in alternating
# order at 2^25..2^28; then the extension built with the test knobs and scripts/softmax_variants.py (do_bench's
# protocol, interleaved rounds beside torch.compile) at 2^26 and 2^27.
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1 TORCH_OSS_SOFTMAX_KNOBS=1
R=$OUT/all.txt; t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
A="bwd:f32:128 fwd:f32:128 bwd:f32:64 fwd:f32:64 bwd:f32:200 fwd:bf16:128"
B="bwd:f32:128:20=20 fwd:f32:128:20=20 bwd:f32:64:20=20 fwd:f32:64:20=20 bwd:f32:200:20=20 fwd:bf16:128:23=0"
for pass in 1 2 3 4; do
  if [ $((pass % 2)) = 1 ]; then P="$A $B"; else P="$B $A"; fi
  FIXED_SIZES=25,26,27,28 timeout 60 ./sbin/sm_win fixed $P > $OUT/fixed_p${pass}_$pass.txt 2>&1
done
echo "fixed done $(( $(date +%s) - t0 )) s" >> $R
python3 - $OUT > $OUT/summary.txt 2>&1 <<'PY'
import os,re,collections,sys
out=sys.argv[1]; d=collections.defaultdict(list)
for f in sorted(os.listdir(out)):
    if not f.startswith('fixed_'): continue
    for line in open(os.path.join(out,f)):
        m=re.match(r'fixed (\S+)\s+2\^(\d+):\s+([\d.]+) us\s+([\d.]+)%',line)
        if m and m.group(1)!='copy': d[(m.group(1),m.group(2))].append(float(m.group(4)))
for k in sorted(d): print(f"{k[0]:24s} 2^{k[1]}", ' '.join(f"{p:.1f}" for p in d[k]))
PY
for f in $OUT/fixed_*.txt; do echo "== $(basename $f)"; cat $f; done > $OUT/fixed_raw.txt; rm -f $OUT/fixed_p*.txt
rm -rf build torch_oss/_C*.so csrc/cuda/generated
python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -40 /tmp/build.log >> $R; exit 1; }
echo "knobs build $(( $(date +%s) - t0 )) s" >> $R
timeout 200 python3 scripts/softmax_variants.py --points bwd:float32:128,fwd:float32:128,bwd:float32:64 --variants "base;20=20" --rounds 7 --size 26 > $OUT/variants_2p26.txt 2>&1
echo "variants 26 rc=$? $(( $(date +%s) - t0 )) s" >> $R
left=$(( 585 - ($(date +%s) - t0) )); [ $left -gt 20 ] && { timeout $left python3 scripts/softmax_variants.py --points bwd:float32:128,fwd:float32:128 --variants "base;20=20" --rounds 5 --size 27 > $OUT/variants_2p27.txt 2>&1; echo "variants 27 rc=$? $(( $(date +%s) - t0 )) s" >> $R; }

# ==== sbin/an4.sh
#!/bin/bash
# session an call 4 (H200): production build from scratch of the tree (the warp tier takes the release window for
# every dtype where memory is fast per SM) beside the self-test's quick mode of the same kernels (sbin/sm_an); the CUDA cases of the softmax test files; bench/softmax.py --rounds 3.
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1 TORCH_OSS_COMMIT="${COMMIT:-b023175}"
R=$OUT/all.txt; t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
rm -rf build torch_oss/_C*.so csrc/cuda/generated
( timeout 150 ./sbin/sm_an quick > /tmp/q.txt 2>&1; echo "sm_an quick rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 /tmp/q.txt)" >> $R; grep -m5 "^FAIL" /tmp/q.txt >> $R ) &
python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -40 /tmp/build.log >> $R; exit 1; }
wait
echo "build $(( $(date +%s) - t0 )) s" >> $R
python3 -c "import torch_oss; print(torch_oss.build_info())" >> $R 2>&1
mkdir -p $OUT/run1
TORCH_OSS_RESULTS=$OUT/run1 timeout 200 python3 bench/softmax.py --rounds 3 > $OUT/bench_run1.log 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s" >> $R
for tk in "tests/test_softmax.py:cuda" "tests/test_errors.py:cuda" "tests/test_patching.py:cuda" "tests/test_concurrency.py:cuda" "tests/test_large.py:softmax" "tests/test_extremes.py:cuda and softmax" "tests/test_determinism.py:cuda and softmax" "tests/test_models.py:cuda"; do
  t=${tk%%:*}; k=${tk#*:}
  left=$(( 590 - ($(date +%s) - t0) )); [ $left -gt 10 ] || { echo "no time for $tk" >> $R; continue; }
  timeout $left python3 -m pytest $t -q -k "$k" -p no:cacheprovider > /tmp/t.txt 2>&1
  echo "$t [$k] rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 /tmp/t.txt)" >> $R
  grep -E "^(FAILED|ERROR)" /tmp/t.txt | head -5 >> $R
done

# ==== sbin/an5.sh
#!/bin/bash
# session an call 5 (H100): production build from scratch of b023175 (on the H100 the plans are those of 6bb0efa:
# sm_fast_memory_per_sm is false there) and the CUDA cases of test_softmax.
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1 TORCH_OSS_COMMIT="${COMMIT:-b023175}"
R=$OUT/all.txt; t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
rm -rf build torch_oss/_C*.so csrc/cuda/generated
timeout 200 python3 -m pip install -v --no-build-isolation --no-deps -e . > /tmp/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -40 /tmp/build.log >> $R; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" >> $R
left=$(( 285 - ($(date +%s) - t0) ))
timeout $left python3 -m pytest tests/test_softmax.py -q -k cuda -p no:cacheprovider > /tmp/t.txt 2>&1
echo "test_softmax [cuda] rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 /tmp/t.txt)" >> $R
grep -E "^(FAILED|ERROR)" /tmp/t.txt | head -5 >> $R

