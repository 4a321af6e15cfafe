"""A reduced grid that drives every CUDA kernel path once (each softmax tier,
misaligned and strided views, attention forward/backward over dtypes, head
dims, masks, GQA, causal modes, deterministic mode), checking results against
the CPU kernels. Small enough to run under compute-sanitizer:

    compute-sanitizer --tool memcheck python3 scripts/sanitize_smoke.py
    compute-sanitizer --tool racecheck python3 scripts/sanitize_smoke.py attention   # one part only
Parts: softmax, attention, attention_forward (the attention cases, forward only),
attention_tc (the attention cases in float16/bfloat16 only: the tensor-core kernels),
attention_rows192 (the attention_tc forward cases on the Hopper forward's blocks of 192
query rows, where kernels of 128 and 192 serve a call: head dims 64 and 96),
attention_simt (the attention cases in float32/float64 only: the SIMT kernels),
attention_simt_small (float32 only, one shape with several key tiles and query blocks:
for racecheck, which finished neither attention_simt in 120 s nor three shapes in 90 s on
an H100), decode (the split-KV decode kernel and the KV-cache entry point), cross_entropy,
variants (the attention score variants), dropout (attention dropout, alone and with the
variants: every kernel draws the same weights' mask as the CPU for the same seed), varlen
(packed variable-length batches).
"""

import os
import sys

import torch

# this tree's torch_oss (an in-place build too), before an installed one
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch_oss  # noqa: E402


def close(name, got, ref, tol):
    """|got - ref| <= tol * max(1, |ref|) elementwise (log-probabilities are large)."""
    got, ref = got.float().cpu(), ref.float().cpu()
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isnan(got), torch.isnan(ref)), f"{name}: NaN pattern differs"
    err = ((got[finite] - ref[finite]).abs() / ref[finite].abs().clamp(min=1)).max().item() if finite.any() else 0.0
    assert err <= tol, f"{name}: max relative error {err:.3e} > {tol:g}"


def softmax_cases():
    torch.manual_seed(0)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2), (torch.float16, 2e-3)):
        # misaligned rows; then aligned ones of the one-row-per-CTA kernel's widths
        # (light tier: forward 128-512 slots, backward 1024; at the chunk kernel's register
        # budget: float32 4096-8192 columns, 16-bit 16384-32768)
        cases = [(rows, cols, False) for rows, cols in ((3, 1), (5, 7), (64, 128), (33, 129), (9, 1000), (4, 4097),
                                                        (3, 33000), (2, 262147), (20, 1048576 + 5),
                                                        (1, 4 * 1048576 + 3))]
        cases += [(5, cols, True) for cols in (512, 1024, 2048, 4096, 8192, 16384, 32768)]
        # aligned narrow rows: the warp tier's forward with several rows per lane
        cases += [(37, cols, True) for cols in (8, 24, 64, 128)]
        for rows, cols, aligned in cases:
            x = torch.randn(rows, cols + 1, device="cuda", dtype=dtype)[:, 1:] * 3
            if aligned:
                x = x.contiguous()
            for log in (False, True):
                fn = torch_oss.log_softmax if log else torch_oss.softmax
                y = fn(x, -1)
                close(f"fwd {dtype} {rows}x{cols} log={log}", y, fn(x.cpu().float(), -1), tol)
                dy = torch.randn_like(y)
                op = torch.ops.oss.log_softmax_backward if log else torch.ops.oss.softmax_backward
                dx = op(dy, y, -1, dtype)
                close(f"bwd {dtype} {rows}x{cols} log={log}", dx, op(dy.cpu().float(), y.cpu().float(), -1,
                                                                    torch.float32), tol * 10)
        # columns kernel: a small tile; on sm_90 tiles shared by clusters of 2, 4 and 8
        # (one CTA filling the SM elsewhere); the column split (float32: a tile too large
        # for a cluster of 16; 16-bit: a cluster of 16 with up to ~210 KB each)
        for shape in ((2, 300, 5, 7), (2, 1500, 40), (1, 6000, 24), (1, 70000, 16)):
            x = torch.randn(shape, device="cuda", dtype=dtype) * 3
            for log in (False, True):
                fn = torch_oss.log_softmax if log else torch_oss.softmax
                y = fn(x, 1)
                close(f"dim=1 fwd {dtype} {shape} log={log}", y, fn(x.cpu().float(), 1), tol)
                dy = torch.randn_like(y)
                op = torch.ops.oss.log_softmax_backward if log else torch.ops.oss.softmax_backward
                close(f"dim=1 bwd {dtype} {shape} log={log}", op(dy, y, 1, dtype),
                      op(dy.cpu().float(), y.cpu().float(), 1, torch.float32), tol * 10)
        x = torch.randn(2, 300, 5, 7, device="cuda", dtype=dtype)
        close(f"cast {dtype}", torch_oss.softmax(x, 1, dtype=torch.float32), torch_oss.softmax(x.cpu().float(), 1),
              tol)
        x = torch.randn(3, 2048, device="cuda", dtype=dtype)  # the light tier, output cast to float32
        close(f"cast {dtype} rows", torch_oss.log_softmax(x, -1, dtype=torch.float32),
              torch_oss.log_softmax(x.cpu().float(), -1), tol)


