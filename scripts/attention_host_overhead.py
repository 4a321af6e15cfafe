"""Host-side cost per attention call: the CPU time to enqueue torch_oss.attention
against F.scaled_dot_product_attention in the same process, for small inputs
where the host work (Python, dispatch, autograd, planning, launch) and not the
GPU decides the latency: one decode step (a query row per head against a KV
cache) and a short prefill, forward without grad, and forward + backward.

Method as scripts/softmax_host_overhead.py: back-to-back calls, one sync per
loop, the callables taking turns loop by loop, the fastest loop of each.

    python3 scripts/attention_host_overhead.py [--calls 100] [--reps 15]
"""

import argparse

import torch
import torch.nn.functional as F

import torch_oss
from softmax_host_overhead import per_call_us

# (label, (B, Hq, Hkv, Lq, Lk, D), is_causal)
POINTS = [
    ("decode step, GQA", (1, 32, 8, 1, 4096, 128), False),
    ("short prefill, causal", (2, 8, 8, 128, 128, 64), True),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    print(f"torch_oss from {torch_oss.__file__}")
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}: host us per call (enqueue, fastest of "
          f"{args.reps} interleaved loops of {args.calls}), bfloat16")
    print(f"{'point':24} {'shape (B, Hq, Hkv, Lq, Lk, D)':>32} {'step':8} {'torch_oss':>10} {'SDPA':>10}")
    for label, (B, Hq, Hkv, Lq, Lk, D), causal in POINTS:
        q = torch.randn(B, Hq, Lq, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, Hkv, Lk, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        dout = torch.randn_like(q)
        gqa = Hq != Hkv
        ours = lambda *t: torch_oss.attention(*t, is_causal=causal, enable_gqa=gqa)  # noqa: E731
        sdpa = lambda *t: F.scaled_dot_product_attention(*t, is_causal=causal, enable_gqa=gqa)  # noqa: E731
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]

        def train_step(fn):
            return lambda: torch.autograd.grad(fn(*leaves), leaves, dout)

        steps = {
            "forward": (lambda: ours(q, k, v), lambda: sdpa(q, k, v)),
            "fwd+bwd": (train_step(ours), train_step(sdpa)),
        }
        for step, fns in steps.items():
            t_ours, t_sdpa = per_call_us(list(fns), args.calls, args.reps)
            print(f"{label:24} {str((B, Hq, Hkv, Lq, Lk, D)):>32} {step:8} {t_ours:10.2f} {t_sdpa:10.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
