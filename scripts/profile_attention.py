"""One attention shape, launched a few times, for a profiler or a quick timing:
    ncu --kernel-name regex:attn_fwd --launch-skip 2 --launch-count 1 python scripts/profile_attention.py 128 16384
    ncu --kernel-name regex:attn_bwd_sm90 --launch-skip 2 --launch-count 1 python scripts/profile_attention.py 128 8192 backward
Arguments: head dim (default 128), seqlen (default 16384), 'causal' to make it causal,
'backward' to time the backward (the forward runs once) instead of the forward."""
import sys

import torch

import torch_oss

D = int(sys.argv[1]) if len(sys.argv) > 1 else 128
N = int(sys.argv[2]) if len(sys.argv) > 2 else 16384
causal = "causal" in sys.argv[3:]
backward = "backward" in sys.argv[3:]
H, B = 2048 // D, max(1, 16384 // N)
q, k, v = (torch.randn(B, H, N, D, dtype=torch.bfloat16, device="cuda", requires_grad=backward) for _ in range(3))
if backward:
    out = torch_oss.attention(q, k, v, is_causal=causal)
    dout = torch.randn_like(out)

    def step():
        out.backward(dout, retain_graph=True)
else:
    def step():
        torch_oss.attention(q, k, v, is_causal=causal)
for _ in range(4):
    step()
torch.cuda.synchronize()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
for _ in range(10):
    step()
end.record()
torch.cuda.synchronize()
ms = start.elapsed_time(end) / 10
flops = 4 * B * H * N * N * D / (2 if causal else 1) * (2.5 if backward else 1.0)
print(f"hd{D} N{N} causal={causal} {'backward' if backward else 'forward'}: {ms:.3f} ms, {flops / ms / 1e9:.0f} TFLOP/s")