def attention_mask_tile_cases():
    """Mask tensors whose rows the copy engine can address (272 keys: 16-byte rows in every
    mask dtype), which the Hopper kernels take in tiles through shared memory: a full mask,
    one the same for every query (a padding mask), 16-bit and float32 additive ones, and masks
    whose tiles are mostly left unchanged (a padding mask by lengths, a causal mask with
    padding in zeros and -inf), which the kernels skip; several query blocks and key tiles,
    the last of each partial; forward and gradients against the CPU."""
    torch.manual_seed(2)
    dims = torch_oss.build_info()["attention_head_dims"]
    B, Hq, Hkv, Lq, Lk = 2, 2, 1, 150, 272
    for D in (64, 96, 128, 256):
        if D > max(dims):
            continue
        q = torch.randn(B, Hq, Lq, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, Hkv, Lk, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, Hkv, Lk, D, device="cuda", dtype=torch.bfloat16)
        full = torch.rand(B, 1, Lq, Lk, device="cuda") > 0.2
        full[..., 0, :] = False
        prefix = (torch.arange(Lk, device="cuda") < torch.tensor([Lk, 200], device="cuda")[:, None]).view(B, 1, 1, Lk)
        causal_rule = torch.ones(Lq, Lk, device="cuda", dtype=torch.bool).tril(Lk - Lq)
        masks = {"bool": full, "keys": torch.rand(B, 1, 1, Lk, device="cuda") > 0.3,
                 "bf16": torch.randn(1, Hq, Lq, Lk, device="cuda", dtype=torch.bfloat16),
                 "float32": torch.randn(1, Hq, Lq, Lk, device="cuda"),
                 "lengths": prefix,
                 "bf16 causal padding": torch.zeros(B, 1, Lq, Lk, device="cuda", dtype=torch.bfloat16).masked_fill(
                     ~(prefix & causal_rule), float("-inf"))}
        for name, m in masks.items():
            for causal in (False, True):
                args = dict(attn_mask=m, is_causal=causal, enable_gqa=True, causal_alignment="bottom_right")
                leaves = [t.clone().requires_grad_() for t in (q, k, v)]
                cpu = [t.detach().cpu().float().requires_grad_() for t in (q, k, v)]
                cpu_mask = m.cpu() if m.dtype == torch.bool else m.cpu().float()
                close_forward_backward(f"attention mask tiles hd{D} {name} causal={causal}",
                                       torch_oss.attention_with_lse(*leaves, **args),
                                       torch_oss.attention_with_lse(*cpu, **dict(args, attn_mask=cpu_mask)),
                                       leaves, cpu, "qkv", 3e-2)


