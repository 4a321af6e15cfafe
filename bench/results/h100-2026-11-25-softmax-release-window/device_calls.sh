### sbin/call_1.sh
#!/usr/bin/env bash
# knob build + self-test quick; L2 residue of a release window (128 MiB inputs); timing of windows at 2^26
set -u
export TORCH_OSS_RESULTS=$OUT
start=$(date +%s)
(timeout 200 ./sbin/sm quick > $OUT/selftest_quick.log 2>&1; echo "selftest rc $?" >> $OUT/selftest_quick.log) &
SELF=$!
TORCH_OSS_SOFTMAX_KNOBS=1 TORCH_OSS_HEAD_DIMS=64 TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps -e . > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - start )) s"; rm -f $OUT/build.log
wait $SELF; tail -2 $OUT/selftest_quick.log; grep -E "^FAIL" $OUT/selftest_quick.log | head
M=lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum
P=fwd:bfloat16:1024,bwd:bfloat16:32768,fwd:bfloat16:65536
V="17=2;base;20=1000000;20=8;20=16;20=32;20=64;20=16,21=1;20=64,21=1"
timeout 200 ncu --profile-from-start off --cache-control none --replay-mode application --metrics $M python3 scripts/softmax_l2_residue.py --mib 128 --points $P --variants "$V" > $OUT/residue_window.txt 2>&1; echo "residue rc $?"
awk '/^(fwd|bwd)/{printf "\n%s", $1} /^  [a-z0-9=,]+$/{printf "\n  %-12s", $1} /op_read.sum/{r=$NF} /lookup_hit.sum/{printf " %s/%s", $NF, r}' $OUT/residue_window.txt; echo
grep -iE "error|Traceback" $OUT/residue_window.txt | head -5
echo "t $(( $(date +%s) - start )) s"
show() { grep -E "^(fwd|bwd).*(\(|plan)|^  |rror" $1 | grep -v resident | sed "s/ chunk_n=.*grid=/ grid=/;s/TJ=0//;s/ G=0//;s/ km=0//;s/ keep=1//;s/ al=1//;s/plan //"; }
run() { # name size rounds points variants
  timeout 250 python3 scripts/softmax_variants.py --rounds $3 --size $2 --points $4 --variants "$5" > $OUT/$1.txt 2>&1; echo "$1 rc $?"
  mv $OUT/softmax_variants.json $OUT/$1.json; show $OUT/$1.txt
  echo "t $(( $(date +%s) - start )) s"
}
P=bwd:bfloat16:32768,bwd:float16:32768,fwd:bfloat16:1024,fwd:float16:1024,fwd:bfloat16:65536,bwd:bfloat16:4096,bwd:float16:4096,fwd:bfloat16:128,fwd:float16:512,fwd:float32:4096
run window_26 26 4 $P "base;20=1000000;17=2;20=16"
echo "total $(( $(date +%s) - start )) s"

