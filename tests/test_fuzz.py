"""Property-based tests (hypothesis): softmax, log_softmax and attention,
values and gradients, against the float64 reference by the tolerance rule
(tests/_util.py), over random shapes, strides (transposes, slices with offsets and steps,
stride-0 broadcasts, a non-unit last-dim stride), dims, dtypes and dtype=
casts, masks (bool/additive, every broadcast shape, transposed), GQA ratios,
causal alignments and scales.

Profiles (tests/conftest.py, TORCH_OSS_FUZZ_PROFILE): "ci" (default,
derandomized: the same cases every run, 180 cases for each softmax test and
60 for each attention test per device, about a minute on 2 CPU cores) and "long"
(3000 fresh cases per test and device: 4 tests, 12,000 cases on the GPU
with -k cuda), plus the hard paths always drawn (large-magnitude softmax
inputs; attention with more than two key tiles and large scores). Forward and
backward are separate tests, so that a gradient
defect does not hide value defects (hypothesis stops a test at its first
failure).
Each case draws its tensor data from a seed that hypothesis chooses, so a
failure reproduces from hypothesis's report alone.
"""

import os

import pytest
import torch
from _reliability import check_attention, check_softmax, dtype_id
from _util import BUILD, DEVICES, FLOAT_DTYPES
from hypothesis import given, note, settings
from hypothesis import strategies as st

LONG = os.environ.get("TORCH_OSS_FUZZ_PROFILE", "ci") == "long"
# softmax cases are cheap: three times the profile's examples in CI (same count in the long profile)
SOFTMAX_SETTINGS = settings(max_examples=settings().max_examples * (1 if LONG else 3))
# work per case (elements of the float64 reference); larger on the GPU profile
SOFTMAX_MAX_NUMEL = int(os.environ.get("TORCH_OSS_FUZZ_SOFTMAX_NUMEL", 2_000_000 if LONG else 60_000))
ATTENTION_MAX_WORK = int(os.environ.get("TORCH_OSS_FUZZ_ATTENTION_WORK", 200_000_000 if LONG else 3_000_000))


def max_head_dim(device):
    if device == "cuda" and BUILD["attention_head_dims"]:
        return min(256, max(BUILD["attention_head_dims"]))
    return 256


def gen(seed):
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------
# strided views of a leaf tensor
# ---------------------------------------------------------------------------


@st.composite
def layouts(draw, shape, allow_last_dim_stride=True):
    """Returns (base_shape, view_fn, name): view_fn(base) has `shape` and the
    drawn memory layout; gradients are checked on the view (the op's own)."""
    rank = len(shape)
    kinds = ["contiguous"]
    if rank >= 2:
        kinds += ["permuted"]
    if rank >= 1:
        kinds += ["sliced", "expanded", "offset"]
    kind = draw(st.sampled_from(kinds))
    if kind == "contiguous":
        return tuple(shape), lambda t: t, kind
    if kind == "permuted":
        perm = draw(st.permutations(range(rank)))
        inverse = [perm.index(i) for i in range(rank)]
        base_shape = tuple(shape[p] for p in perm)
        return base_shape, lambda t: t.permute(*inverse), f"permuted{tuple(perm)}"
    if kind == "sliced":
        starts = [draw(st.integers(0, 2)) for _ in shape]
        steps = [draw(st.sampled_from([1, 1, 2, 3])) for _ in shape]
        if not allow_last_dim_stride and rank:
            steps[-1] = 1
        base_shape = tuple(s0 + max(n - 1, 0) * st_ + 1 + draw(st.integers(0, 1)) for n, s0, st_ in
                           zip(shape, starts, steps))
        index = tuple(slice(s0, s0 + n * st_, st_) for n, s0, st_ in zip(shape, starts, steps))
        return base_shape, lambda t: t[index], f"sliced(start={starts}, step={steps})"
    if kind == "expanded":
        # a size-1 dim broadcast to its size (stride 0), as a shared key or bias would be
        d = draw(st.integers(0, rank - 1))
        base_shape = tuple(1 if i == d else n for i, n in enumerate(shape))
        return base_shape, lambda t: t.expand(*shape), f"expanded(dim={d})"
    # "offset": a view into a flat buffer that starts a few elements in (misaligned pointer)
    off = draw(st.integers(1, 7))
    numel = 1
    for n in shape:
        numel *= n
    return (numel + off,), lambda t: t[off:].view(shape), f"offset({off})"


