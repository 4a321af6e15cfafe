### sbin/call_w1.sh
#!/usr/bin/env bash
set -u
export TORCH_OSS_RESULTS=$OUT
start=$(date +%s)
TORCH_OSS_SOFTMAX_KNOBS=1 TORCH_OSS_HEAD_DIMS=64 TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps -e . > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - start )) s"; rm -f $OUT/build.log
P=fwd:bfloat16:128,bwd:bfloat16:128,bwd:bfloat16:32768,fwd:bfloat16:65536
V="17=1;base;17=2;17=3;17=4;17=5"
timeout 120 python3 scripts/softmax_l2_residue.py --points $P --variants "$V" > $OUT/residue.txt 2>&1; echo "residue rc $?"
cat $OUT/residue.txt
echo "t $(( $(date +%s) - start )) s"
M=gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum
timeout 150 ncu --profile-from-start off --cache-control none --replay-mode application --metrics $M python3 scripts/softmax_l2_residue.py --profile reread --points fwd:bfloat16:128,bwd:bfloat16:32768 --variants "$V" > $OUT/ncu_reread.txt 2>&1; echo "ncu reread rc $?"
grep -E "^(fwd|bwd)|^  [a-z]+ |Context|gpu__time|dram__bytes|lts__" $OUT/ncu_reread.txt | grep -v "==PROF==" | sed 's/(.*Context.*//' | head -120
echo "t $(( $(date +%s) - start )) s"
M2=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_srcunit_ltcfabric.sum,lts__t_sectors_srcunit_tex.sum,lts__t_requests_srcunit_tex.sum
timeout 150 ncu --profile-from-start off --cache-control all --metrics $M2 python3 scripts/softmax_l2_residue.py --profile softmax --mib 128 --points fwd:bfloat16:128,bwd:bfloat16:128,bwd:bfloat16:32768 --variants "$V" > $OUT/ncu_softmax.txt 2>&1; echo "ncu softmax rc $?"
grep -E "^(fwd|bwd)|Context|gpu__time|dram__bytes|lts__" $OUT/ncu_softmax.txt | grep -v "==PROF==" | sed 's/(.*Context.*//' | head -120
echo "total $(( $(date +%s) - start )) s"

### sbin/call_w2.sh
#!/usr/bin/env bash
set -u
export TORCH_OSS_RESULTS=$OUT
start=$(date +%s)
TORCH_OSS_SOFTMAX_KNOBS=1 TORCH_OSS_HEAD_DIMS=64 TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps -e . > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - start )) s"; rm -f $OUT/build.log
M=dram__bytes_read.sum,lts__t_sector_hit_rate.pct,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum
timeout 130 ncu --profile-from-start off --cache-control none --replay-mode application --metrics $M python3 scripts/softmax_l2_residue.py --compile --profile reread --points bwd:bfloat16:128,bwd:bfloat16:32768,fwd:bfloat16:65536 --variants "17=1;base;17=2" > $OUT/ncu_reread_compile.txt 2>&1; echo "ncu reread rc $?"
awk '/^(fwd|bwd)/{print} /^  [a-z0-9=]+ +[0-9]/{print} /^  void|^  triton/{n++; printf "k%d ", n-1} /lookup_hit.sum/{print $NF}' $OUT/ncu_reread_compile.txt | head -80
echo "t $(( $(date +%s) - start )) s"
P=bwd:bfloat16:128,bwd:float16:128,bwd:float32:128,bwd:bfloat16:512,bwd:bfloat16:1024
for s in 26 28; do
  timeout 170 python3 scripts/softmax_variants.py --rounds 5 --size $s --points $P --variants "base;16=2;5=2,16=2" 2>&1 | grep -v "^plan .*resident" > $OUT/light_$s.txt
  mv $OUT/softmax_variants.json $OUT/light_$s.json
  echo "size $s $(( $(date +%s) - start )) s"
done
for f in $OUT/light_*.txt; do echo "== $f"; grep -E "^(fwd|bwd).*(\(|plan)|^  |rror" $f | sed "s/ chunk_n=.*//;s/TJ=0//;s/smem_slots=0 S=0//"; done
echo "total $(( $(date +%s) - start )) s"