### sbin/call_2.sh
#!/usr/bin/env bash
# knob build (release window = L2 size) + self-test quick; L2 residue incl. dim=1; timing base / all / none at 2^26, 2^27 dim1, 2^28
set -u
export TORCH_OSS_RESULTS=$OUT
start=$(date +%s)
(timeout 200 ./sbin/sm quick > $OUT/selftest_quick.log 2>&1; echo "selftest rc $?" >> $OUT/selftest_quick.log) &
SELF=$!
TORCH_OSS_SOFTMAX_KNOBS=1 TORCH_OSS_HEAD_DIMS=64 TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps -e . > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - start )) s"; rm -f $OUT/build.log
wait $SELF; tail -2 $OUT/selftest_quick.log; grep -E "^FAIL" $OUT/selftest_quick.log | head
M=lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum
P=fwd:bfloat16:1024,bwd:bfloat16:128,bwd:bfloat16:32768,fwd:float32:4096,fwd:bfloat16:dim1,bwd:bfloat16:dim1
timeout 200 ncu --profile-from-start off --cache-control none --replay-mode application --metrics $M python3 scripts/softmax_l2_residue.py --mib 128 --points $P --variants "17=2;base;20=1000000" > $OUT/residue_default.txt 2>&1; echo "residue rc $?"
python3 - $OUT/residue_default.txt <<'PY'
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
grep -iE "error|Traceback" $OUT/residue_default.txt | head -5
echo "t $(( $(date +%s) - start )) s"
show() { grep -E "^(fwd|bwd).*(\(|plan|dim)|^  |rror" $1 | grep -v resident | sed "s/ chunk_n=.*grid=/ grid=/;s/TJ=0//;s/ G=0//;s/ km=0//;s/ keep=1//;s/ al=1//;s/plan //"; }
run() { # name size rounds points variants
  timeout 280 python3 scripts/softmax_variants.py --rounds $3 --size $2 --points $4 --variants "$5" > $OUT/$1.txt 2>&1; echo "$1 rc $?"
  mv $OUT/softmax_variants.json $OUT/$1.json; show $OUT/$1.txt | grep -vE "^[^ ]+ (20=|17=)[^ ]*: "
  echo "t $(( $(date +%s) - start )) s"
}
V="base;20=1000000;17=2"
P=bwd:bfloat16:32768,bwd:float16:32768,fwd:bfloat16:1024,fwd:float16:1024,fwd:bfloat16:65536,bwd:bfloat16:4096,bwd:float16:4096,fwd:bfloat16:128,fwd:float16:128,fwd:float16:512,bwd:bfloat16:128,fwd:float32:512,fwd:float32:1024,fwd:float32:4096
run win_26 26 4 $P "$V"
run win_dim1_27 27 4 fwd:float32:dim1,bwd:float32:dim1,fwd:bfloat16:dim1,bwd:bfloat16:dim1 "$V"
run win_28 28 4 bwd:bfloat16:32768,fwd:bfloat16:65536,bwd:bfloat16:4096,fwd:bfloat16:1024,bwd:bfloat16:128 "$V"
echo "total $(( $(date +%s) - start )) s"

### sbin/call_3.sh
#!/usr/bin/env bash
# self-test binaries of four trees and the working tree: fixed-cost timing of the 16-bit backward at 4096 (regression hunt)
set -u
P="bwd:bf16:4096 bwd:f16:4096 bwd:bf16:32768 fwd:bf16:1024 bwd:bf16:2048"
for r in 1 2; do
  for b in 245cb8f pre_de494e1 de494e1 0c57956 sm; do
    bin=./sbin/sm_$b; [ $b = sm ] && bin=./sbin/sm
    echo "== round $r $b"
    FIXED_SIZES=26,28 timeout 60 $bin fixed $P 2>&1 | grep -E "^fixed" | grep -v "^fixed copy" | awk '{printf "%s %s %s | ", $2, $3, $NF} END {print ""}'
  done
done

### sbin/call_4.sh
#!/usr/bin/env bash
# self-test fixed-cost timing at 2^27/2^28: 0c57956 / current (release window) / current + C==1 fast path (v1) / current releasing every row (v3)
set -u
P="bwd:bf16:4096 bwd:f16:4096 bwd:bf16:2048 bwd:bf16:32768 fwd:bf16:1024 fwd:f32:4096 bwd:bf16:128 fwd:bf16:65536"
PN="bwd:bf16:4096:20=100000 bwd:bf16:2048:20=100000"
for r in 1 2 3; do
  for b in 0c57956 sm v1 v3; do
    bin=./sbin/sm_$b; [ $b = sm ] && bin=./sbin/sm
    pts="$P"; [ $b != 0c57956 ] && pts="$P $PN"
    echo "== round $r $b"
    FIXED_SIZES=27,28 timeout 60 $bin fixed $pts 2>&1 | grep -E "^fixed [a-z]" | grep -v "^fixed copy" | awk '{printf "%s %s %s | ", $2, $3, $NF} END {print ""}'
  done
