"""Takes one attention fuzz case apart: replays it from the blob hypothesis
printed (same hypothesis version), captures the inputs check_attention would
get, and prints the max error of out, dq, dk and dv against the float64
reference, with NaN counts, for torch_oss (on the views and on contiguous
copies) and for each SDPA backend on its own:

    python3 scripts/diagnose_attention_case.py test_fuzz_attention_backward cuda 6.168.3 'AXic...'

Tells a torch_oss defect (ours off, every backend close) from a broken peer
(one backend off or NaN) or a bound too tight for the case.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from hypothesis import reproduce_failure, settings  # noqa: E402
from hypothesis.errors import DidNotReproduce  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import _util  # noqa: E402
import test_fuzz  # noqa: E402
import torch_oss  # noqa: E402


def capture_case(name, device, version, blob):
    """The arguments check_attention receives for the replayed case."""
    captured = {}
    test_fuzz.check_attention = lambda bases, views, **kw: captured.update(bases=bases, views=views, **kw)
    test = settings(deadline=None, print_blob=False)(getattr(test_fuzz, name))
    try:
        reproduce_failure(os.environ.get("HYPOTHESIS_REPLAY_VERSION", version), blob.encode())(test)(device=device)
    except DidNotReproduce:
        pass  # expected: the captured check raises nothing
    return captured


def gradients(fn, inputs, seed=7):
    """fn's output and the gradients of its inputs for a seeded upstream gradient."""
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*leaves)
    g = torch.Generator().manual_seed(seed)
    out.backward(torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.device, out.dtype))
    return [out.detach()] + [x.grad for x in leaves]


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    case = capture_case(*sys.argv[1:])
    qkv = [f(b) for f, b in zip(case["views"], case["bases"])]
    mask, causal, scale, align = case["mask"], case["is_causal"], case["scale"], case["alignment"]
    gqa = qkv[0].dim() == 4 and qkv[0].shape[-3] != qkv[1].shape[-3]
    print(case["label"])
    for n, x in zip("qkv", qkv):
        print(f"  {n} {tuple(x.shape)} strides {x.stride()} offset {x.storage_offset()} {x.dtype}")

    ref_mask = None if mask is None else mask.cpu()
    ref = gradients(lambda q, k, v: _util.attention_reference(q, k, v, ref_mask, causal, scale, gqa, align)[0],
                    [x.detach().cpu().double() for x in qkv])

    def report(label, fn, inputs):
        try:
            got = gradients(fn, inputs)
        except RuntimeError as e:
            print(f"{label:26s} {str(e).splitlines()[0][:120]}")
            return
        cols = []
        for n, a, r in zip(("out", "dq", "dk", "dv"), got, ref):
            a = a.double().cpu()
            cols.append(f"{n} {(a - r).abs().nan_to_num(float('inf')).max().item():.3e} "
                        f"(nan {int(torch.isnan(a).sum())}, |ref| {r.abs().max().item():.1e})")
        print(f"{label:26s} " + " | ".join(cols))

    def ours(q, k, v):
        return torch_oss.attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa,
                                   causal_alignment=align)

    report("torch_oss (views)", ours, qkv)
    report("torch_oss (copies)", ours, [x.detach().clone() for x in qkv])
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                    SDPBackend.MATH):
        def peer(q, k, v, backend=backend):
            # the test's peer inputs (fresh copies, kv heads repeated, head dims
            # padded, a non-negative scale) and its full-shape mask
            qp, kp, vp, s = _util._fused_peer_inputs(q, k, v, scale)
            m = _util._causal_and_mask(q, k, mask, causal, align)
            mp = None if m is None else _util._fused_peer_mask(m, (*qp.shape[:-1], k.shape[-2]))
            with sdpa_kernel([backend]):
                out = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mp, scale=s)
            return out[..., :v.shape[-1]].reshape(*q.shape[:-1], v.shape[-1])

        report(f"SDPA {backend.name}", peer, qkv)


if __name__ == "__main__":
    main()