### sbin/call_w3.sh
#!/usr/bin/env bash
set -u
export TORCH_OSS_RESULTS=$OUT
start=$(date +%s)
TORCH_OSS_SOFTMAX_KNOBS=1 TORCH_OSS_HEAD_DIMS=64 TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps -e . > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - start )) s"; rm -f $OUT/build.log
M=lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum
P=fwd:bfloat16:128,fwd:bfloat16:65536,bwd:bfloat16:128,bwd:bfloat16:4096,bwd:bfloat16:32768
run() { # name, args...
  local n=$1; shift
  timeout 150 ncu --profile-from-start off --cache-control none --replay-mode application --metrics $M python3 scripts/softmax_l2_residue.py --compile --points $P "$@" > $OUT/$n.txt 2>&1; echo "$n rc $?"
  awk '/^(fwd|bwd)/{printf "\n%s", $1} /^  [a-z0-9=]+$/{printf "\n  %-8s", $1} /op_read.sum/{r=$NF} /lookup_hit.sum/{printf " %s/%s", $NF, r}' $OUT/$n.txt; echo
  echo "t $(( $(date +%s) - start )) s"
}
run reread_output_64 --reread output --stream 0 --mib 64
run reread_output_16 --reread output --stream 0 --mib 16
run reread_input_stream1 --reread input --stream 1 --mib 16
echo "total $(( $(date +%s) - start )) s"

### sbin/call_w4.sh
#!/usr/bin/env bash
set -u
export TORCH_OSS_RESULTS=$OUT
start=$(date +%s)
TORCH_OSS_SOFTMAX_KNOBS=1 TORCH_OSS_HEAD_DIMS=64 TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps -e . > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - start )) s"; rm -f $OUT/build.log
P=bwd:bfloat16:128,bwd:float16:128
V="base;17=2;5=2,16=2;5=2,16=2,17=2"
for cfg in "26 256" "28 256" "28 4096"; do
  set -- $cfg
  OSS_WARP_GRID_CAP=$2 timeout 150 python3 scripts/softmax_variants.py --rounds 5 --size $1 --points $P --variants "$V" 2>&1 | grep -v "^plan .*resident" > $OUT/lightcap_$1_$2.txt
  mv $OUT/softmax_variants.json $OUT/lightcap_$1_$2.json
  echo "== size $1 cap $2 $(( $(date +%s) - start )) s"
  grep -E "^(fwd|bwd).*(\(|plan)|^  |rror" $OUT/lightcap_$1_$2.txt | sed "s/ chunk_n=.*//;s/TJ=0//;s/smem_slots=0 S=0//"
done
echo "total $(( $(date +%s) - start )) s"

### sbin/call_w5.sh
#!/usr/bin/env bash
set -u
export TORCH_OSS_RESULTS=$OUT
start=$(date +%s)
TORCH_OSS_SOFTMAX_KNOBS=1 TORCH_OSS_HEAD_DIMS=64 TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps -e . > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - start )) s"; rm -f $OUT/build.log
P=fwd:bfloat16:128,fwd:float16:128,fwd:float32:128,fwd:bfloat16:1024,fwd:float32:1024,bwd:bfloat16:128,bwd:float16:128,bwd:float32:128,bwd:bfloat16:512,bwd:float32:256,bwd:bfloat16:1024
for cap in 256 1000000; do
  OSS_WARP_GRID_CAP=$cap timeout 200 python3 scripts/softmax_variants.py --rounds 5 --size 28 --points $P --variants "base;5=2,16=2" 2>&1 | grep -v "^plan .*resident" > $OUT/cap_28_$cap.txt
  mv $OUT/softmax_variants.json $OUT/cap_28_$cap.json
  echo "== cap $cap $(( $(date +%s) - start )) s"
  grep -E "^(fwd|bwd).*(\(|plan)|^  |rror" $OUT/cap_28_$cap.txt | sed "s/ chunk_n=.*//;s/TJ=0//;s/smem_slots=0 S=0//"