done

### sbin/call_5.sh
#!/usr/bin/env bash
# self-test fixed-cost timing at 2^26..2^28: pre-de494e1 / 0c57956 / 0c57956+struct fields (v7) / window+C==1 fast path (v1) / v1 + rows in grid.y (v5) / v1 + release decision at row start (v6)
set -u
P="bwd:bf16:4096 bwd:f16:4096 bwd:bf16:2048 bwd:bf16:128 fwd:bf16:65536 fwd:f32:4096 bwd:bf16:32768 fwd:bf16:1024"
PN="bwd:bf16:4096:20=100000 bwd:bf16:128:20=100000 fwd:bf16:1024:20=100000"
for r in 1 2 3; do
  for b in pre 0c57956 v7 v1 v5 v6; do
    pts="$P"; case $b in v1|v5|v6) pts="$P $PN";; esac
    echo "== round $r $b"
    FIXED_SIZES=26,27,28 timeout 60 ./sbin/sm_$b fixed $pts 2>&1 | grep -E "^fixed [a-z]" | awk '{printf "%s %s %s | ", $2, $3, $NF} END {print ""}'
  done
done

### sbin/call_6.sh
#!/usr/bin/env bash
# self-test quick on v8 + fixed-cost timing at 2^26..2^28: pre-de494e1 / 0c57956 / v1 / v8 (shifts for divisions, warp tier releases all)
set -u
./sbin/sm_v8 quick 2>&1 | tail -1
P="bwd:bf16:4096 bwd:f16:4096 bwd:bf16:2048 bwd:f32:4096 fwd:f32:4096 fwd:bf16:65536 fwd:bf16:32768 bwd:bf16:32768 fwd:bf16:128 fwd:f16:512 bwd:bf16:128 fwd:f32:512 fwd:f32:1024 fwd:bf16:1024 fwd:bf16:262144 bwd:bf16:262144"
for r in 1 2 3; do
  for b in pre 0c57956 v1 v8; do
    echo "== round $r $b"
    FIXED_SIZES=26,27,28 timeout 90 ./sbin/sm_$b fixed $P 2>&1 | grep -E "^fixed [a-z]" | awk '{printf "%s %s %s | ", $2, $3, $NF} END {print ""}'
  done
done

### sbin/call_7.sh
#!/usr/bin/env bash
# self-test check (final kernels) + knob build + variants vs torch.compile at 2^26 (the points behind in session w's run)
set -u
export TORCH_OSS_RESULTS=$OUT
start=$(date +%s)
(timeout 330 ./sbin/sm check > $OUT/selftest_check.log 2>&1; echo "selftest rc $?" >> $OUT/selftest_check.log) &
SELF=$!
TORCH_OSS_SOFTMAX_KNOBS=1 TORCH_OSS_HEAD_DIMS=64 TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps -e . > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - start )) s"; rm -f $OUT/build.log
show() { grep -E "^(fwd|bwd).*(\(|dim)|^  |rror" $1; }
run() { # name size rounds points variants
  timeout 280 python3 scripts/softmax_variants.py --rounds $3 --size $2 --points $4 --variants "$5" > $OUT/$1.txt 2>&1; echo "$1 rc $?"
  mv $OUT/softmax_variants.json $OUT/$1.json; show $OUT/$1.txt | grep -vE "^[^ ]+ [^ ]+: (plan|fwd|bwd)"
  echo "t $(( $(date +%s) - start )) s"
}
P=bwd:bfloat16:32768,bwd:float16:32768,bwd:bfloat16:4096,bwd:float16:4096,fwd:bfloat16:128,fwd:float16:128,fwd:float16:512,fwd:float32:512,fwd:float32:1024,fwd:float32:4096,fwd:bfloat16:1024,fwd:float16:1024,bwd:bfloat16:128,fwd:bfloat16:65536
run final_26 26 5 $P "base;20=1000000"
wait $SELF
tail -2 $OUT/selftest_check.log; grep -E "^FAIL" $OUT/selftest_check.log | head
echo "total $(( $(date +%s) - start )) s"