def attention_cases(forward_only=False, kernels="all"):
    """kernels: "all", "tc" (float16/bfloat16), "simt" (float32/float64) or
    "simt_small" (float32, one shape with several key tiles and query blocks)."""
    torch.manual_seed(1)
    dims = torch_oss.build_info()["attention_head_dims"]
    dtypes = {"tc": ((torch.bfloat16, 3e-2), (torch.float16, 5e-3)),
              "simt": ((torch.float32, 1e-4), (torch.float64, 1e-4))}
    dtypes["all"] = dtypes["tc"] + dtypes["simt"][:1]
    dtypes["simt_small"] = dtypes["simt"][:1]
    shapes = ((1, 2, 2, 17, 17, 64, 64), (2, 4, 2, 129, 127, 128, 128),
              (1, 8, 1, 1, 300, 40, 40), (1, 2, 2, 70, 45, 100, 72),
              (1, 2, 1, 200, 300, 64, 48),  # several key tiles and query blocks
              (1, 2, 1, 150, 230, 192, 128),
              (1, 2, 1, 130, 200, 96, 80),
              (1, 2, 1, 65, 190, max(dims), max(dims)))
    if kernels == "simt_small":
        shapes = (shapes[4],)
    for dtype, tol in dtypes[kernels]:
        for (B, Hq, Hkv, Lq, Lk, D, Dv) in shapes:
            if max(D, Dv) > max(dims):
                continue
            q = torch.randn(B, Hq, Lq, D, device="cuda", dtype=dtype)
            k = torch.randn(B, Hkv, Lk, D, device="cuda", dtype=dtype)
            v = torch.randn(B, Hkv, Lk, Dv, device="cuda", dtype=dtype)
            mask = torch.rand(B, 1, Lq, Lk, device="cuda") > 0.2
            mask[..., 0, :] = False
            for causal, align, m in ((False, "top_left", None), (True, "top_left", None),
                                     (True, "bottom_right", mask), (False, "top_left", mask.float().log())):
                args = dict(attn_mask=m, is_causal=causal, enable_gqa=Hq != Hkv, causal_alignment=align)
                leaves = [t.clone().requires_grad_(not forward_only) for t in (q, k, v)]
                out, lse = torch_oss.attention_with_lse(*leaves, **args)
                name = f"attention {dtype} {(B, Hq, Hkv, Lq, Lk, D, Dv)} causal={causal}/{align} mask={m is not None}"
                cpu = [t.detach().cpu().float().requires_grad_(not forward_only) for t in (q, k, v)]
                cargs = dict(args, attn_mask=None if m is None else m.cpu().float() if m.dtype != torch.bool
                             else m.cpu())
                cout, clse = torch_oss.attention_with_lse(*cpu, **cargs)
                close(name + " out", out, cout, tol)
                close(name + " lse", lse, clse, tol)
                if forward_only:
                    continue
                dout = torch.randn_like(out)
                out.backward(dout)
                cout.backward(dout.cpu().float())
                for g, cg, n in zip(leaves, cpu, "qkv"):
                    close(name + f" d{n}", g.grad, cg.grad, tol * 20)
    if forward_only or kernels.startswith("simt"):
        return
    torch.use_deterministic_algorithms(True)
    q, k, v = (torch.randn(1, 4, 100, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    torch_oss.attention(q, k, v, is_causal=True).sum().backward()
    torch.use_deterministic_algorithms(False)
    # (B, L, H, D) memory seen as (B, H, L, D): out, its residual and the gradients in that layout
    for D in (d for d in (64, 96, 128) if d in dims):
        x = [torch.randn(2, 150, h, D, device="cuda", dtype=torch.bfloat16) for h in (8, 2, 2)]
        leaves = [t.transpose(1, 2).requires_grad_() for t in x]
        out, lse = torch_oss.attention_with_lse(*leaves, is_causal=True, enable_gqa=True)
        cpu = [t.detach().cpu().float().requires_grad_() for t in leaves]
        cout, clse = torch_oss.attention_with_lse(*cpu, is_causal=True, enable_gqa=True)
        name = f"attention (B, L, H, D) layout, head dim {D}"
        close(name + " out", out, cout, 3e-2)
        close(name + " lse", lse, clse, 3e-2)
        dout = torch.randn_like(out)
        out.backward(dout)
        cout.backward(dout.cpu().float())
        for g, cg, n in zip(leaves, cpu, "qkv"):
            close(name + f" d{n}", g.grad, cg.grad, 0.6)


def decode_cases():
    """The split-KV decode kernel and the merge of its splits (in a cluster and
    by the combine kernel; len_q <= 16, forced and
    rule-chosen split counts) and attention_with_kvcache on contiguous and
    paged caches with in-place appends, against the CPU kernels."""
    from torch_oss._kernels import attention_kernels

    torch.manual_seed(2)
    dims = torch_oss.build_info()["attention_head_dims"]
    for dtype, tol in ((torch.bfloat16, 3e-2), (torch.float16, 5e-3)):
        for (B, Hq, Hkv, Lq, Lk, D) in ((1, 8, 2, 1, 1000, 128), (2, 4, 4, 3, 300, 64), (1, 16, 2, 16, 700, 256),
                                        (3, 2, 1, 1, 77, 80)):
            if D > max(dims):
                continue
            q, k, v = random_qkv(B, Hq, Hkv, Lq, Lk, D, dtype)
            mask = torch.rand(B, 1, Lq, Lk, device="cuda") > 0.3
            cpu = [t.cpu().float() for t in (q, k, v)]
            for splits in (0, 1, 3, 16):
                for m in (None, mask):
                    with attention_kernels(decode_splits=splits):
                        out, lse = torch_oss.attention_with_lse(q, k, v, attn_mask=m, is_causal=m is None,
                                                                causal_alignment="bottom_right", enable_gqa=Hq != Hkv)
                    cout, clse = torch_oss.attention_with_lse(*cpu, attn_mask=None if m is None else m.cpu(),
                                                              is_causal=m is None, causal_alignment="bottom_right",
                                                              enable_gqa=Hq != Hkv)
                    name = f"decode {dtype} {(B, Hq, Hkv, Lq, Lk, D)} splits={splits} mask={m is not None}"
                    close(name + " out", out, cout, tol)
                    close(name + " lse", lse, clse, tol)
        # KV cache (FlashAttention's layout): contiguous, then paged with a page size that
        # does not divide the lengths, appending 2 new tokens in place
        B, Hq, Hkv, D, cap, new = 3, 8, 2, 128, 320, 2
        lens = torch.tensor([0, 130, 317], dtype=torch.int32, device="cuda")
        q = torch.randn(B, 1, Hq, D, device="cuda", dtype=dtype)
        kn = torch.randn(B, new, Hkv, D, device="cuda", dtype=dtype)
        vn = torch.randn(B, new, Hkv, D, device="cuda", dtype=dtype)
        kc = torch.randn(B, cap, Hkv, D, device="cuda", dtype=dtype)
        vc = torch.randn(B, cap, Hkv, D, device="cuda", dtype=dtype)
        page = 48
        pages = (cap + page - 1) // page
        perm = torch.randperm(B * pages, device="cuda").to(torch.int32)
        table = perm.view(B, pages)
        kp = torch.zeros(B * pages, page, Hkv, D, device="cuda", dtype=dtype)
        vp = torch.zeros_like(kp)
        for b in range(B):
            for i in range(pages):
                rows = kc[b, i * page:(i + 1) * page]
                kp[table[b, i], :rows.shape[0]] = rows
                vp[table[b, i], :rows.shape[0]] = vc[b, i * page:(i + 1) * page]
        ref = None
        for paged in (False, True):
            kcache, vcache = (kp.clone(), vp.clone()) if paged else (kc.clone(), vc.clone())
            out = torch_oss.attention_with_kvcache(q, kcache, vcache, kn, vn, cache_seqlens=lens,
                                                   block_table=table if paged else None)
            ccache = [kcache.cpu().float(), vcache.cpu().float()]
            cout = torch_oss.attention_with_kvcache(q.cpu().float(), *ccache, cache_seqlens=(lens + new).cpu(),
                                                    block_table=table.cpu() if paged else None)
            close(f"kvcache {dtype} paged={paged} out", out, cout, tol)
            ref = out if ref is None else ref
            close(f"kvcache {dtype} paged vs contiguous", out, ref, tol)


def random_qkv(B, Hq, Hkv, Lq, Lk, D, dtype):
    """q (B, Hq, Lq, D), k and v (B, Hkv, Lk, D), standard normal, on the GPU."""
    return (torch.randn(B, Hq, Lq, D, device="cuda", dtype=dtype),
            torch.randn(B, Hkv, Lk, D, device="cuda", dtype=dtype),
            torch.randn(B, Hkv, Lk, D, device="cuda", dtype=dtype))


def close_forward_backward(name, cuda_out_lse, cpu_out_lse, leaves, cpu_leaves, names, tol):
    """out and lse of the CUDA call against the CPU call's, then the gradients
    of the named leaves for one random dout (tol * 20: they sum over rows)."""
    (out, lse), (cout, clse) = cuda_out_lse, cpu_out_lse
    close(name + " out", out, cout, tol)
    close(name + " lse", lse, clse, tol)
    dout = torch.randn_like(out)
    out.backward(dout)
    cout.backward(dout.cpu().float())
    for g, cg, n in zip(leaves, cpu_leaves, names):
        close(name + f" d{n}", g.grad, cg.grad, tol * 20)


def variants_cases():
    """The attention kernels with the score variants (window, softcap, ALiBi,
    sinks and their gradient), forward and backward, in every dtype, default
    and deterministic, against the CPU kernels."""
    torch.manual_seed(4)
    for dtype, tol in ((torch.bfloat16, 3e-2), (torch.float16, 5e-3), (torch.float32, 1e-4)):
        for (B, Hq, Hkv, Lq, Lk, D) in ((1, 4, 2, 130, 300, 64), (2, 2, 2, 70, 45, 100), (1, 2, 1, 65, 190, 256)):
            q, k, v = random_qkv(B, Hq, Hkv, Lq, Lk, D, dtype)
            kw = dict(window_size=(40, 3), softcap=5.0, alibi_slopes=torch.rand(B, Hq, device="cuda") * 0.1,
                      causal_alignment="bottom_right", enable_gqa=Hq != Hkv)
            sinks = torch.randn(Hq, device="cuda")
            for det in (False, True):
                leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
                out, lse = torch_oss.attention_with_lse(*leaves[:3], sinks=leaves[3], deterministic=det, **kw)
                cpu = [t.detach().cpu().float().requires_grad_() for t in (q, k, v, sinks)]
                ckw = dict(kw, alibi_slopes=kw["alibi_slopes"].cpu())
                cout, clse = torch_oss.attention_with_lse(*cpu[:3], sinks=cpu[3], **ckw)
                name = f"variants {dtype} {(B, Hq, Hkv, Lq, Lk, D)} deterministic={det}"
                close_forward_backward(name, (out, lse), (cout, clse), leaves, cpu, ("q", "k", "v", "sinks"), tol)


def dropout_cases():
    """Attention dropout, forward and backward, in every dtype, default and
    deterministic, alone and with the score variants, against the CPU kernels
    given the same seed (the mask rule is the same on both)."""
    torch.manual_seed(5)
    for dtype, tol in ((torch.bfloat16, 3e-2), (torch.float16, 5e-3), (torch.float32, 1e-4)):
        for (B, Hq, Hkv, Lq, Lk, D) in ((1, 4, 2, 130, 300, 64), (2, 2, 2, 70, 45, 128), (1, 2, 1, 65, 190, 256)):
            q, k, v = random_qkv(B, Hq, Hkv, Lq, Lk, D, dtype)
            seed = torch.randint(-2**63, 2**63 - 1, (1,), dtype=torch.int64)
            for variants in (False, True):
                window, softcap = ([40, 3], 5.0) if variants else ([-1, -1], 0.0)
                sinks = torch.randn(Hq, device="cuda") if variants else None
                for det in (False, True):
                    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
                    cpu = [t.detach().cpu().float().requires_grad_() for t in (q, k, v)]
                    outs = []
                    for ts, dev in ((leaves, "cuda"), (cpu, "cpu")):
                        s_dev = None if sinks is None else sinks.to(dev)
                        outs.append(torch.ops.oss.attention(*ts, None, True, None, Hq != Hkv, "bottom_right", window,
                                                            softcap, None, s_dev, det, 0.3, seed.to(dev)))
                    name = f"dropout {dtype} {(B, Hq, Hkv, Lq, Lk, D)} variants={variants} deterministic={det}"
                    close_forward_backward(name, outs[0], outs[1], leaves, cpu, ("q", "k", "v"), tol)


def varlen_cases():
    """attention_varlen (packed sequences of mixed lengths, an empty one and
    a length-1 one; Hopper and mma.sync head dims), forward and backward, in
    every dtype, default and deterministic, plain and with the variants and
    dropout, against the CPU kernels."""
    torch.manual_seed(6)
    lens_q, lens_k = [1, 130, 0, 67, 200], [5, 130, 3, 300, 64]
    cu_q = torch.tensor([0] + lens_q).cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0] + lens_k).cumsum(0).to(torch.int32)
    for dtype, tol in ((torch.bfloat16, 3e-2), (torch.float16, 5e-3), (torch.float32, 1e-4)):
        for Hq, Hkv, D in ((4, 2, 64), (2, 2, 128), (2, 1, 96)):
            q = torch.randn(int(cu_q[-1]), Hq, D, device="cuda", dtype=dtype)
            k = torch.randn(int(cu_k[-1]), Hkv, D, device="cuda", dtype=dtype)
            v = torch.randn(int(cu_k[-1]), Hkv, D, device="cuda", dtype=dtype)
            seed = torch.randint(-2**63, 2**63 - 1, (1,), dtype=torch.int64)
            for variants in (False, True):
                kw = dict(window_size=[40, 3], softcap=5.0, alibi_slopes=torch.rand(5, Hq) * 0.1,
                          sinks=torch.randn(Hq)) if variants else {}
                for det in (False, True):
                    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
                    cpu = [t.detach().cpu().float().requires_grad_() for t in (q, k, v)]
                    outs = []
                    for ts, dev in ((leaves, "cuda"), (cpu, "cpu")):
                        dkw = {n: (t.to(dev) if isinstance(t, torch.Tensor) else t) for n, t in kw.items()}
                        out, lse, _ = torch.ops.oss.attention_varlen(
                            *ts, cu_q.to(dev), cu_k.to(dev), max(lens_q), max(lens_k), True, None, "bottom_right",
                            **dkw, deterministic=det, dropout_p=0.2 if variants else 0.0,
                            dropout_seed=seed.to(dev) if variants else None)
                        outs.append((out, lse))
                    name = f"varlen {dtype} {(Hq, Hkv, D)} variants={variants} deterministic={det}"
                    close_forward_backward(name, outs[0], outs[1], leaves, cpu, ("q", "k", "v"), tol)