def make_base(shape, dtype, device, seed, scale):
    x = torch.randn(shape, generator=gen(seed), dtype=torch.float64) * scale
    if x.numel() > 8:  # a few large outliers, so softmax is far from flat
        idx = torch.randint(0, x.numel(), (max(1, x.numel() // 500),), generator=gen(seed + 1))
        x.view(-1)[idx] += 20.0 * torch.randn(idx.shape, generator=gen(seed + 2), dtype=torch.float64).sign()
    return x.to(dtype=dtype, device=device)


# ---------------------------------------------------------------------------
# softmax
# ---------------------------------------------------------------------------


def dim_sizes():
    return st.one_of(
        st.integers(1, 9),
        st.sampled_from([0, 1, 1, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129]),
        st.integers(1, 300),
        st.sampled_from([1023, 1024, 1025, 2047, 4095, 4096, 4097, 8193]),
    )


@st.composite
def softmax_cases(draw, hard=False):
    """A softmax case; hard=True draws only large-magnitude inputs (scale 10
    and +-1e4 offsets, or a scale of 1e3): where a kernel without the max
    subtraction, or with a float32 score path, breaks down."""
    rank = draw(st.integers(0, 4))
    shape = [draw(dim_sizes()) for _ in range(rank)]
    # the budget counts a 0-size dim as 1: an empty view may still sit on a large base
    # (an "expanded" layout's base has 1 there), which the case allocates
    numel = 1
    for n in shape:
        numel *= max(n, 1)
    while numel > SOFTMAX_MAX_NUMEL:  # shrink the largest dim until the case fits the budget
        i = max(range(rank), key=lambda j: shape[j])
        numel //= shape[i]
        shape[i] = max(1, shape[i] // 4)
        numel *= shape[i]
    dim = draw(st.integers(-max(rank, 1), max(rank, 1) - 1))
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    cast = draw(st.sampled_from([None, None, None] + FLOAT_DTYPES))
    op_name = draw(st.sampled_from(["softmax", "log_softmax"]))
    base_shape, view_fn, layout = draw(layouts(shape))
    scale = draw(st.sampled_from([10.0, 1000.0] if hard else [0.1, 1.0, 3.0, 10.0]))
    special = draw(st.sampled_from(["large", "large", "none"] if hard else
                                   ["none", "none", "neg_inf", "neg_inf_rows", "neg_inf_prefix", "neg_inf_prefix",
                                    "large"]))
    prefix = draw(st.sampled_from([0.3, 0.6, 0.9, 1.0]))
    seed = draw(st.integers(0, 2**31 - 1))
    return dict(shape=tuple(shape), dim=dim, dtype=dtype, cast=cast, op_name=op_name, base_shape=base_shape,
                view_fn=view_fn, layout=layout, scale=scale, special=special, prefix=prefix, seed=seed)


def run_softmax_case(device, case, backward):
    note({k: v for k, v in case.items() if k != "view_fn"})
    base = make_base(case["base_shape"], case["dtype"], device, case["seed"], case["scale"])
    if base.numel() and case["special"] != "none":
        flat = base.view(-1)
        g = gen(case["seed"] + 3)
        if case["special"] == "neg_inf":      # scattered -inf entries: probability 0
            flat[torch.rand(flat.shape, generator=g).to(device) < 0.2] = float("-inf")
        elif case["special"] == "neg_inf_rows":  # long -inf runs: whole rows of -inf (NaN) and -inf prefixes
            n = flat.numel()
            start = int(torch.randint(0, n, (1,), generator=g))
            flat[start:start + max(1, n // 3)] = float("-inf")
        elif case["special"] == "neg_inf_prefix" and "expanded" not in case["layout"] and len(case["shape"]):
            # every row starts with a run of -inf along dim (left padding); the whole row when prefix=1
            view = case["view_fn"](base)
            n = view.shape[case["dim"]]
            view.narrow(case["dim"], 0, max(1, int(n * case["prefix"])) if n else 0).fill_(float("-inf"))
        else:                                  # +-1e4 offsets
            flat += (torch.randint(-1, 2, flat.shape, generator=g).to(device) * 1e4).to(flat.dtype)
    assert tuple(case["view_fn"](base).shape) == case["shape"]
    check_softmax(case["op_name"], base, case["view_fn"], case["dim"], dtype=case["cast"], grad=backward,
                  check_values=not backward, seed=case["seed"] + 5,
                  label=f"{case['op_name']} {case['shape']} dim={case['dim']} {case['dtype']}->{case['cast']} "
                        f"{case['layout']} {case['special']}")


@pytest.mark.parametrize("device", DEVICES)
@SOFTMAX_SETTINGS
@given(case=softmax_cases())
def test_fuzz_softmax_forward(device, case):
    run_softmax_case(device, case, backward=False)


@pytest.mark.parametrize("device", DEVICES)
@SOFTMAX_SETTINGS
@given(case=softmax_cases())
def test_fuzz_softmax_backward(device, case):
    run_softmax_case(device, case, backward=True)


# ---------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------


def seq_lens():
    return st.one_of(
        st.integers(0, 40),
        st.sampled_from([1, 1, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129]),
        st.integers(1, 300),
    )


def head_dims(limit):
    common = [d for d in (1, 8, 16, 17, 32, 40, 63, 64, 72, 80, 96, 100, 128, 160, 192, 256) if d <= limit]
    return st.one_of(st.sampled_from(common), st.integers(1, limit))


# The CPU attention kernels walk the keys in tiles of 64 (csrc/cpu/attention.c,
# OSS_BC): 257-600 keys are more than two tiles (and more than two tiles of 128),
# so the running max, sum and the backward's D rescale across tiles.
MULTI_TILE_LK = st.integers(2 * 128 + 1, 600)


@st.composite
def attention_cases(draw, device, hard=False):
    """An attention case; hard=True draws key lengths of more than two tiles
    (MULTI_TILE_LK) and large-magnitude inputs (values scaled by 4 or 8, so
    scores reach the hundreds), the paths where online-softmax rescaling,
    causal tile skipping and the max subtraction matter."""
    limit = max_head_dim(device)
    three_d = draw(st.integers(0, 9)) == 0        # (N, L, E) inputs, as SDPA accepts
    B = draw(st.sampled_from([0, 1, 1, 1, 2, 2, 3]))
    Hkv = 1 if three_d else draw(st.integers(1, 3))
    group = 1 if three_d else draw(st.sampled_from([1, 1, 2, 3, 4, 8]))
    Hq = Hkv * group
    Lq, Lk = draw(seq_lens()), draw(MULTI_TILE_LK if hard else seq_lens())
    D = draw(head_dims(limit))
    Dv = D if draw(st.booleans()) else draw(head_dims(limit))
    while max(B, 1) * Hq * max(Lq, 1) * max(Lk, 1) * max(D, Dv) > ATTENTION_MAX_WORK:
        if hard and Lq > 1:  # keep the keys multi-tile: shrink the queries, then the heads and head dims
            Lq = max(1, Lq // 2)
        elif hard and max(D, Dv) > 16:
            D, Dv = max(1, D // 2), max(1, Dv // 2)
        elif hard:
            break
        elif Lk >= Lq:
            Lk = max(1, Lk // 2)
        else:
            Lq = max(1, Lq // 2)
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    causal = draw(st.sampled_from([(False, "top_left"), (True, "top_left"), (True, "bottom_right")]))

    # mask: kind, broadcast shape over (B, Hq, Lq, Lk), values
    mask_kind = draw(st.sampled_from(["none", "none", "bool", "additive", "additive_f32"]))
    full = [B, Hq, Lq, Lk]
    mask_rank = draw(st.integers(1, 3 if three_d else 4))
    mask_shape = [n if draw(st.booleans()) else 1 for n in full[4 - mask_rank:]]
    if three_d and mask_rank == 3:
        mask_shape[0] = B if draw(st.booleans()) else 1  # (N, Lq, Lk): its first dim is the batch
    mask_transposed = mask_rank >= 2 and draw(st.booleans())
    keep = draw(st.sampled_from([0.1, 0.5, 0.9, 1.0]))
    dead_rows = draw(st.booleans())

    shapes = {
        "q": (B, Lq, D) if three_d else (B, Hq, Lq, D),
        "k": (B, Lk, D) if three_d else (B, Hkv, Lk, D),
        "v": (B, Lk, Dv) if three_d else (B, Hkv, Lk, Dv),
    }
    views = {name: draw(layouts(shape)) for name, shape in shapes.items()}
    scale = draw(st.sampled_from([None, None, None, 0.0, 0.1, 0.5, 1.0, -0.3]))
    value_scale = draw(st.sampled_from([4.0, 8.0] if hard else [0.5, 1.0, 2.0]))
    seed = draw(st.integers(0, 2**31 - 1))
    return dict(three_d=three_d, B=B, Hq=Hq, Hkv=Hkv, Lq=Lq, Lk=Lk, D=D, Dv=Dv, dtype=dtype, causal=causal,
                mask_kind=mask_kind, mask_shape=tuple(mask_shape), mask_transposed=mask_transposed, keep=keep,
                dead_rows=dead_rows, shapes=shapes, views=views, scale=scale, value_scale=value_scale, seed=seed)


def make_mask(case, device):
    kind = case["mask_kind"]
    if kind == "none":
        return None
    shape = list(case["mask_shape"])
    g = gen(case["seed"] + 7)
    if case["mask_transposed"]:
        shape[-1], shape[-2] = shape[-2], shape[-1]
    if kind == "bool":
        mask = torch.rand(shape, generator=g) < case["keep"]
        if case["dead_rows"] and mask.numel():
            mask.view(-1, shape[-1])[::3] = False      # some fully masked rows (or columns when transposed)
    else:
        mask = torch.randn(shape, generator=g, dtype=torch.float64)
        mask[torch.rand(shape, generator=g) >= case["keep"]] = float("-inf")
        if case["dead_rows"] and mask.numel():
            mask.view(-1, shape[-1])[::3] = float("-inf")
        mask = mask.to(case["dtype"] if kind == "additive" else torch.float32)
    if case["mask_transposed"]:
        mask = mask.transpose(-1, -2)
    return mask.to(device)


def run_attention_case(device, case, backward):
    note({k: v for k, v in case.items() if k != "views"})
    note({name: (view[0], view[2]) for name, view in case["views"].items()})
    bases, fns = [], []
    for i, name in enumerate(("q", "k", "v")):
        base_shape, fn, _ = case["views"][name]
        bases.append(make_base(base_shape, case["dtype"], device, case["seed"] + 11 * i, case["value_scale"]))
        fns.append(fn)
        assert tuple(fn(bases[-1]).shape) == case["shapes"][name]
    is_causal, alignment = case["causal"]
    label = (f"B={case['B']} H={case['Hq']}/{case['Hkv']} L={case['Lq']}/{case['Lk']} D={case['D']}/{case['Dv']} "
             f"{case['dtype']} causal={is_causal}/{alignment} mask={case['mask_kind']}{case['mask_shape']} "
             f"scale={case['scale']} layouts={[case['views'][n][2] for n in 'qkv']}")
    check_attention(bases, fns, mask=make_mask(case, device), is_causal=is_causal, alignment=alignment,
                    scale=case["scale"], grad=backward, check_values=not backward, seed=case["seed"] + 5,
                    label=label)


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
def test_fuzz_attention_forward(device, data):
    run_attention_case(device, data.draw(attention_cases(device), label="case"), backward=False)


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
def test_fuzz_attention_backward(device, data):
    run_attention_case(device, data.draw(attention_cases(device), label="case"), backward=True)


# The hard paths, always drawn: in the ci profile (derandomized) these draw the
# same cases every run, a third of the profile's examples each.
HARD_SETTINGS = settings(max_examples=max(10, settings().max_examples // 3))


@pytest.mark.parametrize("device", DEVICES)
@HARD_SETTINGS
@given(case=softmax_cases(hard=True))
def test_fuzz_softmax_large_magnitudes(device, case):
    run_softmax_case(device, case, backward=False)
    run_softmax_case(device, case, backward=True)


@pytest.mark.parametrize("device", DEVICES)
@HARD_SETTINGS
@given(data=st.data())
def test_fuzz_attention_multi_tile_forward(device, data):
    run_attention_case(device, data.draw(attention_cases(device, hard=True), label="case"), backward=False)


@pytest.mark.parametrize("device", DEVICES)
@HARD_SETTINGS
@given(data=st.data())
def test_fuzz_attention_multi_tile_backward(device, data):
    run_attention_case(device, data.draw(attention_cases(device, hard=True), label="case"), backward=True)


# ---------------------------------------------------------------------------
# minimal regressions for defects these fuzz tests found (deterministic, fast)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("op_name", ["softmax", "log_softmax"])
def test_backward_of_widening_dtype_cast_to_float64(device, dtype, op_name):
    """softmax(x_half, dtype=torch.float64): the backward must be computed from
    the float64 output and gradient (as F.softmax's is) and only then rounded
    to x's dtype, not from copies of them rounded to x's dtype first."""
    x = torch.tensor([0.154052734375, -0.0293426513671875], dtype=torch.float16).to(dtype)
    g = torch.tensor([-0.48678075071242677, -0.6038215878840039], dtype=torch.float64)
    check_softmax(op_name, x.to(device), lambda t: t, 0, dtype=torch.float64, label=f"minimal {dtype}",
                  seed=None, grad_output=g.to(device))
    for seed in range(4):
        base = make_base((16, 33), dtype, device, seed, 3.0)
        check_softmax(op_name, base, lambda t: t, -1, dtype=torch.float64, seed=seed, label=f"{dtype} seed {seed}")