### sbin/call_8.sh
#!/usr/bin/env bash
# production build from scratch + CUDA pytest (softmax, errors, patching, extremes) + memcheck quick + racecheck race + test_large softmax
set -u
export TORCH_OSS_RESULTS=$OUT
start=$(date +%s)
bash scripts/gpu_check.sh build > $OUT/gpu_build.txt 2>&1; tail -6 $OUT/gpu_build.txt
echo "t $(( $(date +%s) - start )) s"
(compute-sanitizer --tool memcheck ./sbin/sm quick > $OUT/memcheck_quick.txt 2>&1; compute-sanitizer --tool racecheck ./sbin/sm race > $OUT/racecheck_race.txt 2>&1) &
SAN=$!
TESTS="tests/test_softmax.py tests/test_errors.py tests/test_patching.py tests/test_extremes.py" PYTEST_ARGS="-k cuda" TEST_JOBS=4 FILE_TIMEOUT=200 STAGE_TIMEOUT=250 bash scripts/gpu_check.sh test > $OUT/gpu_test.txt 2>&1; tail -12 $OUT/gpu_test.txt
echo "t $(( $(date +%s) - start )) s"
wait $SAN
tail -3 $OUT/memcheck_quick.txt; tail -3 $OUT/racecheck_race.txt
timeout 120 python3 -m pytest -q tests/test_large.py -k softmax > $OUT/test_large_softmax.txt 2>&1; tail -3 $OUT/test_large_softmax.txt
echo "total $(( $(date +%s) - start )) s"

### sbin/call_11.sh
#!/usr/bin/env bash
# fixed-cost timing, 0c57956 against the final kernels (9aa64c5): the 16-bit forward at 1M columns (clusters of 16) and the 16-bit backward at 32768
set -u
P="fwd:bf16:1048576 fwd:f16:1048576 fwd:f32:1048576 bwd:bf16:1048576 bwd:bf16:32768 bwd:f16:32768"
for r in 1 2 3 4; do
  for b in 0c57956 final; do
    bin=./sbin/sm_$b; [ $b = final ] && bin=./sbin/sm
    echo "== round $r $b"
    FIXED_SIZES=26,27,28 timeout 90 $bin fixed $P 2>&1 | grep -E "^fixed [a-z]" | awk '{printf "%s %s %s | ", $2, $3, $NF} END {print ""}'
  done
done

### sbin/call_12.sh
#!/usr/bin/env bash
# fixed-cost timing: 0c57956 / final (9aa64c5) / v9 (the release fields at the end of sm_row_args)
set -u
P="fwd:bf16:1048576 fwd:f16:1048576 bwd:bf16:4096 bwd:f16:4096 bwd:bf16:2048 fwd:bf16:65536 bwd:bf16:32768 fwd:bf16:128 bwd:bf16:128 fwd:f32:4096 fwd:bf16:262144 bwd:f32:4096"
for r in 1 2 3; do
  for b in 0c57956 final v9; do
    bin=./sbin/sm_$b; [ $b = final ] && bin=./sbin/sm
    echo "== round $r $b"
    FIXED_SIZES=26,27,28 timeout 90 $bin fixed $P 2>&1 | grep -E "^fixed [a-z]" | awk '{printf "%s %s %s | ", $2, $3, $NF} END {print ""}'
  done
done

### sbin/call_13.sh
#!/usr/bin/env bash
# fixed-cost timing: 0c57956 / final / v12 (chunk kernel releases every row: no row test) / v13 (sm_smem_mid divides again)
set -u
P="fwd:bf16:1048576 fwd:f16:1048576 bwd:bf16:4096 fwd:bf16:262144 bwd:bf16:1048576"
for r in 1 2 3; do
  for b in 0c57956 final v12 v13; do
    bin=./sbin/sm_$b; [ $b = final ] && bin=./sbin/sm
    echo "== round $r $b"
    FIXED_SIZES=27,28 timeout 90 $bin fixed $P 2>&1 | grep -E "^fixed [a-z]" | awk '{printf "%s %s %s | ", $2, $3, $NF} END {print ""}'
  done