done
echo "total $(( $(date +%s) - start )) s"

### sbin/call_x1.sh
#!/usr/bin/env bash
set -u
export TORCH_OSS_RESULTS=$OUT
start=$(date +%s)
bash scripts/gpu_check.sh build > $OUT/build_summary.txt 2>&1 &
timeout 250 ./sbin/sm check > $OUT/selftest_check.log 2>&1; echo "check rc $?"; tail -1 $OUT/selftest_check.log
grep -iE "fail|mismatch" $OUT/selftest_check.log | head -5
wait; grep -E "took|build:|rror" $OUT/build_summary.txt | head -5
echo "t $(( $(date +%s) - start )) s"
TESTS="tests/test_softmax.py tests/test_errors.py tests/test_patching.py tests/test_extremes.py" PYTEST_ARGS="-k cuda" TEST_JOBS=4 FILE_TIMEOUT=200 STAGE_TIMEOUT=250 bash scripts/gpu_check.sh test > $OUT/test_summary.txt 2>&1; echo "test rc $?"
grep -E "passed|failed|error" $OUT/test_summary.txt | tail -8
echo "t $(( $(date +%s) - start )) s"
timeout 90 compute-sanitizer --tool memcheck ./sbin/sm quick > $OUT/memcheck_quick.txt 2>&1; echo "memcheck quick rc $?"; tail -2 $OUT/memcheck_quick.txt
timeout 60 compute-sanitizer --tool racecheck ./sbin/sm race > $OUT/racecheck_race.txt 2>&1; echo "racecheck race rc $?"; tail -2 $OUT/racecheck_race.txt
rm -f $OUT/build.log
echo "total $(( $(date +%s) - start )) s"

### sbin/call_x2.sh
#!/usr/bin/env bash
set -u
export TORCH_OSS_RESULTS=$OUT
start=$(date +%s)
python3 -c "import torch, torch_oss; x=torch.randn(4,128,device='cuda'); torch_oss.softmax(x,-1)" 2>/dev/null || { bash scripts/gpu_check.sh build 2>&1 | grep -E "took|build:" | head -2; }
echo "t $(( $(date +%s) - start )) s"
timeout 260 python3 bench/softmax.py --rounds 3 > $OUT/bench_softmax_rounds3.log 2>&1; echo "bench rc $?"
grep -vE "Warn|warn" $OUT/bench_softmax_rounds3.log | tail -75
echo "t $(( $(date +%s) - start )) s"
mkdir -p $OUT/b28; TORCH_OSS_RESULTS=$OUT/b28 timeout 200 python3 bench/softmax.py --rounds 3 --total 268435456 --cols 128,512,1024 > $OUT/bench_softmax_2e28_narrow.log 2>&1; echo "bench28 rc $?"
grep -vE "Warn|warn" $OUT/bench_softmax_2e28_narrow.log | tail -30
echo "total $(( $(date +%s) - start )) s"

### sbin/call_x3.sh
#!/usr/bin/env bash
set -u
export TORCH_OSS_RESULTS=$OUT
start=$(date +%s)
TORCH_OSS_SOFTMAX_KNOBS=1 TORCH_OSS_HEAD_DIMS=64 TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps -e . > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - start )) s"; rm -f $OUT/build.log
P=fwd:bfloat16:512,fwd:bfloat16:1024,fwd:float16:1024,bwd:bfloat16:4096,bwd:bfloat16:32768,bwd:float16:32768
for s in 26 28; do
  timeout 110 python3 scripts/softmax_variants.py --rounds 5 --size $s --points $P --variants "base;17=2" 2>&1 | grep -v "^plan .*resident" > $OUT/final_$s.txt
  mv $OUT/softmax_variants.json $OUT/final_$s.json 2>/dev/null
  echo "size $s $(( $(date +%s) - start )) s"
done
for f in $OUT/final_*.txt; do echo "== $f"; grep -E "^(fwd|bwd).*\(|^  |rror" $f; done
echo "total $(( $(date +%s) - start )) s"

