"""Where a 16-bit attention gradient's error comes from, for one fuzz case:
replays the case from its blob (as scripts/diagnose_attention_case.py does; the
fuzz draws its inputs on the CPU, so a CUDA case replays here without a GPU),
computes the gradients in float64, and switches on one 16-bit rounding at a
time:

    python3 scripts/attention_rounding_budget.py test_fuzz_attention_backward 6.168.3 'AXic...'

  - D = rowsum(dO * O) from the output rounded to nearest (what every fused
    kernel's backward does, from its own rounded output);
  - dS rounded to 16 bits, unscaled (FlashAttention) or scaled (torch_oss);
  - both;
  - scaled dS rounded, with dQ centred as the kernels do it
    (attention_bwd.cuh): dq = rounded dS (K - k_mean), k_mean the kv head's
    mean K row (exact for the exact dS, whose rows sum to 0); dk as before;
and then the spread of the max error over 400 outputs perturbed within one
unit in the last place (kernels with different summation orders), with how
often one draw's error exceeds twice another's plus atol (the tolerance rule
comparing two such kernels). Only dq and dk: dv = P^T dO does not involve D.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import torch  # noqa: E402

import _reliability  # noqa: E402
import _util  # noqa: E402
from diagnose_attention_case import capture_case  # noqa: E402


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    name, version, blob = sys.argv[1:]
    case = capture_case(name, "cpu", version, blob)
    qkv = [f(b) for f, b in zip(case["views"], case["bases"])]
    dtype = qkv[0].dtype
    if dtype not in (torch.float16, torch.bfloat16):
        sys.exit(f"{case['label']}: not a 16-bit case")
    q, k, v = (x.detach().double() for x in qkv)
    mask, causal, scale, align = case["mask"], case["is_causal"], case["scale"], case["alignment"]
    print(case["label"])
    group = q.shape[-3] // k.shape[-3] if q.dim() == 4 else 1
    k_rep, v_rep = (t.repeat_interleave(group, -3) if group > 1 else t for t in (k, v))
    sc = scale if scale is not None else q.shape[-1] ** -0.5
    s = q @ k_rep.transpose(-1, -2) * sc
    m = _util._causal_and_mask(q, k, mask, causal, align)
    if m is not None:
        s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s + m.double()
    p = torch.softmax(s, -1).nan_to_num(0.0)  # rows with no visible key: 0
    o = p @ v_rep
    dout = _reliability._randn(o.shape, dtype, "cpu", case.get("seed")).double()
    dp = dout @ v_rep.transpose(-1, -2)

    def grads(D, round_ds=None):
        ds = p * (dp - D.unsqueeze(-1))
        if round_ds == "unscaled":
            ds = ds.to(dtype).double() * sc
        elif round_ds in ("scaled", "centred"):
            ds = (ds * sc).to(dtype).double()
        else:
            ds = ds * sc
        dq = ds @ (k_rep - k_rep.mean(-2, keepdim=True) if round_ds == "centred" else k_rep)
        dk = ds.transpose(-1, -2) @ q
        if group > 1:
            dk = dk.unflatten(-3, (k.shape[-3], group)).sum(-3)  # (B, Hkv, group, Lk, D)
        return dq, dk

    D_exact = (dout * o).sum(-1)
    D_rounded = (dout * o.to(dtype).double()).sum(-1)
    ref = grads(D_exact)

    def err(gr):
        return "  ".join(f"{n} {(a - r).abs().max().item():.3e}" for n, a, r in zip(("dq", "dk"), gr, ref))

    print(f"|dq| max {ref[0].abs().max().item():.2e}, |dk| max {ref[1].abs().max().item():.2e}")
    print("D from the output rounded to nearest   ", err(grads(D_rounded)))
    print("dS rounded, unscaled (FlashAttention)   ", err(grads(D_exact, "unscaled")))
    print("scale * dS rounded (torch_oss uncentred)", err(grads(D_exact, "scaled")))
    print("both, unscaled                          ", err(grads(D_rounded, "unscaled")))
    print("both, scaled                            ", err(grads(D_rounded, "scaled")))
    print("scaled, dQ centred (torch_oss)          ", err(grads(D_exact, "centred")))

    mantissa = 10 if dtype == torch.float16 else 7
    ulp = (o.to(dtype).double().abs().clamp(min=1e-30).log2().floor() - mantissa).exp2()
    gen = torch.Generator().manual_seed(0)
    errors = []
    for _ in range(400):
        o_draw = (o + (torch.rand(o.shape, generator=gen, dtype=torch.float64) * 2 - 1) * ulp).to(dtype).double()
        dq, dk = grads((dout * o_draw).sum(-1), "scaled")
        errors.append(((dq - ref[0]).abs().max().item(), (dk - ref[1]).abs().max().item()))
    errors = torch.tensor(errors)
    atol = _reliability.ATTENTION_ATOL[dtype]
    for name, col in (("dq", 0), ("dk", 1)):
        e = errors[:, col].sort().values
        over = (e[:, None] > 2 * e[None, :] + atol).double().mean().item()
        print(f"{name}: outputs within 1 ulp give max errors {e[0]:.3e} (min) {e[200]:.3e} (median) "
              f"{e[-1]:.3e} (max); one over twice another + atol in {100 * over:.0f} % of pairs")


if __name__ == "__main__":
    main()