done

### call 9 (inline; production build of 9aa64c5 left by call_8.sh on the same machine)
export TORCH_OSS_RESULTS=$OUT; python3 -c "import torch_oss; print(torch_oss.build_info())" && timeout 330 python3 bench/softmax.py --rounds 3 > $OUT/bench_softmax_rounds3.log 2>&1

### call 10 (inline, same machine)
export TORCH_OSS_RESULTS=$OUT/r2; mkdir -p $OUT/r2; timeout 250 python3 bench/softmax.py --rounds 5 --cols 128,1024,4096,32768,1048576 > $OUT/bench_softmax_rounds5_subset.log 2>&1

### call 15 (inline; self-test binary with the window cases in its quick suite)
(time compute-sanitizer --tool memcheck ./sbin/sm quick) > $OUT/memcheck_quick_window.txt 2>&1; ./sbin/sm quick
### sbin/call_16.sh
#!/usr/bin/env bash
# fixed-cost timing, 5 rounds: 0c57956 / final (9aa64c5 kernels) / v13 (sm_smem_mid divides again)
set -u
P="fwd:bf16:1048576 fwd:f16:1048576 fwd:f32:1048576 bwd:bf16:1048576 fwd:bf16:262144 bwd:bf16:4096 bwd:f16:4096 fwd:bf16:65536 fwd:bf16:32768"
for r in 1 2 3 4 5; do
  for b in 0c57956 final v13; do
    bin=./sbin/sm_$b; [ $b = final ] && bin=./sbin/sm
    echo "== round $r $b"
    FIXED_SIZES=26,27,28 timeout 90 $bin fixed $P 2>&1 | grep -E "^fixed [a-z]" | awk '{printf "%s %s %s | ", $2, $3, $NF} END {print ""}'
  done
done

### sbin/call_17.sh
#!/usr/bin/env bash
# fixed-cost timing, 4 rounds: 0c57956 / final; the wide rows with the general kernels forced (knob 16 = 1)
set -u
P="fwd:bf16:1048576 fwd:bf16:1048576:16=1 fwd:f16:1048576 fwd:f16:1048576:16=1 fwd:f32:1048576 fwd:f32:1048576:16=1 bwd:bf16:1048576 bwd:bf16:1048576:16=1 fwd:bf16:262144 fwd:bf16:262144:16=1 fwd:bf16:131072 fwd:bf16:131072:16=1"
./sbin/sm fixed fwd:bf16:1048576 bwd:bf16:1048576 fwd:bf16:262144 fwd:bf16:131072 2>&1 | grep -E "^plan" | head -8
for r in 1 2 3 4; do
  for b in 0c57956 final; do
    bin=./sbin/sm_$b; [ $b = final ] && bin=./sbin/sm
    echo "== round $r $b"
    FIXED_SIZES=27,28 timeout 90 $bin fixed $P 2>&1 | grep -E "^fixed [a-z]" | awk '{printf "%s %s %s | ", $2, $3, $NF} END {print ""}'
  done
done

### sbin/call_18.sh
#!/usr/bin/env bash
# fixed-cost timing, 4 rounds, 2x2: A = 0c57956, B = 0c57956 + the shifts only, C = the first window build (no shifts), D = final (9aa64c5 kernels)
set -u
P="fwd:bf16:1048576 fwd:f16:1048576 bwd:bf16:1048576 bwd:bf16:4096 bwd:bf16:2048 fwd:bf16:65536 bwd:bf16:128"
for r in 1 2 3 4; do
  for b in 0c57956 B C final; do
    bin=./sbin/sm_$b; [ $b = final ] && bin=./sbin/sm
    echo "== round $r $b"
    FIXED_SIZES=27,28 timeout 90 $bin fixed $P 2>&1 | grep -E "^fixed [a-z]" | awk '{printf "%s %s %s | ", $2, $3, $NF} END {print ""}'
  done
