"""One attention forward shape, launched a few times, for a profiler:
    ncu --kernel-name regex:attn_fwd --launch-skip 2 --launch-count 1 python scripts/profile_attention.py 128 16384
Arguments: head dim (default 128), seqlen (default 16384), 'causal' to make it causal."""
import sys

import torch

import torch_oss

D = int(sys.argv[1]) if len(sys.argv) > 1 else 128
N = int(sys.argv[2]) if len(sys.argv) > 2 else 16384
causal = "causal" in sys.argv[3:]
H, B = 2048 // D, max(1, 16384 // N)
q, k, v = (torch.randn(B, H, N, D, dtype=torch.bfloat16, device="cuda") for _ in range(3))
for _ in range(4):
    out = torch_oss.attention(q, k, v, is_causal=causal)
torch.cuda.synchronize()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
for _ in range(10):
    torch_oss.attention(q, k, v, is_causal=causal)
end.record()
torch.cuda.synchronize()
ms = start.elapsed_time(end) / 10
print(f"hd{D} N{N} causal={causal}: {ms:.3f} ms, {4 * B * H * N * N * D / (2 if causal else 1) / ms / 1e9:.0f} TFLOP/s")
