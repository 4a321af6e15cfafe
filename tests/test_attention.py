"""torch_oss.attention against a float64 reference (out, lse and all three
gradients) over dtypes, head dims, causal alignments, masks, GQA ratios and
awkward lengths; SDPA semantics; opcheck and torch.compile."""

import functools
import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from _util import (ATTENTION_ATOL, BUILD, CUDA_OK, DEVICES, FLOAT_DTYPES, NVCC_SKIP, SOFTMAX_ATOL,
                   assert_rounded_to_nearest, assert_tolerance, attention_reference, cuda_param, lse_peer,
                   ptxas_report, sdpa_peer)

import torch_oss
from torch_oss._kernels import attention_kernels
from torch_oss._residual import output_residual_code, output_residual_value

CAUSAL = [(False, "top_left"), (True, "top_left"), (True, "bottom_right")]
CAUSAL_IDS = ["none", "top_left", "bottom_right"]

# (batch, heads_q, heads_kv, len_q, len_k, head_dim, head_dim_v)
CASES = [
    (1, 1, 1, 1, 1, 32, 32),
    (2, 2, 2, 17, 17, 64, 64),
    (1, 4, 2, 127, 129, 40, 40),
    (2, 2, 1, 129, 127, 80, 80),
    (1, 8, 1, 33, 200, 128, 128),
    (1, 6, 3, 64, 64, 17, 17),
    (1, 2, 2, 70, 45, 100, 72),
    (1, 4, 4, 96, 257, 96, 112),
    (1, 2, 1, 65, 65, 160, 160),
    (1, 1, 1, 48, 80, 192, 192),
    (1, 2, 2, 40, 72, 256, 256),
    (1, 4, 2, 200, 333, 256, 256),  # several query and key blocks of the Hopper backward, GQA
]
CASE_IDS = ["b{}_h{}-{}_l{}-{}_d{}-{}".format(*c) for c in CASES]


def head_dim_supported(device, *dims):
    if device != "cuda":
        return True
    compiled = BUILD["attention_head_dims"]
    return bool(compiled) and max(dims) <= max(compiled)


def make_qkv(case, dtype, device, requires_grad=False):
    B, Hq, Hkv, Lq, Lk, D, Dv = case
    q = torch.randn(B, Hq, Lq, D, dtype=dtype, device=device)
    k = torch.randn(B, Hkv, Lk, D, dtype=dtype, device=device)
    v = torch.randn(B, Hkv, Lk, Dv, dtype=dtype, device=device)
    return [t.requires_grad_(requires_grad) for t in (q, k, v)]


def check_forward(q, k, v, mask=None, is_causal=False, alignment="top_left", scale=None, label=""):
    gqa = q.shape[1] != k.shape[1]
    out, lse = torch_oss.attention_with_lse(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale,
                                            enable_gqa=gqa, causal_alignment=alignment)
    ref_out, ref_lse = attention_reference(q, k, v, mask, is_causal, scale, gqa, alignment)
    peer_out = sdpa_peer(q, k, v, mask, is_causal, scale, gqa, alignment)
    peer_lse = lse_peer(q, k, v, mask, is_causal, scale, gqa, alignment)
    atol = ATTENTION_ATOL[q.dtype]
    assert out.dtype == q.dtype and out.shape == ref_out.shape
    assert lse.dtype == (torch.float64 if q.dtype == torch.float64 else torch.float32)
    assert_tolerance(f"out {label}", out, ref_out, peer_out, atol)
    assert_tolerance(f"lse {label}", lse, ref_lse, peer_lse, atol)
    return out, lse


def check_backward(q, k, v, mask=None, is_causal=False, alignment="top_left", scale=None, label=""):
    gqa = q.shape[1] != k.shape[1]
    dout = torch.randn(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype, device=q.device)
    leaves = {}
    for name in ("ours", "peer", "ref"):
        dtype = torch.float64 if name == "ref" else q.dtype
        leaves[name] = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    torch_oss.attention(*leaves["ours"], attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=gqa,
                        causal_alignment=alignment).backward(dout)
    sdpa_peer(*leaves["peer"], mask, is_causal, scale, gqa, alignment).backward(dout)
    attention_reference(*leaves["ref"], mask, is_causal, scale, gqa, alignment)[0].backward(dout.double())
    atol = ATTENTION_ATOL[q.dtype]
    for i, name in enumerate(("dq", "dk", "dv")):
        ours = leaves["ours"][i].grad
        assert ours.dtype == q.dtype and ours.shape == leaves["ours"][i].shape
        assert_tolerance(f"{name} {label}", ours, leaves["ref"][i].grad, leaves["peer"][i].grad, atol)


# ---------------------------------------------------------------------------
# Values and gradients
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("is_causal,alignment", CAUSAL, ids=CAUSAL_IDS)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_forward_and_backward(device, dtype, is_causal, alignment, case):
    if not head_dim_supported(device, case[5], case[6]):
        pytest.skip("head dim not compiled into this build")
    q, k, v = make_qkv(case, dtype, device)
    label = f"{dtype} {device} causal={is_causal}/{alignment} case={case}"
    check_forward(q, k, v, is_causal=is_causal, alignment=alignment, label=label)
    check_backward(q, k, v, is_causal=is_causal, alignment=alignment, label=label)


# On an H100 head dims 64, 96, 128 and 256 run the Hopper wgmma forward and
# backward (256: the column-split backward, then the query-major dQ kernel), 192
# its forward and 256's backward; the other head dims run the kernels of the next
# of them, zero-padded (32 -> 64, 160 -> 192, 200 -> 256; Lq > Lk bottom-right
# leaves whole query blocks seeing no key); attention_kernels(forward="mma", backward="mma") forces mma.sync,
# forward_block_rows=192 the Hopper forward of three consumer warpgroups (head dims 64 and 96; elsewhere it
# changes nothing), which by default serves calls without the causal rule and causal ones from 8k up. Checked
# on the same cases: lengths across several tiles and off the tile size,
# Dv != D, GQA, padded head dims, one query, a mask, unaligned rows
# (test_determinism.py runs the deterministic backward of the default family).
KERNEL_FAMILY_PARAMS = ["cpu-default", cuda_param("cuda-default"), cuda_param("cuda-mma"), cuda_param("cuda-rows192")]
KERNEL_CASES = [
    (2, 4, 2, 300, 520, 64, 64),
    (1, 2, 1, 200, 333, 256, 256),
    (1, 2, 2, 130, 260, 200, 256),
    (1, 2, 2, 129, 1000, 128, 128),
    (1, 3, 1, 257, 130, 128, 100),
    (2, 2, 2, 1, 77, 64, 48),
    (1, 1, 1, 640, 640, 60, 64),
    (1, 2, 2, 100, 140, 32, 32),
    (1, 2, 1, 200, 300, 96, 96),
    (2, 2, 1, 300, 400, 80, 80),
    (1, 2, 2, 150, 260, 192, 192),
    (2, 4, 2, 300, 520, 192, 128),
    (1, 3, 1, 260, 130, 256, 256),
]


