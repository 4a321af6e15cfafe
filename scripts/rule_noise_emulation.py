"""CPU emulation behind tests/_reliability.py's choice to compare gradients on
the views the op receives, not on the leaves they were made from.

Two roundings of the float16 attention backward that are equally accurate
(dS' = scale * P (dP - D) rounded to float16, as torch_oss does, or P (dP - D)
rounded and scaled afterwards) are judged against each other with the tolerance
rule of docs/testing.md (max|a - ref| - eps |ref| <= 2 max|b - ref| + atol), for a query
broadcast from one row over Lq = 169 rows (the long fuzz profile's failing
layout): once on the leaf's gradient (PyTorch sums the 169 gradient rows and
rounds to float16 again) and once on the 169 rows themselves.

    python3 scripts/rule_noise_emulation.py [DRAWS]     (default 200)
"""
import sys

import torch

dt, eps, atol = torch.float16, 2.0 ** -10, 1e-4


def r(x):
    return x.to(dt).double()


def draw(seed, Lq=169, Lk=21, D=230, Dv=256):
    g = torch.Generator().manual_seed(seed)

    def base(shape):  # randn * 0.5 with a few outliers of +-20, as tests/test_fuzz.py draws them
        x = 0.5 * torch.randn(shape, generator=g, dtype=torch.float64)
        idx = torch.randint(0, x.numel(), (max(1, x.numel() // 500),), generator=g)
        x.view(-1)[idx] += 20.0 * torch.randn(idx.shape, generator=g, dtype=torch.float64).sign()
        return r(x)

    q = base((1, 2, 1, D)).expand(1, 2, Lq, D)
    k = base((1, 1, Lk, D)).expand(1, 2, Lk, D)
    v = base((1, 1, Lk, Dv)).expand(1, 2, Lk, Dv)
    dO = r(torch.randn((1, 2, Lq, Dv), generator=g, dtype=torch.float64))
    scale = D ** -0.5
    P = torch.softmax(q @ k.transpose(-1, -2) * scale, -1)
    O = P @ v
    dP = dO @ v.transpose(-1, -2)
    exact_rows = P * (dP - (dO * O).sum(-1, keepdim=True)) @ k * scale
    # the kernel's inputs: P and dP in float32, D from the float16 output
    core = P.float().double() * (dP.float().double() - (dO * r(O)).sum(-1, keepdim=True).float().double())
    rows = {"scale then round": r(r(scale * core) @ k), "round then scale": r(r(core) * scale @ k)}
    return exact_rows, rows


def rule_error(x, ref):
    ref = r(ref)
    return ((x - ref).abs() - eps * ref.abs()).max().item(), (x - ref).abs().max().item()


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    fails = {"leaf": 0, "rows": 0}
    for seed in range(n):
        exact_rows, rows = draw(seed)
        a, b = rows["scale then round"], rows["round then scale"]
        leaf = lambda t: t.sum(2).to(dt).double()  # PyTorch's backward of expand: sum, rounded to float16
        for where, (x, y, ref) in {"leaf": (leaf(a), leaf(b), exact_rows.sum(2)), "rows": (a, b, exact_rows)}.items():
            # either judged against the other
            fails[where] += rule_error(x, ref)[0] > 2 * rule_error(y, ref)[1] + atol
            fails[where] += rule_error(y, ref)[0] > 2 * rule_error(x, ref)[1] + atol
    print(f"{n} draws, 2 comparisons each; the rule fails between the two equally accurate roundings: "
          f"on the leaf's gradient {fails['leaf']} times, on the op's gradient rows {fails['rows']} times")


if __name__ == "__main__":
    main()