done

### sbin/call_19.sh
#!/usr/bin/env bash
# production build from scratch + bench/softmax.py --rounds 3 (medians and trimmed means)
set -u
export TORCH_OSS_RESULTS=$OUT
start=$(date +%s)
bash scripts/gpu_check.sh build > $OUT/gpu_build.txt 2>&1; grep -E "build: |build took" $OUT/gpu_build.txt
timeout 400 python3 bench/softmax.py --rounds 3 > $OUT/bench_softmax_rounds3_stats.log 2>&1; echo "bench rc $?"
grep -vE "UserWarning|Online softmax|split the reduction|important use case|softmax\.$|warnings.warn|^$" $OUT/bench_softmax_rounds3_stats.log | grep -A80 "dim=1 runs at" | head -60
echo "total $(( $(date +%s) - start )) s"

### sbin/call_20.sh
#!/usr/bin/env bash
# fixed-cost timing, 3 rounds: 0c57956 / final (9aa64c5) / X (one-CTA instantiation apart; others without release code) / Y (X + divisions in the others)
set -u
./sbin/sm_X fixed bwd:f32:262144 bwd:bf16:262144 2>&1 | grep -E "^plan" | grep -v resident
P="fwd:bf16:1048576 fwd:f16:1048576 bwd:bf16:1048576 bwd:f32:262144 bwd:bf16:262144 fwd:f32:1048576 bwd:bf16:4096 fwd:bf16:65536 bwd:f16:32768 fwd:bf16:262144"
for r in 1 2 3; do
  for b in 0c57956 final X Y; do
    bin=./sbin/sm_$b; [ $b = final ] && bin=./sbin/sm
    echo "== round $r $b"
    FIXED_SIZES=27,28 timeout 90 $bin fixed $P 2>&1 | grep -E "^fixed [a-z]" | awk '{printf "%s %s %s | ", $2, $3, $NF} END {print ""}'
  done
done

### sbin/call_21.sh
#!/usr/bin/env bash
# knob build of 127463b + scripts/softmax_variants.py (validates its bench_stats refactor): 16-bit forward at 1M, planner variants
set -u
export TORCH_OSS_RESULTS=$OUT
start=$(date +%s)
TORCH_OSS_SOFTMAX_KNOBS=1 TORCH_OSS_HEAD_DIMS=64 TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps -e . > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - start )) s"; rm -f $OUT/build.log
timeout 300 python3 scripts/softmax_variants.py --rounds 4 --size 26 --points fwd:bfloat16:1048576,fwd:float16:1048576 --variants "base;11=4;11=6;0=3,1=1" > $OUT/fwd1m_variants_26.txt 2>&1; echo "rc $?"
grep -E "^(fwd|bwd).*(\(|dim|plan)|^  |rror" $OUT/fwd1m_variants_26.txt | grep -v resident
echo "total $(( $(date +%s) - start )) s"
### sbin/call_22.sh
#!/usr/bin/env bash
# fixed-cost timing, 4 rounds: 0c57956 / final / W (one release_from field instead of release_lo/hi)
set -u
P="fwd:bf16:1048576 fwd:f16:1048576 bwd:bf16:1048576 bwd:bf16:4096 bwd:f16:4096 fwd:bf16:65536 bwd:f32:262144 bwd:bf16:32768"
for r in 1 2 3 4; do
  for b in 0c57956 final W; do
    bin=./sbin/sm_$b; [ $b = final ] && bin=./sbin/sm
    echo "== round $r $b"
    FIXED_SIZES=27,28 timeout 90 $bin fixed $P 2>&1 | grep -E "^fixed [a-z]" | awk '{printf "%s %s %s | ", $2, $3, $NF} END {print ""}'
  done
done