@pytest.mark.parametrize("device_kernel", KERNEL_FAMILY_PARAMS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("is_causal,alignment", CAUSAL, ids=CAUSAL_IDS)
@pytest.mark.parametrize("case", KERNEL_CASES, ids=["b{}_h{}-{}_l{}-{}_d{}-{}".format(*c) for c in KERNEL_CASES])
def test_kernel_families(device_kernel, dtype, is_causal, alignment, case):
    device, kernel = device_kernel.split("-")
    family = "mma" if kernel == "mma" else "best"
    with attention_kernels(forward=family, backward=family, forward_block_rows=192 if kernel == "rows192" else 0):
        check_kernel_family(device, dtype, is_causal, alignment, case, f"{dtype} {device_kernel}")


# Rises of each row's largest score from one run of 40 keys to the next, in log2
# units, small and large, with falls between: across key tiles of 64, 80 and 128 a
# row's running max moves at some tiles and stays at others.
RISES_LOG2 = [0.0, 3.0, 7.9, 8.1, 2.0, 20.0, -30.0, 9.0, 0.5, 12.0, -5.0, 16.0, 1.0, 30.0, 4.0]


def neutral_tile_masks(B, Hq, Lq, Lk, dtype, device):
    """Masks whose tiles are mostly neutral (all True, or all zero), as models build them:
    padding by sequence length (bool and additive, one row broadcast or expanded over the
    queries), an explicit causal rule, and a full mask that is True but for one block."""
    lengths = torch.tensor([Lk, Lk * 5 // 8])
    keys = torch.arange(Lk)
    pad = (keys[None, :] < lengths[:, None]).view(B, 1, 1, Lk)
    low = torch.finfo(dtype).min if dtype.is_floating_point else float("-inf")
    pad_add = torch.zeros(B, 1, 1, Lk, dtype=dtype).masked_fill(~pad, low)
    causal = keys[None, :] <= torch.arange(Lq)[:, None] + (Lk - Lq)
    hf = torch.zeros(B, 1, Lq, Lk, dtype=dtype).masked_fill(~(causal & pad), low)
    block = torch.ones(B, Hq, Lq, Lk, dtype=torch.bool)
    block[:, 1, 40:90, 150:170] = False
    return {
        "padding": pad.to(device),
        "padding_expanded": pad.expand(B, 1, Lq, Lk).to(device),
        "padding_additive": pad_add.to(device),
        "padding_additive_f32": pad_add.float().to(device),
        "causal_2d": causal.to(device),
        "causal_padding_additive": hf.to(device),
        "block": block.to(device),
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("is_causal", [False, True], ids=["none", "causal"])
@pytest.mark.parametrize("scale", [None, -0.3], ids=["scale_default", "scale_negative"])
@pytest.mark.parametrize("mask_name", ["padding", "padding_expanded", "padding_additive", "padding_additive_f32",
                                       "causal_2d", "causal_padding_additive", "block"])
def test_masks_with_neutral_tiles(device, dtype, head_dim, is_causal, scale, mask_name):
    """Masks that leave whole tiles unchanged (padding, causal and block masks) over several
    query blocks and key tiles, alone and with is_causal: where a tile's mask changes no
    score and no bound cuts it, the Hopper kernels skip it (the forward then takes the plain
    arithmetic while the scale is positive); forward and gradients against float64 by the
    tolerance rule, with a positive and a negative scale."""
    B, Hq, Lq, Lk = 2, 4, 300, 400
    q, k, v = make_qkv((B, Hq, 2, Lq, Lk, head_dim, head_dim), dtype, device)
    mask = neutral_tile_masks(B, Hq, Lq, Lk, dtype, device)[mask_name]
    label = f"{dtype} hd{head_dim} mask={mask_name} causal={is_causal} scale={scale}"
    check_forward(q, k, v, mask=mask, is_causal=is_causal, alignment="bottom_right", scale=scale, label=label)
    check_backward(q, k, v, mask=mask, is_causal=is_causal, alignment="bottom_right", scale=scale, label=label)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("is_causal", [False, True])
def test_scores_rising_along_the_keys(device, dtype, head_dim, is_causal):
    if not head_dim_supported(device, head_dim, head_dim):
        pytest.skip("head dim not compiled into this build")
    g = torch.Generator().manual_seed(head_dim)
    B, H, L, D = 1, 2, 40 * len(RISES_LOG2), head_dim
    u = torch.randn(D, generator=g, dtype=torch.float64)
    u /= u.norm()
    # q . u = sqrt(D), so key j's score (scale 1/sqrt(D), log2 units) is about level[j] plus noise
    level = torch.tensor(RISES_LOG2, dtype=torch.float64).cumsum(0).repeat_interleave(40)
    q = 0.1 * torch.randn(B, H, L, D, generator=g, dtype=torch.float64) + D ** 0.5 * u
    k = 0.3 * torch.randn(B, H, L, D, generator=g, dtype=torch.float64) + (level / math.log2(math.e))[:, None] * u
    v = torch.randn(B, H, L, D, generator=g, dtype=torch.float64)
    q, k, v = (t.to(dtype=dtype, device=device) for t in (q, k, v))
    label = f"{dtype} {device} d={D} causal={is_causal}"
    check_forward(q, k, v, is_causal=is_causal, label=label)
    check_backward(q, k, v, is_causal=is_causal, label=label)


def test_attention_kernels_checks_its_choices():
    for kw in (dict(forward="fast"), dict(decode_splits=-2), dict(forward_ctas_per_sm=-2),
               dict(forward_ctas_per_sm=1.5), dict(forward_block_rows=64), dict(forward_block_rows=True)):
        name = next(iter(kw))
        with pytest.raises(ValueError, match=name):
            with attention_kernels(**kw):
                pass


@pytest.mark.parametrize("device", [cuda_param("cuda")])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256])
def test_persistent_forward_gives_the_same_bits(device, head_dim):
    """The Hopper forward on a persistent grid (one CTA per SM looping over
    the blocks of query rows, its barriers' phases running on from block to
    block, causal blocks in pairs of equal work) returns the bits of the
    one-CTA-per-block grid: plain, causal with GQA (an even and an odd number
    of blocks a head), with a mask tensor, with the score variants, a window
    alone, dropout, and a variable-length batch; each with more blocks than SMs. (Where the mma.sync forward runs,
    the choice changes nothing and the test compares a kernel with itself.)"""
    if not head_dim_supported(device, head_dim):
        pytest.skip("head dim not compiled into this build")
    torch.manual_seed(head_dim)
    dtype = torch.bfloat16
    q = torch.randn(4, 8, 1500, head_dim, device=device, dtype=dtype)
    k = torch.randn(4, 2, 1700, head_dim, device=device, dtype=dtype)
    v = torch.randn(4, 2, 1700, head_dim, device=device, dtype=dtype)
    mask = torch.rand(4, 1, 1500, 1700, device=device) > 0.3
    lens = [1, 700, 0, 1300, 129, 2000, 64]
    cu = torch.tensor([0] + lens, device=device).cumsum(0).to(torch.int32)
    qp, kp, vp = (torch.randn(sum(lens), 8, head_dim, device=device, dtype=dtype) for _ in range(3))
    calls = {
        "plain": lambda: torch_oss.attention_with_lse(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1)),
        "causal gqa": lambda: torch_oss.attention_with_lse(q, k, v, is_causal=True, enable_gqa=True),
        # 11 blocks of query rows a head: the persistent grid's middle block goes alone
        "causal odd": lambda: torch_oss.attention_with_lse(q[:, :, :1400], k, v, is_causal=True, enable_gqa=True),
        "mask": lambda: torch_oss.attention_with_lse(q, k, v, attn_mask=mask, enable_gqa=True),
        "variants": lambda: torch_oss.attention_with_lse(q, k, v, is_causal=True, enable_gqa=True,
                                                         window_size=(300, 0), softcap=20.0,
                                                         sinks=torch.randn(8, device=device)),
        # a window alone runs the plain kernel, its blocks by stride
        "causal window": lambda: torch_oss.attention_with_lse(q, k, v, is_causal=True, enable_gqa=True,
                                                              window_size=(300, 0)),
        "window": lambda: torch_oss.attention_with_lse(q, k, v, enable_gqa=True, window_size=(200, 90)),
        "dropout": lambda: torch_oss.attention_with_lse(q, k, v, is_causal=True, enable_gqa=True, dropout_p=0.2),
        "varlen": lambda: torch_oss.attention_varlen(qp, kp, vp, cu, cu, max(lens), max(lens), causal=True,
                                                     return_lse=True),
        # a narrower v (head dims (192, 128): its own Hopper kernel)
        "narrow v": lambda: torch_oss.attention_with_lse(q, k, v[..., :128], is_causal=True, enable_gqa=True),
    }
    # head dims 64 and 96: blocks of 128 and of 192 query rows (three consumer warpgroups)
    for rows, (name, call) in itertools.product((128, 192) if head_dim in (64, 96) else (0,), calls.items()):
        with attention_kernels(forward_ctas_per_sm=-1, forward_block_rows=rows):
            torch.manual_seed(0)
            want = call()
        with attention_kernels(forward_ctas_per_sm=1, forward_block_rows=rows):
            torch.manual_seed(0)
            got = call()
        for what, a, b in zip(("out", "lse"), got, want):
            assert torch.equal(a, b), f"{name} hd={head_dim} rows={rows}: {what} differs on the persistent grid"


def check_kernel_family(device, dtype, is_causal, alignment, case, name):
    if not head_dim_supported(device, case[5], case[6]):
        pytest.skip("head dim not compiled into this build")
    q, k, v = make_qkv(case, dtype, device)
    label = f"{name} causal={is_causal}/{alignment} case={case}"
    check_forward(q, k, v, is_causal=is_causal, alignment=alignment, label=label)
    check_backward(q, k, v, is_causal=is_causal, alignment=alignment, label=label)
    if case[3] == 300:  # with a mask tensor, and through unaligned rows (element loads)
        mask = mask_variants(case[0], case[1], case[3], case[4], dtype, device)["bool_full"]
        check_forward(q, k, v, mask=mask, is_causal=is_causal, alignment=alignment, label=label + " bool mask")
        check_backward(q, k, v, mask=mask, is_causal=is_causal, alignment=alignment, label=label + " bool mask")
        buf = torch.randn(1 + q.numel(), dtype=dtype, device=device)
        q_mis = buf[1:].view(q.shape)
        check_forward(q_mis, k, v, is_causal=is_causal, alignment=alignment, label=label + " misaligned q")
        check_backward(q_mis, k, v, is_causal=is_causal, alignment=alignment, label=label + " misaligned q")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_cpu_16bit_outputs_round_to_nearest(dtype, is_causal):
    """The CPU kernels compute in float32 (scores in float64) and round each
    16-bit output once: out, dq, dk and dv are the float64 results rounded to
    nearest, each within one ulp of ref64.to(dtype) and without bias (a
    truncating or biased store fails), wherever float32's own error (a few
    eps of the terms each element sums, times the square root of their
    number: float32 roundings of random sign) is below their ulp. The CUDA kernels round P and dS to 16 bits for the
    tensor cores, an error of several ulps of the output, so this holds on
    the CPU only; the tolerance rule checks both."""
    q, k, v = make_qkv((2, 4, 2, 150, 200, 64, 48), dtype, "cpu")
    dout = torch.randn(2, 4, 150, 48, dtype=dtype)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = torch_oss.attention(*leaves, is_causal=is_causal, enable_gqa=True)
    out.backward(dout)
    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref_out = attention_reference(*ref, None, is_causal, None, True, "top_left")[0]
    ref_out.backward(dout.double())
    f32 = torch.finfo(torch.float32).eps
    # |P| |V| summed over the keys: the terms of out (and, per key, of dv)
    q_wide, k_wide, v_wide, do_wide = (t.detach().double() for t in (q, k, v, dout))
    k_wide, v_wide = k_wide.repeat_interleave(2, 1), v_wide.repeat_interleave(2, 1)
    s = (q_wide @ k_wide.transpose(-1, -2)) / 8
    if is_causal:
        s = s.masked_fill(torch.ones(150, 200, dtype=torch.bool).triu(1), float("-inf"))
    p = torch.softmax(s, -1)
    out_terms = p @ v_wide.abs()
    assert_rounded_to_nearest(f"out {dtype}", out, ref_out, own_error=4 * 200 ** 0.5 * f32 * out_terms)
    dv_terms = (p.transpose(-1, -2) @ do_wide.abs()).unflatten(1, (2, 2)).sum(2)
    assert_rounded_to_nearest(f"dv {dtype}", leaves[2].grad, ref[2].grad, own_error=4 * 300 ** 0.5 * f32 * dv_terms)
    # dq and dk: sums of scale * P (|dP| + |D|) |k| (|q|)
    dp = do_wide @ v_wide.transpose(-1, -2)
    ds_terms = p * (dp.abs() + (p * dp).sum(-1, keepdim=True).abs()) / 8
    dq_terms = ds_terms @ k_wide.abs()
    dk_terms = (ds_terms.transpose(-1, -2) @ q_wide.abs()).unflatten(1, (2, 2)).sum(2)
    assert_rounded_to_nearest(f"dq {dtype}", leaves[0].grad, ref[0].grad, own_error=4 * 200 ** 0.5 * f32 * dq_terms)
    assert_rounded_to_nearest(f"dk {dtype}", leaves[1].grad, ref[1].grad, own_error=4 * 300 ** 0.5 * f32 * dk_terms)


def mask_variants(B, Hq, Lq, Lk, dtype, device):
    g = torch.Generator().manual_seed(1234)
    bool_full = torch.rand(B, Hq, Lq, Lk, generator=g) > 0.3
    bool_full[:, :, 0, :] = False  # a fully masked row
    bool_bcast = (torch.rand(Lq, Lk, generator=g) > 0.5)
    bool_keys = (torch.rand(B, 1, 1, Lk, generator=g) > 0.2)  # padding-style, broadcast over heads and queries
    add = torch.randn(1, Hq, Lq, Lk, generator=g, dtype=torch.float64)
    add[..., 1, :] = float("-inf")  # a fully masked row through -inf
    add[..., 2, ::2] = float("-inf")
    return {
        "bool_full": bool_full.to(device),
        "bool_broadcast_2d": bool_bcast.to(device),
        "bool_padding": bool_keys.to(device),
        "additive": add.to(dtype=dtype, device=device),
        "additive_f32": add.to(dtype=torch.float32, device=device),
        "additive_column": torch.randn(B, 1, Lq, 1, generator=g).to(dtype=dtype, device=device),
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("is_causal,alignment", CAUSAL, ids=CAUSAL_IDS)
@pytest.mark.parametrize("mask_name", ["bool_full", "bool_broadcast_2d", "bool_padding", "additive", "additive_f32",
                                       "additive_column"])
def test_masks(device, dtype, is_causal, alignment, mask_name):
    case = (2, 4, 2, 67, 131, 64, 64)
    q, k, v = make_qkv(case, dtype, device)
    mask = mask_variants(2, 4, 67, 131, dtype, device)[mask_name]
    label = f"{dtype} {device} mask={mask_name} causal={is_causal}/{alignment}"
    out, lse = check_forward(q, k, v, mask=mask, is_causal=is_causal, alignment=alignment, label=label)
    check_backward(q, k, v, mask=mask, is_causal=is_causal, alignment=alignment, label=label)
    if mask_name in ("bool_full", "additive"):
        row = 0 if mask_name == "bool_full" else 1
        assert (out[:, :, row] == 0).all() and torch.isneginf(lse[:, :, row]).all()


@pytest.mark.parametrize("device", [cuda_param("cuda")])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("is_causal,alignment", [(False, "top_left"), (True, "bottom_right")], ids=["none", "causal"])
@pytest.mark.parametrize("mask_name", ["bool_full", "bool_broadcast_2d", "bool_padding", "additive", "additive_f32"])
def test_masks_with_aligned_rows(device, dtype, head_dim, is_causal, alignment, mask_name):
    """Masks whose strides the copy engine can address (272 keys: rows of 16-byte multiples
    in every mask dtype) reach the Hopper forward in tiles through shared memory where they
    fit there: against float64 by the tolerance rule, over several query blocks and key
    tiles (the last of each partial), and bit for bit equal to the same mask read element by
    element (its rows 16 bytes + one element apart, which the copy engine cannot address):
    out and lse, and with a bool mask dk and dv too."""
    B, Hq, Lq, Lk = 2, 4, 150, 272
    q, k, v = make_qkv((B, Hq, 2, Lq, Lk, head_dim, head_dim), dtype, device)
    mask = mask_variants(B, Hq, Lq, Lk, dtype, device)[mask_name]
    label = f"{dtype} hd{head_dim} mask={mask_name} causal={is_causal}"
    check_forward(q, k, v, mask=mask, is_causal=is_causal, alignment=alignment, label=label)
    check_backward(q, k, v, mask=mask, is_causal=is_causal, alignment=alignment, label=label)
    pitch = Lk + 16 // mask.element_size() + 1
    unaligned = torch.zeros(*mask.shape[:-1], pitch, dtype=mask.dtype, device=device)[..., :Lk]
    unaligned.copy_(mask)
    dout = torch.randn(B, Hq, Lq, head_dim, dtype=dtype, device=device)
    results = []
    for m in (mask, unaligned):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out, lse = torch_oss.attention_with_lse(*leaves, attn_mask=m, is_causal=is_causal, enable_gqa=True,
                                                causal_alignment=alignment)
        out.backward(dout)
        results.append((out, lse, leaves[1].grad, leaves[2].grad))  # dq's sums run in no fixed order
    # an additive mask's values may join the scaled scores with or without a fused multiply-add
    # in the backward's kernels (one rounding apart; check_backward judged both), bool masks'
    # 0 and -inf the same either way
    names = ("out", "lse", "dk", "dv") if mask.dtype == torch.bool else ("out", "lse")
    for name, a, b in zip(names, *results):
        assert torch.equal(a, b), f"{label}: {name} differs between the mask's tiles and its elements"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_fully_masked_rows_give_zero_output_and_gradients(device, dtype):
    q, k, v = make_qkv((1, 2, 2, 20, 30, 64, 64), dtype, device, requires_grad=True)
    mask = torch.ones(20, 30, dtype=torch.bool, device=device)
    mask[3] = False
    mask[7:9] = False
    out, lse = torch_oss.attention_with_lse(q, k, v, attn_mask=mask)
    out.sum().backward()
    assert (out[:, :, [3, 7, 8]] == 0).all() and torch.isneginf(lse[:, :, [3, 7, 8]]).all()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert (q.grad[:, :, [3, 7, 8]] == 0).all()
    # bottom-right causal with len_q > len_k: the first len_q - len_k rows see nothing
    q2, k2, v2 = make_qkv((1, 2, 2, 40, 25, 64, 64), dtype, device, requires_grad=True)
    out2, lse2 = torch_oss.attention_with_lse(q2, k2, v2, is_causal=True, causal_alignment="bottom_right")
    out2.sum().backward()
    assert (out2[:, :, :15] == 0).all() and torch.isneginf(lse2[:, :, :15]).all()
    assert all(torch.isfinite(t.grad).all() for t in (q2, k2, v2))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_strided_inputs_blhd_layout(device, dtype):
    B, L, H, D = 2, 75, 4, 64
    qkv = torch.randn(B, L, 3, H, D, dtype=dtype, device=device)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # (B, H, L, D) views, no copies
    assert q.stride(-1) == 1 and not q.is_contiguous()
    check_forward(q, k, v, is_causal=True, label="BLHD views")
    check_backward(q, k, v, is_causal=True, label="BLHD views")
    # a last dim that is not unit-stride is accepted too (copied)
    q_odd = torch.randn(B, H, L, D * 2, dtype=dtype, device=device)[..., ::2]
    check_forward(q_odd, k, v, label="strided last dim")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_outputs_keep_the_blhd_layout(device, dtype):
    """(B, L, H, D) memory seen as (B, H, L, D), as a projection's
    .view(B, L, H, D).transpose(1, 2) gives it: out comes back as the same view
    of (B, L, H, Dv) memory (as SDPA's kernels return it), so that
    out.transpose(1, 2) is contiguous, and dq, dk, dv in their inputs'
    layouts; contiguous inputs keep contiguous results. The values are the
    contiguous call's, bit for bit (deterministic backward)."""
    B, L, Hq, Hkv, D, Dv = 2, 37, 4, 2, 64, 32
    xs = [torch.randn(B, L, h, d, dtype=dtype, device=device) for h, d in ((Hq, D), (Hkv, D), (Hkv, Dv))]
    q, k, v = (x.transpose(1, 2).requires_grad_() for x in xs)
    out = torch_oss.attention(q, k, v, is_causal=True, enable_gqa=True, deterministic=True)
    assert out.shape == (B, Hq, L, Dv) and out.transpose(1, 2).is_contiguous(), out.stride()
    dout = torch.randn(B, L, Hq, Dv, dtype=dtype, device=device).transpose(1, 2)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    for name, g, t in zip(("dq", "dk", "dv"), grads, (q, k, v)):
        assert g.stride() == t.stride(), f"{name}: strides {g.stride()}, input {t.stride()}"
    qc, kc, vc = (t.detach().contiguous().requires_grad_() for t in (q, k, v))
    out_c = torch_oss.attention(qc, kc, vc, is_causal=True, enable_gqa=True, deterministic=True)
    assert out_c.is_contiguous() and torch.equal(out_c, out)
    grads_c = torch.autograd.grad(out_c, (qc, kc, vc), dout.contiguous())
    for name, g, g_c in zip(("dq", "dk", "dv"), grads, grads_c):
        assert g_c.is_contiguous() and torch.equal(g_c, g), name
    # the Hugging Face attention function's transpose back is then free
    assert out.transpose(1, 2).contiguous().data_ptr() == out.data_ptr()


@pytest.mark.parametrize("device", DEVICES)
def test_misaligned_pointers(device):
    buf = torch.randn(1 + 2 * 3 * 50 * 40, dtype=torch.float16, device=device)
    q = buf[1:].view(2, 3, 50, 40)  # data pointer off 16-byte alignment
    k = torch.randn(2, 3, 61, 40, dtype=torch.float16, device=device)
    v = torch.randn(2, 3, 61, 40, dtype=torch.float16, device=device)
    check_forward(q, k, v, label="misaligned q")
    check_backward(q, k, v, label="misaligned q")


@pytest.mark.parametrize("device", DEVICES)
def test_custom_scale_and_sdpa_semantics(device):
    q, k, v = make_qkv((2, 3, 3, 33, 47, 32, 32), torch.float32, device)
    for scale in (0.05, 1.0, 0.0):
        check_forward(q, k, v, scale=scale, label=f"scale={scale}")
    check_backward(q, k, v, scale=0.3, is_causal=True, label="scale=0.3")
    # same value as SDPA itself where SDPA has the same semantics
    torch.testing.assert_close(torch_oss.attention(q, k, v, is_causal=True),
                               F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=2e-5, rtol=1e-4)
    # 3-D (N, L, E) inputs, as SDPA accepts
    q3, k3, v3 = (t[:, 0] for t in (q, k, v))
    torch.testing.assert_close(torch_oss.attention(q3, k3, v3), F.scaled_dot_product_attention(q3, k3, v3),
                               atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_causal_bias_objects_select_alignment(device):
    from torch.nn.attention.bias import causal_lower_right, causal_upper_left

    q, k, v = make_qkv((1, 2, 2, 9, 20, 32, 32), torch.float32, device)
    lower = torch_oss.attention(q, k, v, attn_mask=causal_lower_right(9, 20))
    upper = torch_oss.attention(q, k, v, attn_mask=causal_upper_left(9, 20))
    torch.testing.assert_close(lower, torch_oss.attention(q, k, v, is_causal=True, causal_alignment="bottom_right"))
    torch.testing.assert_close(upper, torch_oss.attention(q, k, v, is_causal=True))
    ref_lower, _ = attention_reference(q, k, v, is_causal=True, alignment="bottom_right")
    assert_tolerance("causal_lower_right", lower, ref_lower, None, 1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_empty_and_zero_length(device, dtype):
    q, k, v = make_qkv((2, 2, 2, 0, 5, 32, 32), dtype, device, requires_grad=True)
    out = torch_oss.attention(q, k, v)
    assert out.shape == (2, 2, 0, 32)
    out.sum().backward()
    assert (k.grad == 0).all() and (v.grad == 0).all()
    q, k, v = make_qkv((2, 2, 2, 4, 0, 32, 32), dtype, device)
    out, lse = torch_oss.attention_with_lse(q, k, v)
    assert (out == 0).all() and torch.isneginf(lse).all()
    q, k, v = make_qkv((0, 2, 2, 4, 4, 32, 32), dtype, device)
    assert torch_oss.attention(q, k, v).shape == (0, 2, 4, 32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_autograd_node_only_when_differentiated(device, dtype):
    # a call nothing will differentiate skips the autograd node (host cost);
    # otherwise the node's gradients match the float64 reference's (the
    # tolerance rule, PyTorch's SDPA as the peer) for any subset of q, k, v
    # requiring grad (bfloat16 goes through attention_with_residual)
    q, k, v = make_qkv((2, 4, 2, 9, 13, 32, 32), dtype, device)
    mask = torch.rand(2, 1, 9, 13, device=device) > 0.2
    out = torch_oss.attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert out.grad_fn is None and not out.requires_grad
    with torch.no_grad():
        out = torch_oss.attention(q.requires_grad_(), k, v, attn_mask=mask, enable_gqa=True)
    assert out.grad_fn is None
    dout = torch.randn(2, 4, 9, 32, dtype=dtype, device=device)
    for needs in ((True, False, False), (False, True, True), (True, True, True)):
        grads = {}
        for name in ("ours", "peer", "ref"):
            leaves = [t.detach().to(torch.float64 if name == "ref" else dtype).requires_grad_(n)
                      for t, n in zip((q, k, v), needs)]
            if name == "ours":
                out, lse = torch_oss.attention_with_lse(*leaves, attn_mask=mask, enable_gqa=True)
                assert out.grad_fn is not None and lse.grad_fn is out.grad_fn
            elif name == "peer":
                out = sdpa_peer(*leaves, mask, False, None, True, "top_left")
            else:
                out = attention_reference(*leaves, mask, False, None, True, "top_left")[0]
            grads[name] = torch.autograd.grad(out, [t for t in leaves if t.requires_grad], dout.to(out.dtype))
        for i, (ours, peer, ref) in enumerate(zip(grads["ours"], grads["peer"], grads["ref"])):
            assert_tolerance(f"grad {i} of {needs} {dtype} {device}", ours, ref, peer, ATTENTION_ATOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
def test_backward_is_deterministic(device):
    q, k, v = make_qkv((2, 8, 2, 150, 150, 64, 64), torch.bfloat16 if device == "cuda" else torch.float32, device)
    dout = torch.randn(2, 8, 150, 64, dtype=q.dtype, device=device)
    grads = []
    torch.use_deterministic_algorithms(True)
    try:
        for _ in range(3):
            leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
            torch_oss.attention(*leaves, is_causal=True, enable_gqa=True).backward(dout)
            grads.append([t.grad for t in leaves])
    finally:
        torch.use_deterministic_algorithms(False)
    for other in grads[1:]:
        for a, b in zip(grads[0], other):
            assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_float64(device):
    for case, kwargs in (
        ((1, 2, 1, 5, 7, 8, 6), dict(is_causal=True, causal_alignment="bottom_right", enable_gqa=True)),
        ((2, 1, 1, 6, 4, 5, 5), dict(attn_mask=torch.randn(6, 4, dtype=torch.float64, device=device))),
        ((1, 2, 2, 4, 9, 4, 4), dict(attn_mask=torch.rand(1, 2, 4, 9, device=device) > 0.3, is_causal=True)),
    ):
        q, k, v = make_qkv(case, torch.float64, device, requires_grad=True)
        assert torch.autograd.gradcheck(lambda a, b, c: torch_oss.attention(a, b, c, **kwargs), (q, k, v))


@pytest.mark.parametrize("device", DEVICES)
def test_lse_is_differentiable_and_mask_grad_rejected(device):
    q, k, v = make_qkv((1, 1, 1, 4, 4, 8, 8), torch.float32, device, requires_grad=True)
    out, lse = torch_oss.attention_with_lse(q, k, v)
    assert out.requires_grad and lse.requires_grad
    mask = torch.zeros(4, 4, device=device, requires_grad=True)
    with pytest.raises(NotImplementedError, match="attn_mask"):
        torch_oss.attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("device", DEVICES)
def test_outputs_do_not_alias_inputs(device):
    q, k, v = make_qkv((1, 1, 1, 4, 4, 8, 8), torch.float32, device)
    out, lse = torch_oss.attention_with_lse(q, k, v)
    ptrs = {t.data_ptr() for t in (q, k, v)}
    assert out.data_ptr() not in ptrs and lse.data_ptr() not in ptrs


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA_OK, reason="needs CUDA")
def test_no_quadratic_memory_at_16k():
    B, H, N, D = 1, 4, 16384, 64
    q, k, v = (torch.randn(B, H, N, D, dtype=torch.bfloat16, device="cuda", requires_grad=True) for _ in range(3))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = torch_oss.attention(q, k, v, is_causal=True)
    out.backward(torch.randn_like(out))
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    io_bytes = 7 * B * H * N * D * 2  # out, dout, dq, dk, dv (+ slack)
    n_by_n = B * H * N * N * 2
    assert extra < io_bytes + 16 * B * H * N * D * 4, f"peak extra memory {extra / 2**20:.1f} MiB"
    assert extra < n_by_n / 8


# ---------------------------------------------------------------------------
# opcheck and compile
# ---------------------------------------------------------------------------


def attention_samples(device):
    samples = []
    for case, mask, causal, gqa, align in (
        ((1, 2, 2, 5, 7, 8, 8), None, False, False, "top_left"),
        ((2, 4, 2, 6, 6, 16, 8), None, True, True, "bottom_right"),
        ((1, 2, 1, 4, 9, 8, 8), "bool", True, True, "top_left"),
        ((1, 1, 1, 3, 5, 4, 4), "float", False, False, "top_left"),
    ):
        for dtype in (torch.float32, torch.float64):
            q, k, v = make_qkv(case, dtype, device, requires_grad=True)
            m = None
            if mask == "bool":
                m = torch.rand(case[3], case[4], device=device) > 0.3
            elif mask == "float":
                m = torch.randn(case[0], 1, case[3], case[4], dtype=dtype, device=device)
            samples.append((q, k, v, m, causal, 0.5 if mask else None, gqa, align))
    q, k, v, *rest = samples[2]
    samples.append((*(blhd(t) for t in (q, k, v)), *rest))  # out and the gradients in that layout
    return samples


def blhd(t):
    """t's values in (B, L, H, D) memory, seen as (B, H, L, D)."""
    return t.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_(t.requires_grad)


def residual_samples(device):
    """16-bit inputs for the training form of the op (attention_with_residual)."""
    samples = []
    for case, mask, causal, gqa, align in (((1, 2, 2, 5, 7, 8, 8), None, False, False, "top_left"),
                                           ((1, 4, 2, 6, 9, 16, 8), "bool", True, True, "bottom_right")):
        for dtype in (torch.float16, torch.bfloat16):
            q, k, v = make_qkv(case, dtype, device, requires_grad=True)
            m = torch.rand(case[3], case[4], device=device) > 0.3 if mask == "bool" else None
            samples.append((q, k, v, m, causal, None, gqa, align))
    q, k, v, *rest = samples[-1]
    samples.append((*(blhd(t) for t in (q, k, v)), *rest))  # out and its residual in that layout
    return samples


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["attention", "attention_with_residual"])
def test_opcheck(device, op):
    """Each forward op, and the backward fed with its outputs (the residual
    too, where the op returns one)."""
    forward = getattr(torch.ops.oss, op)
    for args in (attention_samples if op == "attention" else residual_samples)(device):
        torch.library.opcheck(forward.default, args)
        q, k, v, m, causal, scale, gqa, align = args
        out, lse, *residual = forward(q.detach(), k.detach(), v.detach(), m, causal, scale, gqa, align)
        bwd_args = (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out, lse, m, causal, scale, gqa,
                    align, False, *residual)
        torch.library.opcheck(torch.ops.oss.attention_backward.default, bwd_args)


# (case, with a bool mask and causal): the masked kernels' per-pair stores, and
# the plain kernels at 128 and 192 columns, whose epilogue stores 16 bytes a lane
RESIDUAL_CASES = [((2, 4, 2, 67, 130, 64, 40), True), ((1, 4, 4, 200, 300, 128, 128), False),
                  ((1, 2, 2, 130, 140, 192, 192), False)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case,masked", RESIDUAL_CASES, ids=["mask_d64-40", "d128", "d192"])
def test_output_residual(device, dtype, case, masked):
    """attention_with_residual gives attention's out and lse bit for bit, and a
    residual (int8 codes of steps of 2^-5 of out's last place) of at most half
    a unit in the last place of out that brings out closer to the float64
    output (it is the output before its rounding)."""
    if not head_dim_supported(device, case[5], case[6]):
        pytest.skip("head dim not compiled")
    torch.manual_seed(0)
    q, k, v = make_qkv(case, dtype, device)
    Lq, Lk = case[3], case[4]
    m = torch.rand(Lq, Lk, device=device) > 0.2 if masked else None
    args = (q, k, v, m, masked, None, True, "bottom_right")
    out, lse = torch.ops.oss.attention(*args)
    out_t, lse_t, code = torch.ops.oss.attention_with_residual(*args)
    assert torch.equal(out, out_t) and torch.equal(lse, lse_t)
    assert code.shape == out.shape and code.dtype == torch.int8 and code.device == out.device
    # int8 counts of a step of 2^-5 of out's unit in the last place (that of the
    # smallest normal below it): at most half a unit, 16 steps
    assert code.abs().max() <= 16
    mantissa_bits = 10 if dtype == torch.float16 else 7
    exponent = out.double().abs().clamp(min=torch.finfo(dtype).smallest_normal).log2().floor()
    res = code.double() * (exponent - mantissa_bits - 5).exp2()
    assert torch.equal(output_residual_value(code, out).double(), res)
    assert torch.count_nonzero(code) > code.numel() // 2  # not all rounded away
    ref = attention_reference(*(t.double() for t in (q, k, v)), m, masked, None, True, "bottom_right")[0]
    err_out = (out.double() - ref).abs().mean().item()
    err_sum = (out.double() + res.double() - ref).abs().mean().item()
    # CPU: the unrounded output is float, far closer than out. CUDA: it is the
    # float32 accumulator of P V with P rounded to 16 bits for the tensor cores,
    # whose own error is of the order of out's rounding (float64 emulation of
    # this case with out = o / l: out + residual has 0.67x out's mean error;
    # the kernels' out = o / lr passes the same limit on the H100)
    limit = 0.5 if device == "cpu" else 0.85
    assert err_sum < err_out * limit, f"out + residual {err_sum:.3e} vs out {err_out:.3e} (mean errors)"
    # float32/float64 have no residual (their backward computes D itself)
    out32, _, res32 = torch.ops.oss.attention_with_residual(q.float(), k.float(), v.float(), m, True, None, True,
                                                           "bottom_right")
    assert res32.numel() == 0 and res32.dtype == torch.int8 and out32.dtype == torch.float32


RESIDUAL_RULE_PROBE = r"""
#include <stdio.h>
#include <stdlib.h>
#include "oss_internal.h"
/* x rounded to bfloat16 (to nearest even; NaN kept NaN) or float16 */
static float round16(float x, int bf16) {
  if (!bf16) return (float)(_Float16)x;
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) u = (u & 0x7fffffu) ? (u | 0x400000u) & 0xffff0000u : u;
  else u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  memcpy(&x, &u, 4);
  return x;
}
/* the rule's definition */
static float defined(float x, float rounded, int bf16) {
  if (!isfinite(rounded)) return 0.f;
  const int step = ilogbf(fmaxf(fabsf(rounded), bf16 ? 0x1p-126f : 0x1p-14f)) - (bf16 ? 7 : 10) - OSS_RESIDUAL_BITS;
  return ldexpf(rintf(ldexpf(x - rounded, -step)), step);
}
int main(int argc, char **argv) {
  const uint64_t stride = strtoull(argv[1], 0, 10);
  unsigned long long bad = 0;
  for (int bf16 = 0; bf16 < 2; bf16++)
    for (uint64_t i = 0; i < (1ull << 32); i += (i >> 23 & 0xff) < 2 || (i >> 23 & 0xff) > 240 ? 1 : stride) {
      const uint32_t u = (uint32_t)i;
      float x, a, b;
      memcpy(&x, &u, 4);
      const float r = round16(x, bf16);
      const int k = oss_output_residual_code(x, r, bf16);
      a = oss_output_residual_value(k, r, bf16);
      b = defined(x, r, bf16);
      /* the code's value is the definition (a zero is +0), and the code fits int8 */
      if ((a != b || k < -16 || k > 16) && !(isnan(a) && isnan(b)) && bad++ < 5)
        printf("bf16=%d x=%a: code %d = %a, defined %a\n", bf16, x, k, a, b);
    }
  printf("mismatches %llu\n", bad);
  return bad != 0;
}
"""


def test_output_residual_rule_matches_its_definition(tmp_path):
    """oss_output_residual_code (branch-free: it runs on every element of a
    training forward's output) gives a code in -16 .. 16 whose value
    (oss_output_residual_value) equals the definition, ldexp(rint(ldexp(d,
    -step)), step), exactly: every float32 whose exponent field is among the
    lowest two or above 240 (denormals, the huge values whose step is scaled)
    and a stride through the rest, both 16-bit formats. Compiled with the
    system's C compiler (skipped without one)."""
    import pathlib
    import shutil
    import subprocess

    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("needs a C compiler")
    src, exe = tmp_path / "residual_probe.c", tmp_path / "residual_probe"
    src.write_text(RESIDUAL_RULE_PROBE)
    csrc = pathlib.Path(__file__).resolve().parents[1] / "csrc"
    subprocess.run([cc, "-O2", "-std=c11", f"-I{csrc}", str(src), "-o", str(exe), "-lm"], check=True, timeout=120)
    done = subprocess.run([str(exe), "97"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_output_residual_helpers_match_the_definition(device, dtype):
    """torch_oss._residual (the rule in tensor operations, for code that merges
    outputs itself) gives the definition's codes, rint(d / 2^step), and their
    values: float32 values across the 16-bit type's range (subnormal, huge,
    exact ties between two 16-bit neighbours, zeros, infinities and NaN)."""
    torch.manual_seed(3)
    fi = torch.finfo(dtype)
    mags = torch.cat([torch.logspace(-45, 38, 4001, base=10.0, dtype=torch.float64).float(),
                      torch.rand(4000) * 10, torch.tensor([0.0, fi.max, fi.smallest_normal, fi.tiny / 4])])
    x = torch.cat([mags, -mags]).float()
    x = torch.cat([x, x * (1 + torch.rand_like(x) * 2 ** -6)])
    # exact ties: the midpoint of a 16-bit value and the next one up
    base = (torch.rand(2000) * 100).to(dtype)
    ties = (base.float() + torch.nextafter(base, torch.tensor(float("inf"), dtype=dtype)).float()) / 2
    x = torch.cat([x, ties, torch.tensor([float("inf"), float("-inf"), float("nan")])]).to(device)
    rounded = x.to(dtype)
    code = output_residual_code(x, rounded)
    assert code.dtype == torch.int8
    r = rounded.double()
    finite = torch.isfinite(r)
    _, e = torch.frexp(torch.where(finite, r.abs().clamp(min=fi.smallest_normal), torch.ones_like(r)))
    step = (e - 1) - (10 if dtype == torch.float16 else 7) - 5
    k = torch.where(finite, torch.round(torch.ldexp(x.double() - r, -step)), torch.zeros_like(r))
    assert torch.equal(code.long(), k.long()), (x[code.long() != k.long()][:5], code[code.long() != k.long()][:5])
    assert code.abs().max() <= 16
    # a tie is half a last place from both neighbours: 16 steps (8 where it rounds up to a power of 2)
    assert (code[-ties.numel() - 3:-3].abs() >= 8).all()
    value = output_residual_value(code, rounded)
    assert torch.equal(value.double(), torch.ldexp(k, step))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_backward_with_residual(device, dtype):
    """Scores large enough that each query sees about one key: there the error
    of D = rowsum(dO * O) from the rounded output dominates dq and dk, and the
    residual removes it (float64 emulation of the CUDA kernels' roundings:
    1.7-2.9x lower RMS error). The CPU backward computes D = sum P dP itself,
    so there it must give the same gradients with and without the residual."""
    torch.manual_seed(1)
    q, k, v = make_qkv((2, 4, 2, 64, 200, 64, 64), dtype, device)
    q, k = q * 3, k * 3
    dout = torch.randn(2, 4, 64, 64, dtype=dtype, device=device)
    out, lse, res = torch.ops.oss.attention_with_residual(q, k, v, None, False, None, True, "top_left")
    grads = {}
    for name, r in (("without", None), ("with", res)):
        grads[name] = torch.ops.oss.attention_backward(dout, q, k, v, out, lse, None, False, None, True, "top_left",
                                                       False, r)
    if device == "cpu":
        for a, b in zip(grads["without"], grads["with"]):
            assert torch.equal(a, b)
        return
    leaves = [t.double().requires_grad_(True) for t in (q, k, v)]
    attention_reference(*leaves, None, False, None, True, "top_left")[0].backward(dout.double())
    for i, name in enumerate(("dq", "dk")):
        rms = {w: (grads[w][i].double() - leaves[i].grad).pow(2).mean().sqrt().item() for w in grads}
        assert rms["with"] * 1.5 < rms["without"], f"{name} {dtype}: RMS error {rms}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 80])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_backward_equal_value_rows(device, dtype, head_dim, is_causal):
    """Every key's value row the same: out is that row whatever the weights,
    and dq = dk = 0 (dP_j = dO.v is the same for every key, so dP - D = 0).
    The 16-bit forward must normalise by the sum of the rounded P it
    multiplies V with; otherwise out's rounding residual carries P's rounding
    error into D and dq, dk come out at up to 1e-1 (as the GPU fuzz found).
    The residual itself must be 0: its step of 2^-5 ulp drops the float32
    sums' noise, which would otherwise reach dq, dk at values of ~20."""
    q, k, v = make_qkv((2, 4, 2, 45, 150, head_dim, head_dim), dtype, device)
    v_rows = v[:, :, :1].expand_as(v)
    for v_case in (v_rows, v_rows.contiguous()):
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v_case)]
        out = torch_oss.attention(*leaves, is_causal=is_causal, enable_gqa=True)
        assert torch.equal(out, v_rows[:, :, :1].expand(-1, -1, 45, -1).repeat_interleave(2, dim=1))
        # out before its rounding is that row to a few float32 ulps, far below the residual's step
        _, _, res = torch.ops.oss.attention_with_residual(q, k, v_case, None, is_causal, None, True, "top_left")
        assert torch.count_nonzero(res) == 0, f"{torch.count_nonzero(res)} nonzero residuals"
        out.backward(torch.randn_like(out))
        for name, grad in (("dq", leaves[0].grad), ("dk", leaves[1].grad)):
            assert_tolerance(f"{name} {dtype}", grad, torch.zeros_like(grad, dtype=torch.float64), None,
                             ATTENTION_ATOL[dtype])


# (batch, heads_q, heads_kv, len_q, len_k, head_dim): on an H100 the wgmma
# backward (64, 128; 40 padded to 64) and the mma.sync one (131 -> 160 and
# 200 -> 256 padded, two dK column slices), lengths off the blocks, GQA
CENTRING_CASES = [
    (2, 4, 2, 200, 173, 64),
    (1, 2, 1, 150, 300, 128),
    (1, 2, 2, 97, 130, 40),
    (1, 3, 1, 70, 210, 131),
    (1, 2, 2, 80, 90, 200),
]


@pytest.mark.parametrize("device", [cuda_param("cuda")])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("mode", ["default", "mma", "deterministic"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", CENTRING_CASES, ids=["b{}_h{}-{}_l{}-{}_d{}".format(*c) for c in CENTRING_CASES])
def test_backward_dq_is_zero_for_equal_keys(device, dtype, mode, is_causal, case):
    """K's rows all equal: dq = sum_j dS_ij k = 0, since dS's rows sum to 0.
    The 16-bit kernels multiply K by dS rounded to 16 bits, whose rows do not
    sum to 0, so dq would be that rounding times k (the GPU fuzz's last noise
    class, 3 failures in 18,205 backward cases). They compute it as
    rounded dS (K - kbar) instead, kbar the kv head's mean K row, which is 0
    here; attention_kernels(dq_centring=False) turns that off, and the error
    must then be at least 100x larger."""
    B, Hq, Hkv, Lq, Lk, D = case
    if not head_dim_supported(device, D):
        pytest.skip("head dim not compiled into this build")
    q, k, v = make_qkv((B, Hq, Hkv, Lq, Lk, D, D), dtype, device)
    k = k[:, :, :1].expand_as(k)
    dout = torch.randn(B, Hq, Lq, D, dtype=dtype, device=device)
    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    attention_reference(*ref, None, is_causal, None, True, "top_left")[0].backward(dout.double())
    assert ref[0].grad.abs().max().item() < 1e-12  # dq is 0 (to float64 rounding)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(mode == "deterministic")
    try:
        errors, grads = {}, {}
        for centring in ("1", "0"):
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            with attention_kernels(backward="mma" if mode == "mma" else "best", dq_centring=centring == "1"):
                torch_oss.attention(*leaves, is_causal=is_causal, enable_gqa=True).backward(dout)
            errors[centring] = leaves[0].grad.double().abs().max().item()
            grads[centring] = [t.grad for t in leaves]
    finally:
        torch.use_deterministic_algorithms(previous)
    label = f"dq {dtype} {mode} causal={is_causal} {case}: max error {errors}"
    assert errors["0"] > 0, label  # the case must have roundings to remove
    assert errors["1"] <= 0.01 * errors["0"], label
    for name, i in (("dk", 1), ("dv", 2)):  # the centring leaves them alone
        assert torch.equal(grads["1"][i], grads["0"][i]), f"{name} {dtype} {mode} changed with the centring"


@pytest.mark.parametrize("device", DEVICES)
def test_backward_residual_errors(device):
    q, k, v = make_qkv((1, 2, 2, 5, 7, 8, 8), torch.float16, device)
    out, lse, res = torch.ops.oss.attention_with_residual(q, k, v)
    dout = torch.randn_like(out)

    def bwd(q, k, v, out, lse, r):
        return torch.ops.oss.attention_backward(dout.to(q.dtype), q, k, v, out, lse, None, False, None, False,
                                                "top_left", False, r)

    with pytest.raises(ValueError, match="out_residual has shape"):
        bwd(q, k, v, out, lse, res[..., :4])
    with pytest.raises(TypeError, match="out_residual.dtype"):
        bwd(q, k, v, out, lse, res.to(torch.bfloat16))
    with pytest.raises(ValueError, match="out_residual is on"):
        bwd(q, k, v, out, lse, res.to("meta"))
    q_f, k_f, v_f = (t.float() for t in (q, k, v))
    out_f, lse_f = torch.ops.oss.attention(q_f, k_f, v_f)
    with pytest.raises(ValueError, match="out_residual is only for float16/bfloat16"):
        bwd(q_f, k_f, v_f, out_f, lse_f, out_f.clone())


class TinyBlock(torch.nn.Module):
    """Attention + MLP block using both torch_oss ops."""

    def __init__(self, dim=32, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, dim // heads
        self.q = torch.nn.Linear(dim, dim)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * self.hd)
        self.o = torch.nn.Linear(dim, dim)
        self.gate = torch.nn.Linear(dim, 8)

    def forward(self, x, use_oss=True):
        B, L, _ = x.shape
        q = self.q(x).view(B, L, self.heads, self.hd).transpose(1, 2)
        k, v = self.kv(x).view(B, L, 2, self.kv_heads, self.hd).unbind(2)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        attn = torch_oss.attention if use_oss else F.scaled_dot_product_attention
        sm = torch_oss.softmax if use_oss else F.softmax
        y = attn(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2).reshape(B, L, -1)
        return self.o(y) * sm(self.gate(x), -1).sum(-1, keepdim=True)


def test_compile_caches_carry_the_fakes_tag():
    """torch.compile's cache keys carry a hash of the fake functions, so a graph
    compiled against other fakes (another output layout, say) is compiled
    again rather than reused; the tag joins a user's own tag once."""
    from torch_oss import _registrations

    tag = _registrations.cache_tag()
    assert tag.startswith("torch_oss-") and tag in torch.compiler.config.cache_key_tag.split()
    with torch.compiler.config.patch(cache_key_tag="mine"):
        _registrations._tag_compile_caches()
        _registrations._tag_compile_caches()
        assert torch.compiler.config.cache_key_tag.split() == ["mine", tag]


@pytest.mark.parametrize("device", DEVICES)
def test_compile_module_fullgraph(device):
    torch.manual_seed(0)
    block = TinyBlock().to(device)
    x = torch.randn(2, 19, 32, device=device)
    compiled = torch.compile(block, fullgraph=True)
    out = compiled(x)
    out.square().mean().backward()
    grads = [p.grad.clone() for p in block.parameters()]
    block.zero_grad()
    expected = block(x, use_oss=False)
    expected.square().mean().backward()
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
    for g, p in zip(grads, block.parameters()):
        torch.testing.assert_close(g, p.grad, atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("device", [cuda_param("cuda")])
def test_compile_reduce_overhead_next_to_other_ops(device):
    """Our ops between other ops in one graph, compiled with CUDA graphs
    (reduce-overhead), forward and backward, warmed up, recorded and replayed
    on fresh inputs: every output and gradient against the float64 reference
    by the tolerance rule (the same function through SDPA and F.softmax in
    bfloat16 as PyTorch's peer)."""
    def f(q, k, v, attn, sm):
        q = q * 1.5 + 0.1  # other ops around ours, same graph, captured in a CUDA graph
        out = attn(q, k, v, is_causal=True)
        return sm(out.float(), -1) * 2

    def ref_attention(q, k, v, is_causal):
        return attention_reference(q, k, v, is_causal=is_causal)[0]

    compiled = torch.compile(lambda q, k, v: f(q, k, v, torch_oss.attention, torch_oss.softmax),
                             mode="reduce-overhead", fullgraph=True)
    for step in range(4):  # warm-up, record, replays
        base = [torch.randn(2, 4, 300, 64, dtype=torch.bfloat16, device=device) for _ in range(3)]
        dy = torch.randn(2, 4, 300, 64, device=device)
        runs = {}
        for name in ("ours", "peer", "ref"):
            leaves = [t.detach().to(torch.float64 if name == "ref" else t.dtype).requires_grad_() for t in base]
            if name == "ours":
                y = compiled(*leaves)
            elif name == "peer":
                y = f(*leaves, F.scaled_dot_product_attention, F.softmax)
            else:
                y = f(*leaves, ref_attention, F.softmax)
            grads = torch.autograd.grad(y, leaves, dy.to(y.dtype))
            runs[name] = (y.detach(), *grads)
        for i, what in enumerate(("out", "dq", "dk", "dv")):
            ours, peer, ref = runs["ours"][i], runs["peer"][i], runs["ref"][i]
            atol = SOFTMAX_ATOL[torch.float32] if what == "out" else ATTENTION_ATOL[torch.bfloat16]
            assert_tolerance(f"{what} step {step}", ours, ref, peer, atol)


def test_generated_wgmma_wrappers_are_current():
    """csrc/cuda/attention/sm90/wgmma_ops.cuh is checked in; it must be what its generator writes."""
    import importlib.util
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1] / "csrc" / "cuda" / "attention" / "sm90"
    spec = importlib.util.spec_from_file_location("generate_wgmma", root / "generate_wgmma.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert (root / "wgmma_ops.cuh").read_text() == gen.render(), "run python csrc/cuda/attention/sm90/generate_wgmma.py"


SM90_KERNELS = [("fwd", 64), ("fwd", 96), ("fwd", 128), ("fwd", 192), ("fwd", 256), ("bwd", 64), ("bwd", 96), ("bwd", 128),
                ("bwd", 256)]
# the launchers' further arguments: the mma.sync launchers they fall back to
# (the forward's: without and with the score variants; the backward's: dQ pass and
# fallback, without and with the score variants)
FALLBACKS = {"fwd": "oss_attn_launch_fn, oss_attn_launch_fn",
             "bwd": "oss_attn_launch_fn, oss_attn_launch_fn, oss_attn_launch_fn, oss_attn_launch_fn"}


@functools.lru_cache(maxsize=1)
def sm90_ptxas_report():
    """ptxas's messages for the Hopper forward and backward kernels (bf16,
    every head dim they are built for) compiled for sm_90a with the build's
    flags; one compile for the tests that read it."""
    import pathlib
    import tempfile

    source = ('#include "cuda/attention/sm90/attention_fwd_sm90.cuh"\n'
              '#include "cuda/attention/sm90/attention_bwd_sm90.cuh"\n') + "".join(
        f"template oss_status oss_attn_{d}_sm90_launch<__nv_bfloat16, {hd}>(const oss_attn_args *, cudaStream_t, "
        f"const oss_device_info *, {FALLBACKS[d]});\n" for d, hd in SM90_KERNELS)
    with tempfile.TemporaryDirectory() as tmp:
        return ptxas_report(source, pathlib.Path(tmp), pathlib.Path(__file__).resolve().parents[1] / "csrc")


@NVCC_SKIP
def test_wgmma_kernels_are_not_serialised():
    """ptxas serialises every wgmma of a kernel when it cannot keep them
    asynchronous: one issued under a branch it cannot prove uniform, or an
    accumulator written by ordinary code inside a pipeline stage (its
    "Potential Performance Loss" messages, C7510-C7520). The results stay
    right and only the speed drops: a row-sum wgmma under a condition once
    cost the backward 17 % at head dim 128. Compiles the Hopper kernels and
    requires no such message (needs nvcc, not a GPU)."""
    report = sm90_ptxas_report()
    lost = [line for line in report.splitlines() if "Potential Performance Loss" in line or "serialized" in line]
    assert not lost, "\n".join(lost)


@NVCC_SKIP
def test_hopper_forward_does_not_spill():
    """The Hopper forward's consumers hold O, S and P in registers (up to 240
    per thread after setmaxnreg, 160 in the kernel of three consumer
    warpgroups); a spill would put local-memory traffic into every key tile.
    The instantiations without a window (head dims 64, 96, 128, 192, 256;
    without a mask tensor, with one read element by element and with one
    read in tiles; (192, 128) for a narrower v; three consumer warpgroups
    at head dims 64 and 96) must compile with no stack frame.
    The ones for a window alone, instantiated apart so that these need not,
    hold the block's first key tile in one more register, which may spill a
    few of the block's arguments, stored at its start and reloaded once by
    its epilogue (the key loop then has no local-memory access in the SASS);
    their frame stays within 32 bytes."""
    import re

    frames = re.findall(r"Function properties for (\S*oss_attn_fwd_sm90_kernel\S*)\s+(\d+) bytes stack frame",
                        sm90_ptxas_report())
    assert len(frames) == 22, f"expected 22 Hopper forward kernels in ptxas's report, found {len(frames)}"
    # template arguments ..., MASK, VAR, WINDOW, NWG: the window kernels end in 0, false, true, 2
    window = [(name, size) for name, size in frames if "Li0ELb0ELb1ELi2EEv" in name]
    assert len(window) == 4, f"expected 4 window kernels, found {[n for n, _ in frames]}"
    spilled = [f"{name}: {size} bytes" for name, size in frames if (name, size) not in window and int(size) != 0]
    spilled += [f"{name}: {size} bytes (window)" for name, size in window if int(size) > 32]
    assert not spilled, "stack frames:\n" + "\n".join(spilled)


@NVCC_SKIP
def test_hopper_backward_does_not_spill():
    """The Hopper backward's consumers hold dK and dV, S^T and dP^T (then P^T
    and dS'^T) and a dQ piece in registers (240 per thread after setmaxnreg);
    the query-major dQ kernel holds dQ, S and dP; a spill would put
    local-memory traffic into every block. Every head dim (64, 96, 128; 256
    in the column-split kernel and its dQ kernel) must compile with no stack
    frame, and so must the kernels that take a mask tensor's tiles through
    shared memory (those that read one element by element from global memory
    may spill: they are instantiated apart so that these need not)."""
    import re

    report = sm90_ptxas_report()
    frames = re.findall(r"Function properties for (\S*oss_attn_bwd_sm90_kernel\S*)\s+(\d+) bytes stack frame", report)
    assert len(frames) == 9, f"expected 9 Hopper backward kernels in ptxas's report, found {len(frames)}"
    # template arguments ..., VAR, MASK: the plain kernels end in false, 0; those with mask tiles in false, 2
    plain = [(name, size) for name, size in frames if "Lb0ELi0EE" in name or "Lb0ELi2EE" in name]
    assert len(plain) == 6, f"expected 6 Hopper backward kernels without spills, found {[n for n, _ in frames]}"
    wide = re.findall(r"Function properties for (\S*oss_attn_bwd_sm90_wide_kernel\S*)\s+(\d+) bytes stack frame",
                      report)
    assert len(wide) == 1, f"expected 1 column-split Hopper backward kernel, found {[n for n, _ in wide]}"
    dq = re.findall(r"Function properties for (\S*oss_attn_bwd_dq_sm90_kernel\S*)\s+(\d+) bytes stack frame", report)
    assert len(dq) == 1, f"expected 1 query-major Hopper dQ kernel, found {[n for n, _ in dq]}"
    spilled = [f"{name}: {size} bytes" for name, size in plain + wide + dq if int(size) != 0]
    assert not spilled, "stack frames:\n" + "\n".join(spilled)



# SDPA's shape contract beyond (B, H, L, D): leading dims of any number, broadcast
# between query and key/value (aligned from the right, size-1 dims stretched), as
# PyTorch's own SDPA samples use (a 3-D query with 4-D key and value, say).
# (query shape, key/value shape, value head dim, enable_gqa, mask shape or None)
BROADCAST_CASES = [
    ((3, 17, 32), (2, 3, 40, 32), 32, False, None),
    ((2, 4, 17, 32), (1, 4, 40, 32), 24, False, (17, 40)),
    ((2, 3, 4, 17, 32), (2, 3, 2, 40, 32), 32, True, None),
    ((2, 2, 4, 17, 32), (2, 1, 4, 40, 32), 32, False, (2, 2, 4, 17, 40)),
    ((17, 32), (40, 32), 32, False, None),
    ((4, 17, 32), (2, 1, 40, 32), 16, False, (4, 17, 40)),
    ((2, 4, 17, 32), (2, 1, 40, 32), 32, False, None),
]


def broadcast_sdpa_peer(q, k, v, mask, is_causal, gqa):
    """SDPA's result for broadcast inputs, computed the way the tolerance rule
    needs its peer: the inputs expanded to their common leading dims and
    flattened to 4-D (batch, heads, L, D), so that CUDA float16/bfloat16 inputs
    reach PyTorch's fused kernels (sdpa_peer). Given the leading dims as they
    are, SDPA falls back to its math backend, a float32 computation rounded
    once, whose error is no bound for any fused kernel. Differentiable: the
    expansions sum each leaf's gradient over its broadcast dims."""
    split = -3 if gqa else -2  # with GQA the head dims differ and do not broadcast
    lead = torch.broadcast_shapes(q.shape[:split], k.shape[:split])

    def flat(t):
        t = t.expand(*lead, *t.shape[split:])
        return t.reshape(-1, *t.shape[-3:]) if t.dim() >= 3 else t.reshape(1, 1, *t.shape)

    q4, k4, v4 = flat(q), flat(k), flat(v)
    out_shape = (*lead, *q.shape[split:-1], v.shape[-1])
    m4 = None if mask is None else mask.expand(*out_shape[:-1], k.shape[-2]).reshape(*q4.shape[:-1], k.shape[-2])
    return sdpa_peer(q4, k4, v4, m4, is_causal, None, gqa).reshape(out_shape)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", BROADCAST_CASES, ids=[f"q{c[0]}-kv{c[1]}" for c in BROADCAST_CASES])
def test_broadcast_leading_dims_like_sdpa(device, dtype, is_causal, case):
    qshape, kshape, dv, gqa, mshape = case
    if is_causal and mshape is not None:
        pytest.skip("SDPA takes no mask together with is_causal")
    q = torch.randn(qshape, dtype=dtype, device=device)
    k = torch.randn(kshape, dtype=dtype, device=device)
    v = torch.randn(kshape[:-1] + (dv,), dtype=dtype, device=device)
    mask = None if mshape is None else torch.randn(mshape, dtype=dtype, device=device)
    leaves = {name: [t.detach().to(torch.float64 if name == "ref" else dtype).requires_grad_() for t in (q, k, v)]
              for name in ("ours", "peer", "ref")}
    out = torch_oss.attention(*leaves["ours"], attn_mask=mask, is_causal=is_causal, enable_gqa=gqa)
    peer = broadcast_sdpa_peer(*leaves["peer"], mask, is_causal, gqa)
    ref = F.scaled_dot_product_attention(*leaves["ref"], attn_mask=None if mask is None else mask.double(),
                                         is_causal=is_causal, enable_gqa=gqa)
    assert out.shape == ref.shape, f"out {tuple(out.shape)} != SDPA's {tuple(ref.shape)}"
    atol = ATTENTION_ATOL[dtype]
    assert_tolerance(f"out {case}", out, ref, peer, atol)
    dout = torch.randn(out.shape, dtype=dtype, device=device)
    out.backward(dout)
    peer.backward(dout)
    ref.backward(dout.double())
    for i, name in enumerate(("dq", "dk", "dv")):
        # the gradient of a broadcast input is the kernel's gradient summed over the
        # broadcast dims and rounded once more, outside the kernel: one rounding of
        # each element's magnitude is allowed for it
        broadcast = tuple(leaves["ours"][i].shape) != tuple(out.shape[:-2]) + tuple(leaves["ours"][i].shape[-2:])
        assert_tolerance(f"{name} {case}", leaves["ours"][i].grad, leaves["ref"][i].grad, leaves["peer"][i].grad, atol,
                         per_element_eps=broadcast)