def cross_entropy_cases():
    """The cross-entropy kernels torch_oss.cross_entropy runs (forward and
    backward), against the CPU kernels."""
    torch.manual_seed(3)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2), (torch.float16, 2e-3)):
        for rows, classes in ((7, 5), (33, 1000), (3, 30001), (4, 50257), (3, 128256), (2, 262147)):
            x = torch.randn(rows, classes, device="cuda", dtype=dtype) * 3
            t = torch.randint(0, classes, (rows,), device="cuda")
            t[0] = -100
            for smoothing, z in ((0.0, 0.0), (0.1, 1e-4)):
                leaf = x.detach().clone().requires_grad_()
                loss = torch_oss.cross_entropy(leaf, t, label_smoothing=smoothing, z_loss=z)
                loss.backward()
                cleaf = x.detach().cpu().float().clone().requires_grad_()
                closs = torch_oss.cross_entropy(cleaf, t.cpu(), label_smoothing=smoothing, z_loss=z)
                closs.backward()
                name = f"cross_entropy {dtype} {(rows, classes)} smoothing={smoothing} z={z}"
                close(name + " loss", loss, closs, tol)
                close(name + " grad", leaf.grad, cleaf.grad, tol)


if __name__ == "__main__":
    parts = sys.argv[1:] or ["softmax", "attention", "attention_masks", "decode", "cross_entropy", "variants", "dropout",
                             "varlen"]
    if "softmax" in parts:
        softmax_cases()
    if "attention" in parts:
        attention_cases()
    if "attention_masks" in parts:
        attention_mask_tile_cases()
    if "attention_forward" in parts:
        attention_cases(forward_only=True)
    if "attention_tc" in parts:
        attention_cases(kernels="tc")
    if "attention_rows192" in parts:
        from torch_oss._kernels import attention_kernels
        with attention_kernels(forward_block_rows=192):
            attention_cases(forward_only=True, kernels="tc")
    if "attention_simt" in parts:
        attention_cases(kernels="simt")
    if "attention_simt_small" in parts:
        attention_cases(kernels="simt_small")
    if "decode" in parts:
        decode_cases()
    if "cross_entropy" in parts:
        cross_entropy_cases()
    if "variants" in parts:
        variants_cases()
    if "dropout" in parts:
        dropout_cases()
    if "varlen" in parts:
        varlen_cases()
    torch.cuda.synchronize()
    print("sanitize smoke: all CUDA paths ran and matched the CPU kernels")
