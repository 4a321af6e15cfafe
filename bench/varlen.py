"""Variable-length batches: torch_oss.attention_varlen on a packed batch of
sequences of mixed lengths, against the same work done on a padded batch, in
the same run.

Shape: 64 sequences whose lengths are drawn log-uniformly from 128 to 8192
(seeded), width 2048 (head dim 64 x 32 heads and 128 x 16), causal, bf16.
Peers, each timed forward and forward+backward:
  - ``dense``: torch_oss.attention on a dense batch at the longest length
    (batch = the packed tokens / that length, at least 1): the kernels'
    speed where no sequence is short; the varlen target is >= 0.95x its TFLOP/s;
  - ``padded``: torch_oss.attention on the padded (64, H, longest, D) batch;
  - ``sdpa``: F.scaled_dot_product_attention (default backend) on the same
    padded batch with is_causal and no padding mask (the fastest SDPA can do
    there; its padding rows are wasted work).
TFLOP/s count only the real tokens' causal work (4 * pairs * head dim per
head forward, 3.5x that forward+backward), the padded peers included, so a
ratio is a ratio of times for the same useful work. Outputs are checked
against the padded batch's real rows before timing.

    python bench/varlen.py              # GPU
    python bench/varlen.py --smoke      # tiny shapes, CPU or GPU (what a run without a GPU does)
"""

import argparse
import math
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, __import__("os").path.dirname(__file__))
import common  # noqa: E402

import torch_oss  # noqa: E402


def lengths(n, lo, hi, seed=0):
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=g, dtype=torch.float64)
    return [int(round(math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * x))) for x in u.tolist()]


def run(args):
    device = "cuda" if torch.cuda.is_available() and args.device != "cpu" else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    n, lo, hi, width = (64, 128, 8192, 2048) if not args.smoke else (5, 3, 40, 64)
    lens = lengths(n, lo, hi)
    T, Lmax = sum(lens), max(lens)
    cu = torch.tensor([0] + lens, device=device).cumsum(0).to(torch.int32)
    pairs = sum(L * (L + 1) // 2 for L in lens)
    rows, records = [], []
    print(f"{n} sequences, {T} tokens, lengths {min(lens)}..{Lmax}; padded batch {n} x {Lmax} "
          f"({T / (n * Lmax):.0%} real)")
    for hd in ((64, 128) if not args.smoke else (32,)):
        H = width // hd
        torch.manual_seed(0)
        q, k, v = (torch.randn(T, H, hd, device=device, dtype=dtype) for _ in range(3))
        dout = torch.randn_like(q)
        pad = lambda x: torch.nn.utils.rnn.pad_sequence(list(x.split(lens)), batch_first=True).transpose(1, 2)  # noqa: E731
        qp, kp, vp, doutp = (pad(x).contiguous() for x in (q, k, v, dout))
        Bd = max(1, T // Lmax)
        qd, kd, vd = (torch.randn(Bd, H, Lmax, hd, device=device, dtype=dtype) for _ in range(3))
        doutd = torch.randn_like(qd)
        flops = {"varlen": 4 * H * pairs * hd, "padded": 4 * H * pairs * hd, "sdpa": 4 * H * pairs * hd,
                 "dense": 4 * Bd * H * (Lmax * (Lmax + 1) // 2) * hd}
        impls = {
            "varlen": ((q, k, v), dout,
                       lambda q, k, v: torch_oss.attention_varlen(q, k, v, cu, cu, Lmax, Lmax, causal=True,
                                                                  validate=False)),
            "dense": ((qd, kd, vd), doutd, lambda q, k, v: torch_oss.attention(q, k, v, is_causal=True)),
            "padded": ((qp, kp, vp), doutp, lambda q, k, v: torch_oss.attention(q, k, v, is_causal=True)),
            "sdpa": ((qp, kp, vp), doutp, lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
        }
        # the packed output equals the padded batch's real rows (same math, other tiling)
        got = torch_oss.attention_varlen(q, k, v, cu, cu, Lmax, Lmax, causal=True)
        want = torch_oss.attention(qp, kp, vp, is_causal=True).transpose(1, 2)
        want = torch.cat([want[b, :L] for b, L in enumerate(lens)])
        err = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
        if not err <= 2e-2:
            raise AssertionError(f"attention_varlen hd{hd}: max error {err:.3e} against the padded batch; not timing")
        res = {}
        for name, (inputs, g, fn) in impls.items():
            leaves = [t.detach().requires_grad_() for t in inputs]

            def fb(fn=fn, leaves=leaves, g=g):
                fn(*leaves).backward(g)

            t_f = common.bench(lambda fn=fn, inputs=inputs: fn(*inputs), device, rep_ms=args.rep_ms)
            t_fb = common.bench(fb, device, rep_ms=args.rep_ms)
            res[name] = (flops[name] / t_f / 1e9, 3.5 * flops[name] / t_fb / 1e9)
            records.append(dict(head_dim=hd, heads=H, impl=name, ms_fwd=t_f, ms_fwd_bwd=t_fb,
                                tflops_fwd=res[name][0], tflops_fwd_bwd=res[name][1]))
            print(f"hd {hd} {name:7s} fwd {t_f:8.3f} ms {res[name][0]:6.1f} TFLOP/s   fwd+bwd {t_fb:8.3f} ms "
                  f"{res[name][1]:6.1f} TFLOP/s", flush=True)
        ours = res["varlen"]
        rows.append([hd, f"{ours[0]:.0f}", f"{ours[1]:.0f}"] +
                    [f"{ours[i] / res[p][i]:.2f}" for p in ("dense", "padded", "sdpa") for i in (0, 1)])
    common.print_table(f"attention_varlen, {dtype}, causal, {n} sequences of {lo}..{hi} tokens: TFLOP/s of the "
                       "real tokens' work, and varlen's speed over each peer (fwd, fwd+bwd)",
                       ["hd", "fwd", "fwd+bwd", "/dense f", "/dense f+b", "/padded f", "/padded f+b", "/sdpa f",
                        "/sdpa f+b"], rows)
    common.write_json("varlen", dict(env=common.environment(device), lengths=lens, records=records))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default=None)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--rep-ms", type=int, default=100)
    args = p.parse_args()
    args.smoke = args.smoke or not torch.cuda.is_available()
    if args.smoke:
        args.rep_ms = 1
    run(args)


if __name__ == "__main__":
    main()
