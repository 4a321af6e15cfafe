"""Compares the attention kernel families on the GPU: for a few shapes, the
output, lse and the three gradients of the default kernels (the Hopper wgmma
ones on an H100) and of the mma.sync ones (TORCH_OSS_ATTENTION_FORWARD=mma,
TORCH_OSS_ATTENTION_BACKWARD=mma), each as its largest error against a float64
reference, scaled by the reference's largest magnitude. A quick diagnostic
while writing a kernel (which gradient is off, and where); the tests hold the
kernels to the tolerance rule.

    python3 scripts/compare_kernel_families.py
"""

import os

import torch

import torch_oss

SHAPES = [  # B, Hq, Hkv, Lq, Lk, D, causal
    (1, 2, 2, 128, 128, 64, False),
    (1, 2, 2, 128, 128, 128, False),
    (2, 4, 2, 300, 520, 64, False),
    (2, 4, 2, 300, 520, 64, True),
    (1, 2, 1, 257, 1000, 128, True),
    (1, 2, 2, 1, 77, 128, False),
]


def run(q, k, v, dout, causal, family):
    for var in ("TORCH_OSS_ATTENTION_FORWARD", "TORCH_OSS_ATTENTION_BACKWARD"):
        if family == "mma":
            os.environ[var] = "mma"
        else:
            os.environ.pop(var, None)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out, lse = torch_oss.attention_with_lse(*leaves, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
    out.backward(dout)
    return [out, lse] + [t.grad for t in leaves]


def main():
    torch.manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):
        for B, Hq, Hkv, Lq, Lk, D, causal in SHAPES:
            q = torch.randn(B, Hq, Lq, D, device="cuda", dtype=dtype)
            k = torch.randn(B, Hkv, Lk, D, device="cuda", dtype=dtype)
            v = torch.randn(B, Hkv, Lk, D, device="cuda", dtype=dtype)
            dout = torch.randn(B, Hq, Lq, D, device="cuda", dtype=dtype)
            ref = run(q.double(), k.double(), v.double(), dout.double(), causal, "default")
            line = f"{str(dtype):15} {(B, Hq, Hkv, Lq, Lk, D)} causal={causal!s:5}"
            for family in ("default", "mma"):
                got = run(q, k, v, dout, causal, family)
                errs = []
                for name, g, r in zip(("out", "lse", "dq", "dk", "dv"), got, ref):
                    finite = torch.isfinite(r)
                    scale = r[finite].abs().max().clamp_min(1e-6)
                    err = ((g.double() - r).abs()[finite].max() / scale).item()
                    errs.append(f"{name} {err:.1e}")
                line += f" | {family}: " + " ".join(errs)
            print(line, flush=True)


if __name__ == "__main__":
    main()
