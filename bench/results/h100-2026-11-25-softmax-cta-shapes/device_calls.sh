#!/bin/bash
# session ab call 1: knob build; CTA shapes for the narrow forward (Triton-like: one slot per thread) and the 16-bit backward at 32768
export TORCH_OSS_RESULTS=$OUT TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_SOFTMAX_KNOBS=1 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1
R=$OUT/all.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $R
t0=$(date +%s)
rm -rf build torch_oss/_C*.so csrc/cuda/generated
python3 -m pip install -v --no-build-isolation --no-deps -e . > $OUT/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 $OUT/build.log >> $R; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" >> $R
timeout 200 python3 scripts/softmax_variants.py --points fwd:bfloat16:1024,fwd:float16:1024,fwd:float16:512,fwd:float32:1024,fwd:bfloat16:128 \
  --variants "base;0=2,11=1;0=2,11=2;5=4" --rounds 3 >> $R 2>&1
echo "warp points done $(( $(date +%s) - t0 )) s" >> $R
timeout 130 python3 scripts/softmax_variants.py --points fwd:bfloat16:4096,fwd:float16:4096,fwd:float32:4096 \
  --variants "base;11=1;11=2;11=4" --rounds 3 >> $R 2>&1
echo "cta points done $(( $(date +%s) - t0 )) s" >> $R
timeout $(( 585 - ($(date +%s) - t0) )) python3 scripts/softmax_variants.py --points bwd:bfloat16:32768,bwd:float16:32768 \
  --variants "base;19=1;11=2;0=3;17=2" --rounds 3 >> $R 2>&1
echo "bwd done $(( $(date +%s) - t0 )) s" >> $R
#!/bin/bash
# session ab call 2: the light warp kernel (4 slots per lane, 32 lanes) for 16-bit forward rows of 65-128 slots
export TORCH_OSS_RESULTS=$OUT TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_SOFTMAX_KNOBS=1 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1
R=$OUT/all.txt
t0=$(date +%s)
if ! python3 -c "import torch_oss" 2>/dev/null; then
  rm -rf build torch_oss/_C*.so csrc/cuda/generated
  python3 -m pip install -v --no-build-isolation --no-deps -e . > $OUT/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 $OUT/build.log >> $R; exit 1; }
fi
echo "build $(( $(date +%s) - t0 )) s" >> $R
timeout 240 python3 scripts/softmax_variants.py --points fwd:bfloat16:520,fwd:bfloat16:640,fwd:bfloat16:768,fwd:bfloat16:896,fwd:bfloat16:1024,fwd:float16:768,fwd:float16:1024 \
  --variants "base;5=4" --rounds 5 >> $R 2>&1
echo "2^26 done $(( $(date +%s) - t0 )) s" >> $R
timeout 100 python3 scripts/softmax_variants.py --size 28 --points fwd:bfloat16:1024,fwd:float16:1024,fwd:bfloat16:768 \
  --variants "base;5=4" --rounds 3 >> $R 2>&1
echo "2^28 done $(( $(date +%s) - t0 )) s" >> $R
timeout $(( 585 - ($(date +%s) - t0) )) python3 scripts/softmax_variants.py --points fwd:bfloat16:1024,fwd:float16:1024 \
  --variants "base;5=4" --flush clean,none --rounds 3 >> $R 2>&1
echo "flush done $(( $(date +%s) - t0 )) s" >> $R
#!/bin/bash
# session ab call 3: minimal kernels for the bfloat16 backward at 32768 columns: one pass (row in registers) against two passes like Inductor's
export TORCH_OSS_RESULTS=$OUT TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1
R=$OUT/all.txt
t0=$(date +%s)
rm -rf build torch_oss/_C*.so csrc/cuda/generated
python3 -m pip install -v --no-build-isolation --no-deps -e . > $OUT/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 $OUT/build.log >> $R; exit 1; }
mkdir -p build && nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Xcompiler -fPIC -shared scripts/softmax_probe_kernels.cu -o build/libsoftmax_probe.so >> $R 2>&1
echo "build $(( $(date +%s) - t0 )) s" >> $R
timeout $(( 585 - ($(date +%s) - t0) )) python3 scripts/softmax_probe.py --bwd 40,41,42,43,44,45,46 --bwd-cols 32768 --fwd "" --sizes 26,28 --rounds 2 >> $R 2>&1
echo "probe done $(( $(date +%s) - t0 )) s" >> $R
#!/bin/bash
# session ab call 4: persistent clusters at the 16-bit 1M forward with fewer clusters than fit (test knob 10: 7, 8, 14 clusters looping over rows)
export TORCH_OSS_RESULTS=$OUT TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TORCH_OSS_SOFTMAX_KNOBS=1 TORCH_OSS_HEAD_DIMS=64 PYTHONUNBUFFERED=1
R=$OUT/all.txt
t0=$(date +%s)
rm -rf build torch_oss/_C*.so csrc/cuda/generated
python3 -m pip install -v --no-build-isolation --no-deps -e . > $OUT/build.log 2>&1 || { echo BUILD FAILED >> $R; tail -50 $OUT/build.log >> $R; exit 1; }
echo "build $(( $(date +%s) - t0 )) s" >> $R
timeout 200 python3 scripts/softmax_variants.py --points fwd:bfloat16:1048576,fwd:float16:1048576 \
  --variants "base;10=8;10=14;10=7;10=4" --rounds 5 --no-compile >> $R 2>&1
echo "2^26 done $(( $(date +%s) - t0 )) s" >> $R
timeout $(( 585 - ($(date +%s) - t0) )) python3 scripts/softmax_variants.py --size 28 --points fwd:bfloat16:1048576 \
  --variants "base;10=8;10=14" --rounds 3 --no-compile >> $R 2>&1
echo "2^28 done $(( $(date +%s) - t0 )) s" >> $R
