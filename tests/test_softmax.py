"""torch_oss.softmax / log_softmax against float64 references, F.softmax's
semantics and edge cases, gradients, opcheck and torch.compile."""

import itertools
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from _util import (DEVICES, FLOAT_DTYPES, NVCC_SKIP, SOFTMAX_ATOL, assert_rounded_to_nearest, assert_tolerance,
                   awkward_randn, capture_cuda_graph, cuda_param, ptxas_report)

import torch_oss

OPS = {
    "softmax": (torch_oss.softmax, F.softmax),
    "log_softmax": (torch_oss.log_softmax, F.log_softmax),
}

# (shape, dim): odd rows, widths off the vector width and tile, one-element
# rows, reductions over leading and middle dims.
SHAPES = [
    ((1, 1), -1),
    ((7, 1), -1),
    ((5, 3), -1),
    ((3, 17), -1),
    ((31, 127), -1),
    ((9, 129), 1),
    ((4, 1000), -1),
    ((3, 1025), -1),
    ((2, 4099), -1),
    ((2, 33000), -1),
    ((130,), 0),
    ((6, 5, 7), 0),
    ((6, 5, 7), 1),
    ((2, 3, 5, 7), 1),
    ((2, 3, 5, 7), 2),
    ((2, 64, 3, 3), 1),
    ((3, 300, 65), 1),
    ((2, 1500, 40), 1),
    ((2, 2, 2, 2, 3), -2),
]


def reference_and_peer(op_name, x, dim, dtype=None):
    _, torch_fn = OPS[op_name]
    ref = torch_fn(x.double(), dim)
    peer = torch_fn(x, dim, dtype=dtype)
    return ref, peer


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize("shape,dim", SHAPES)
def test_forward_matches_float64(device, dtype, op_name, shape, dim):
    ours_fn, _ = OPS[op_name]
    x = awkward_randn(shape, dtype, device)
    ours = ours_fn(x, dim)
    ref, peer = reference_and_peer(op_name, x, dim)
    assert ours.dtype == dtype and ours.shape == x.shape and ours.device == x.device
    assert_tolerance(f"{op_name} {dtype} {shape} dim={dim}", ours, ref, peer, SOFTMAX_ATOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize(
    "in_dtype,out_dtype",
    [(torch.float16, torch.float32), (torch.bfloat16, torch.float32), (torch.float32, torch.float16),
     (torch.float32, torch.float64), (torch.float64, torch.float32), (torch.float16, torch.bfloat16)],
)
def test_dtype_argument_casts_first(device, op_name, in_dtype, out_dtype):
    ours_fn, torch_fn = OPS[op_name]
    x = awkward_randn((13, 301), in_dtype, device)
    ours = ours_fn(x, -1, dtype=out_dtype)
    assert ours.dtype == out_dtype
    ref = torch_fn(x.to(out_dtype).double(), -1)
    peer = torch_fn(x, -1, dtype=out_dtype)
    assert_tolerance(f"{op_name} {in_dtype}->{out_dtype}", ours, ref, peer, SOFTMAX_ATOL[out_dtype])


@pytest.mark.parametrize("device", DEVICES)
def test_integer_input_with_dtype(device):
    x = torch.randint(-5, 5, (4, 9), device=device)
    torch.testing.assert_close(torch_oss.softmax(x, 1, dtype=torch.float32), F.softmax(x, 1, dtype=torch.float32))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_name", list(OPS))
def test_non_contiguous_inputs(device, op_name):
    ours_fn, torch_fn = OPS[op_name]
    base = awkward_randn((40, 30, 6), torch.float32, device)
    views = [base.transpose(0, 1), base[:, ::2], base[..., 1:], base.permute(2, 0, 1), base[::3, :, ::2]]
    for view, dim in itertools.product(views, (0, 1, -1)):
        ours = ours_fn(view, dim)
        assert ours.is_contiguous()
        assert_tolerance(f"{op_name} view {tuple(view.stride())} dim={dim}", ours, torch_fn(view.double(), dim),
                         torch_fn(view, dim), SOFTMAX_ATOL[torch.float32])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_name", list(OPS))
def test_zero_dim_and_empty(device, op_name):
    ours_fn, torch_fn = OPS[op_name]
    scalar = torch.tensor(2.5, device=device)
    for dim in (0, -1):
        torch.testing.assert_close(ours_fn(scalar, dim), torch_fn(scalar, dim))
    for shape, dim in (((0, 5), 1), ((5, 0), 1), ((5, 0), 0), ((2, 0, 3), 2)):
        x = torch.randn(shape, device=device)
        y = ours_fn(x, dim)
        assert y.shape == x.shape and y.dtype == x.dtype


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("op_name", list(OPS))
def test_infinities_and_nan_like_pytorch(device, dtype, op_name):
    ours_fn, torch_fn = OPS[op_name]
    inf = float("inf")
    x = awkward_randn((6, 37), dtype, device)
    x[0] = -inf                       # all -inf: NaN
    x[1, ::3] = -inf                  # some -inf: probability 0
    x[2, 5] = inf                     # +inf entry
    x[3, 7] = float("nan")            # NaN propagates
    x[4] = 1e4                        # large equal values
    x[5, :10] = -1e4
    ours = ours_fn(x, -1)
    ref = torch_fn(x.double(), -1)
    assert_tolerance(f"{op_name} extremes {dtype}", ours, ref, torch_fn(x, -1), SOFTMAX_ATOL[dtype])
    if op_name == "softmax":
        assert (ours[1, ::3] == 0).all()


@pytest.mark.parametrize("op_name", list(OPS))
def test_legacy_implicit_dim(op_name):
    ours_fn, torch_fn = OPS[op_name]
    for shape in ((5,), (3, 4), (2, 3, 4), (2, 3, 4, 5)):
        x = torch.randn(shape)
        with pytest.warns(UserWarning, match="Implicit dimension"):
            ours = ours_fn(x)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = torch_fn(x)
        torch.testing.assert_close(ours, expected)


@pytest.mark.parametrize("device", DEVICES)
def test_outputs_are_fresh_tensors(device):
    x = torch.randn(4, 8, device=device)
    y = torch_oss.softmax(x, -1)
    assert y.data_ptr() != x.data_ptr()
    x1 = torch.randn(4, 1, device=device)
    assert torch_oss.softmax(x1, 0).data_ptr() != x1.data_ptr()


# ---------------------------------------------------------------------------
# Gradients
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize("shape,dim", [((3, 7), -1), ((4, 5, 6), 1), ((2, 3, 4), 0), ((1, 1), 0)])
def test_gradcheck_float64(device, op_name, shape, dim):
    ours_fn, _ = OPS[op_name]
    x = torch.randn(shape, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: ours_fn(t, dim), (x,))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_name", list(OPS))
def test_autograd_node_only_when_differentiated(device, op_name):
    # a call nothing will differentiate skips the autograd node (host cost);
    # one that will gets it, and its gradient flows
    ours_fn, torch_fn = OPS[op_name]
    x = torch.randn(3, 9, dtype=torch.float64, device=device)
    y = ours_fn(x, -1)
    assert y.grad_fn is None and not y.requires_grad
    xr = x.clone().requires_grad_()
    with torch.no_grad():
        y = ours_fn(xr, -1)
    assert y.grad_fn is None and not y.requires_grad
    with torch.inference_mode():
        y = ours_fn(xr, -1)
    assert y.grad_fn is None and y.is_inference()
    torch.testing.assert_close(y, torch_fn(x, -1))
    y = ours_fn(xr, -1)
    assert y.grad_fn is not None and y.requires_grad
    w = torch.randn_like(y)
    (grad,) = torch.autograd.grad((y * w).sum(), xr)
    xe = x.clone().requires_grad_()
    (expected,) = torch.autograd.grad((torch_fn(xe, -1) * w).sum(), xe)
    torch.testing.assert_close(grad, expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize("shape,dim", [((17, 129), -1), ((5, 1025), -1), ((4, 3001), -1), ((2, 6150), -1),
                                       ((3, 40, 9), 1), ((2, 14000), -1), ((3, 30000), -1), ((2, 33000), -1)])
def test_backward_matches_float64(device, dtype, op_name, shape, dim):
    ours_fn, torch_fn = OPS[op_name]
    x = awkward_randn(shape, dtype, device)
    grad = torch.randn(shape, dtype=dtype, device=device)
    grads = {}
    for name, fn in (("ours", ours_fn), ("peer", torch_fn)):
        t = x.detach().clone().requires_grad_()
        fn(t, dim).backward(grad)
        grads[name] = t.grad
    assert grads["ours"].dtype == dtype
    ref = precise_input_gradient(op_name == "log_softmax", x, grad, dim)
    # The outliers hold most of a row's weight, so its largest gradients are a few
    # elements and the rule's maximum is a draw between two kernels that each round them
    # once; each element may also be one rounding of its own magnitude off (float64's
    # eps is below its atol's roundings, so that allowance changes nothing there).
    assert_tolerance(f"{op_name} grad {dtype} {shape}", grads["ours"], ref, grads["peer"], SOFTMAX_ATOL[dtype],
                     per_element_eps=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize("n", [16, 32, 64, 128, 1024, 2048, 4096, 8192])
def test_rows_aligned_and_shifted(device, dtype, op_name, n):
    """The same widths with every row on a 16-byte boundary (the CUDA kernels'
    aligned instantiation; at 16-64 columns, and bfloat16 at 128, the warp
    tier's forward holds several rows per lane; at 1024-8192 the light one-row-per-CTA tier takes
    some of them: float32 forward 1024 and 2048, backward 4096; bfloat16
    forward 1024-4096, backward 8192) and with every row one element off it
    (the general one), forward and backward (x, y and dy all shifted)."""
    ours_fn, torch_fn = OPS[op_name]
    backward = getattr(torch.ops.oss, f"{op_name}_backward")
    rows = 33
    x_big = awkward_randn((rows, n + 1), dtype, device)
    dy_big = torch.randn((rows, n + 1), dtype=dtype, device=device)
    for name, x, dy in (("aligned", x_big[:, 1:].contiguous(), dy_big[:, 1:].contiguous()),
                        ("shifted", x_big[:, 1:], dy_big[:, 1:])):
        y = ours_fn(x, -1)
        assert_tolerance(f"{op_name} {dtype} n={n} {name}", y, torch_fn(x.double(), -1), torch_fn(x, -1),
                         SOFTMAX_ATOL[dtype])
        if name == "shifted":
            y_big = torch.empty_like(x_big)
            y_big[:, 1:] = y
            y = y_big[:, 1:]
        dx = backward(dy, y, -1, dtype)
        ref = precise_input_gradient(op_name == "log_softmax", x, dy, -1)
        t = x.detach().clone().requires_grad_()
        torch_fn(t, -1).backward(dy)
        assert_tolerance(f"{op_name} grad {dtype} n={n} {name}", dx, ref, t.grad, SOFTMAX_ATOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize("shape,dim", [((6, 300, 17), 1), ((40, 33, 5), 0), ((3, 4, 129, 2), 2), ((5, 7), 0)])
@pytest.mark.parametrize("layout", ["transposed", "sliced", "expanded_dy", "offset"])
def test_backward_strided_dy_and_y_over_a_non_last_dim(device, dtype, op_name, shape, dim, layout):
    """The backward op over a dim other than the last with y and dy given as
    non-contiguous views (transposed, sliced with steps, dy broadcast with
    stride 0, misaligned storage offsets), against the float64 formula on the
    same y and dy (tolerance rule, PyTorch's _softmax_backward_data on the same
    views as the peer)."""
    ours_fn, torch_fn = OPS[op_name]
    backward = getattr(torch.ops.oss, f"{op_name}_backward")
    x = awkward_randn(shape, dtype, device)
    y_c = ours_fn(x, dim)
    dy_c = torch.randn(shape, dtype=dtype, device=device)
    if layout == "transposed":  # the same values with reversed dim order in memory
        def view(t):
            return t.permute(*reversed(range(t.dim()))).contiguous().permute(*reversed(range(t.dim())))
        y, dy = view(y_c), view(dy_c)
    elif layout == "sliced":  # every other element of a buffer twice as wide in each dim
        def view(t):
            big = torch.empty([2 * n for n in t.shape], dtype=t.dtype, device=t.device).fill_(float("nan"))
            big[tuple(slice(None, None, 2) for _ in t.shape)] = t
            return big[tuple(slice(None, None, 2) for _ in t.shape)]
        y, dy = view(y_c), view(dy_c)
    elif layout == "expanded_dy":  # dy broadcast along the reduced dim (stride 0 there)
        y, dy = y_c, dy_c.narrow(dim, 0, 1).expand(shape)
    else:  # storage offset of one element
        def view(t):
            flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
            flat[1:] = t.reshape(-1)
            return flat[1:].view(t.shape)
        y, dy = view(y_c), view(dy_c)
    assert torch.equal(y, y_c) and (layout == "expanded_dy" or torch.equal(dy, dy_c))
    if layout != "offset":
        assert not (y.is_contiguous() and dy.is_contiguous())
    dx = backward(dy, y, dim, dtype)
    y64, dy64 = y.double().cpu(), dy.double().cpu()
    if op_name == "log_softmax":
        ref = dy64 - torch.exp(y64) * dy64.sum(dim, keepdim=True)
        peer = torch._log_softmax_backward_data(dy, y, dim, dtype)
    else:
        ref = y64 * (dy64 - (y64 * dy64).sum(dim, keepdim=True))
        peer = torch._softmax_backward_data(dy, y, dim, dtype)
    assert dx.shape == y.shape and dx.dtype == dtype
    assert_tolerance(f"{op_name} backward {dtype} {shape} dim={dim} {layout}", dx, ref, peer, SOFTMAX_ATOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize("shape,dim", [((64, 1000), -1), ((3, 300, 40), 1), ((6, 4099), -1), ((400, 33), -1)])
def test_16bit_outputs_round_to_nearest(device, dtype, op_name, shape, dim):
    """float16/bfloat16 forward and backward outputs are the float64 result
    rounded to nearest (to within the float32 arithmetic before the rounding):
    each within one ulp of ref64.to(dtype) and without bias (a truncating or
    biased store fails). Cancelling elements (log_softmax near 0, dx = y (dy - s)
    near 0) are left out where float32's own error reaches their ulp."""
    ours_fn, torch_fn = OPS[op_name]
    log = op_name == "log_softmax"
    x = awkward_randn(shape, dtype, device)
    y = ours_fn(x, dim)
    x64 = x.double().cpu()
    ref = torch_fn(x64, dim)
    f32 = 16 * torch.finfo(torch.float32).eps
    if log:  # y = (x - max) - log(sum): the terms' size bounds float32's error
        terms = (x64 - x64.amax(dim, keepdim=True)).abs() + torch.exp(ref).sum(dim, keepdim=True).log().abs() + 1
    else:
        terms = ref
    label = f"{op_name} {dtype} {shape} dim={dim}"
    assert_rounded_to_nearest(f"{label} forward", y, ref, own_error=f32 * terms)
    dy = torch.randn(shape, dtype=dtype, device=device)
    dx = getattr(torch.ops.oss, f"{op_name}_backward")(dy, y, dim, dtype)
    y64, dy64 = y.double().cpu(), dy.double().cpu()
    if log:  # dx = dy - exp(y) sum(dy), from our y and dy
        p = torch.exp(y64)
        total = dy64.sum(dim, keepdim=True)
        ref_dx = dy64 - p * total
        terms = dy64.abs() + p * dy64.abs().sum(dim, keepdim=True)
    else:  # dx = y (dy - sum(y dy))
        s = (y64 * dy64).sum(dim, keepdim=True)
        ref_dx = y64 * (dy64 - s)
        terms = y64 * (dy64.abs() + (y64 * dy64).abs().sum(dim, keepdim=True))
    assert_rounded_to_nearest(f"{label} backward", dx, ref_dx, own_error=f32 * terms)


def precise_input_gradient(log, x, grad, dim):
    """The input gradient of softmax / log_softmax in float64 with every sum
    over the line taken exactly (math.fsum) and exp(x - max) / d formed
    directly: a reference more precise than float64 itself. For float64
    inputs PyTorch's float64 result is the peer, so it cannot also be the
    reference; it is off by up to ~3e-12 on 33000-wide lines (its log_softmax
    rounds max + log d, and the backward multiplies that by sum dy ~ 400)."""
    xs = x.detach().double().cpu().movedim(dim, -1)
    gs = grad.detach().double().cpu().movedim(dim, -1)
    out = []
    for xr, gr in zip(xs.reshape(-1, xs.shape[-1]).tolist(), gs.reshape(-1, gs.shape[-1]).tolist()):
        m = max(xr)
        e = [math.exp(v - m) for v in xr]
        d = math.fsum(e)
        p = [v / d for v in e]
        if log:
            s = math.fsum(gr)
            out.append([gi - pi * s for pi, gi in zip(p, gr)])
        else:
            s = math.fsum(pi * gi for pi, gi in zip(p, gr))
            out.append([pi * (gi - s) for pi, gi in zip(p, gr)])
    return torch.tensor(out, dtype=torch.float64).reshape(xs.shape).movedim(-1, dim)


# (shape, dim) through each CUDA tier: rows in a warp, in the light
# one-row-per-CTA tier (1024 float32 / bfloat16 forward, 4096 float32
# backward), in one CTA, in a cluster, split across CTAs; columns in one tile
# and split.
DOMINANT_SHAPES = [
    ((64, 100), -1),
    ((16, 1024), -1),
    ((4, 4096), -1),
    ((8, 5000), -1),
    ((4, 70001), -1),
    ((2, 300000), -1),
    ((2, 3000001), -1),
    ((2, 3000, 16), 1),
    ((1, 200001, 3), 1),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("in_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape,dim", DOMINANT_SHAPES)
def test_log_softmax_dominant_element(device, in_dtype, shape, dim):
    """One element per line far above the rest (0 against about -20): its
    log_softmax is -log1p(d') with d' = n * ~2e-9. A float32 denominator
    d = 1 + d' rounds d' to a few ulps of 1, an error of up to all of y there
    (and the backward multiplies it by sum dy); the kernels keep d' apart, so
    y comes out to float32 precision relative to its own size."""
    x = torch.randn(shape, device=device) * 0.5 - 20
    top = torch.randint(0, shape[dim], [s if i != dim % len(shape) else 1 for i, s in enumerate(shape)],
                        device=device)
    x = x.scatter(dim, top, 0.0).to(in_dtype)
    y = torch_oss.log_softmax(x, dim, dtype=torch.float32)
    ref = F.log_softmax(x.double(), dim).gather(dim, top)
    ours = y.gather(dim, top).double()
    err = ((ours - ref).abs() / ref.abs()).max().item()
    assert err <= 1e-4, f"relative error {err:.3g} of the dominant element's log_softmax"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape,dim", DOMINANT_SHAPES)
def test_log_softmax_backward_sum_is_accurate(device, shape, dim):
    """log_softmax_backward's dx = dy - exp(y) * sum(dy) with dy in pairs +v, -v
    (|v| ~ 1e4) that cancel, plus four elements of probability ~1/4 with dy ~ 1:
    the exact sum is ~4, and a plain float32 sum of this line (partial sums
    ~1e6) is off by far more than 4 (and so dx, where it is ~0.5). The kernels
    carry the sum compensated: every dx must be within a few float32
    roundings of the float64 formula on the same y and dy."""
    n = shape[dim]
    x = torch.randn(shape, dtype=torch.float64) * 0.1
    v = torch.randn(shape, dtype=torch.float64) * 1e4
    x, v = x.movedim(dim, -1), v.movedim(dim, -1)
    perm = torch.randperm(n)
    v[..., perm[1::2]] = -v[..., perm[: n - n % 2 : 2]]  # pairs that cancel, far apart
    if n % 2:
        v[..., perm[-1]] = 0
    top = perm[:4]
    x[..., top] = 12.0
    v[..., top] = 1 + torch.rand(*v.shape[:-1], 4, dtype=torch.float64)
    x, v = x.movedim(-1, dim).contiguous(), v.movedim(-1, dim).contiguous()
    y = F.log_softmax(x, dim).float().to(device)
    dy = v.float().to(device)
    dx = torch.ops.oss.log_softmax_backward(dy, y, dim, torch.float32)
    y64, dy64 = y.double().cpu(), dy.double().cpu()
    total = dy64.sum(dim, keepdim=True)
    ref = dy64 - torch.exp(y64) * total
    eps = torch.finfo(torch.float32).eps
    bound = 8 * eps * (dy64.abs() + torch.exp(y64) * total.abs() + ref.abs())
    excess = ((dx.double().cpu() - ref).abs() / bound).max().item()
    assert excess <= 1, f"log_softmax_backward off by {excess:.3g}x a few float32 roundings"


@pytest.mark.parametrize("device", DEVICES)
def test_backward_with_dtype_cast_returns_input_dtype(device):
    x = torch.randn(6, 50, dtype=torch.float16, device=device, requires_grad=True)
    y = torch_oss.softmax(x, -1, dtype=torch.float32)
    (y * torch.arange(50, device=device)).sum().backward()
    xr = x.detach().clone().requires_grad_()
    (F.softmax(xr, -1, dtype=torch.float32) * torch.arange(50, device=device)).sum().backward()
    assert x.grad.dtype == torch.float16
    torch.testing.assert_close(x.grad, xr.grad, atol=2e-3, rtol=2e-3)


# ---------------------------------------------------------------------------
# opcheck and compile
# ---------------------------------------------------------------------------


def softmax_samples(device):
    samples = []
    for shape, dim in (((4, 9), -1), ((3, 5, 7), 1), ((8,), 0), ((2, 3, 4), 0)):
        for dtype in (torch.float32, torch.float64):
            x = torch.randn(shape, dtype=dtype, device=device, requires_grad=True)
            samples.append((x, dim, None))
    samples.append((torch.randn(5, 6, dtype=torch.float16, device=device), 1, torch.float32))
    return samples


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_name", list(OPS))
def test_opcheck(device, op_name):
    op = getattr(torch.ops.oss, op_name).default
    backward = getattr(torch.ops.oss, f"{op_name}_backward").default
    for x, dim, dtype in softmax_samples(device):
        torch.library.opcheck(op, (x, dim, dtype))
        y = op(x.detach(), dim, dtype)
        torch.library.opcheck(backward, (torch.randn_like(y), y, dim, x.dtype))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_forward_and_backward(device):
    def f(x):
        return torch_oss.log_softmax(torch_oss.softmax(x * 2, -1) + 1, 0).sum(0)

    compiled = torch.compile(f, fullgraph=True)
    x = torch.randn(16, 33, device=device, requires_grad=True)
    xr = x.detach().clone().requires_grad_()
    out = compiled(x)
    out.sum().backward()
    expected = F.log_softmax(F.softmax(xr * 2, -1) + 1, 0).sum(0)
    expected.sum().backward()
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(x.grad, xr.grad)


@pytest.mark.parametrize("device", [cuda_param("cuda")])
def test_split_tier_replays_in_a_cuda_graph(device):
    """Rows too wide to stay on chip (float32, 4.5M columns: the split tier, whose
    merge and apply kernels are programmatic dependent launches on sm_90),
    forward and backward next to other ops, captured in a CUDA graph and replayed
    on new inputs: the same bits as eager, and close to F.softmax."""
    x = torch.randn(2, 4_500_007, device=device) * 3
    dy = torch.randn_like(x)

    def step():
        y = torch_oss.softmax(x * 1.5, -1)
        return y, torch.ops.oss.softmax_backward(dy * 2, y, -1, torch.float32)

    graph, captured = capture_cuda_graph(step)
    x.copy_(torch.randn_like(x) * 3)
    dy.copy_(torch.randn_like(dy))
    graph.replay()
    eager = step()
    assert torch.equal(captured[0], eager[0]) and torch.equal(captured[1], eager[1])
    ref = F.softmax(x.double() * 1.5, -1)
    peer = F.softmax(x * 1.5, -1)
    assert_tolerance("split tier forward in a CUDA graph", captured[0], ref, peer, SOFTMAX_ATOL[torch.float32])
    g = dy.double() * 2
    ref_dx = ref * (g - (ref * g).sum(-1, keepdim=True))
    peer_dx = torch._softmax_backward_data(dy * 2, peer, -1, torch.float32)
    assert_tolerance("split tier backward in a CUDA graph", captured[1], ref_dx, peer_dx, SOFTMAX_ATOL[torch.float32])


def check_last_dim_softmax_rows(shape, dtype, device):
    """softmax over the last dim of fresh awkward input of `shape`, and its
    backward from our y, each row against float64 (the tolerance rule, with
    PyTorch's own result as the peer)."""
    x = awkward_randn(shape, dtype, device)
    dy = torch.randn_like(x)
    y = torch_oss.softmax(x, -1)
    ref = F.softmax(x.double(), -1)
    assert_tolerance(f"softmax {dtype} {shape}", y, ref, F.softmax(x, -1), SOFTMAX_ATOL[dtype])
    dx = torch.ops.oss.softmax_backward(dy, y, -1, dtype)
    g = dy.double()
    ref_dx = ref * (g - (ref * g).sum(-1, keepdim=True))
    peer_dx = torch._softmax_backward_data(dy, F.softmax(x, -1), -1, dtype)
    assert_tolerance(f"softmax_backward {dtype} {shape}", dx, ref_dx, peer_dx, SOFTMAX_ATOL[dtype])


@pytest.mark.parametrize("device", [cuda_param("cuda")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_more_rows_than_a_grid_dimension_holds(device, dtype):
    """70,001 rows of 1,100 (16-bit: 2,100) columns: one CTA per row on the
    GPU, more rows than a CUDA grid's y dimension holds (65,535), forward and
    backward, against float64 over every row."""
    cols = 1100 if dtype == torch.float32 else 2100
    check_last_dim_softmax_rows((70001, cols), dtype, device)


@pytest.mark.parametrize("device", [cuda_param("cuda")])
@pytest.mark.parametrize("dtype,shape", [
    (torch.bfloat16, (300, 131079)),   # clusters of a few CTAs, ~62 rows at once on an H100
    (torch.float32, (64, 262147)),     # clusters of 16, ~14 rows at once
    (torch.float16, (600, 65543)),     # one CTA per row with a shared-memory part, ~264 at once
])
def test_rows_beyond_the_first_wave(device, dtype, shape):
    """More rows than the chunk kernel holds at once, so the launch ramps its
    first wave (each of its rows starts a little later than the one before;
    sm_first_wave_ramp) and later rows reuse the freed CTAs: forward and
    backward of every row against float64. Odd widths, so the rows are also
    misaligned."""
    check_last_dim_softmax_rows(shape, dtype, device)


KERNEL_TYPES = ("float", "__half", "__nv_bfloat16")  # the CUDA element types of float32, float16, bfloat16


def assert_no_stack_frames(header, instantiations, tmp_path):
    """Compiles the explicit `instantiations` of kernels from csrc/`header`
    for sm_90a with setup.py's flags (ptxas -v) and requires one report per
    instantiation, each with a zero stack frame (needs nvcc, not a GPU)."""
    import pathlib
    import re

    csrc = pathlib.Path(__file__).resolve().parents[1] / "csrc"
    report = ptxas_report("\n".join([f'#include "{header}"', *instantiations]) + "\n", tmp_path, csrc)
    frames = re.findall(r"Function properties for (\S+)\s+(\d+) bytes stack frame", report)
    assert len(frames) == len(instantiations), \
        f"expected {len(instantiations)} kernels in ptxas's report, found {len(frames)}"
    spilled = [f"{name}: {size} bytes" for name, size in frames if int(size) != 0]
    assert not spilled, "stack frames:\n" + "\n".join(spilled)


@NVCC_SKIP
def test_one_row_per_cta_kernels_do_not_spill(tmp_path):
    """The light one-row-per-CTA kernel (every instantiation the planner
    launches), the warp kernel's aligned backward and its light aligned
    forward (one, two or four rows per lane) live one row (or a few) per
    CTA, so a register that ptxas spills costs each thread a local store
    that goes to the L2 beside the stream: one spilled value cost the
    bfloat16 backward 7-8 % of its time on an H200, four rows per lane's
    spill the 16-bit forward 5 points of the copy ceiling.
    All 72 must compile with a zero stack frame."""
    lines = []
    for t1, t2 in itertools.product(KERNEL_TYPES, KERNEL_TYPES):
        for bwd, km in ((0, 2), (0, 8), (1, 2), (1, 4)):
            lines.append(f"template __global__ void softmax_row_in_cta_kernel<{'true' if bwd else 'false'}, "
                         f"{t1}, {t2}, float, {km}>(sm_row_args);")
        lines.append(f"template __global__ void softmax_rows_in_warp_kernel<true, {t1}, {t2}, float, 2, true, 1>"
                     "(sm_row_args);")
        for rl in (1, 2, 4):  # the aligned light forward, one to four rows per lane
            lines.append(f"template __global__ void softmax_rows_in_warp_kernel<false, {t1}, {t2}, float, 4, true, {rl}>"
                         "(sm_row_args);")
    assert len(lines) == 9 * 8
    assert_no_stack_frames("cuda/softmax/softmax_rows.cuh", lines, tmp_path)


@NVCC_SKIP
def test_columns_kernel_does_not_spill(tmp_path):
    """The columns kernel (softmax over a dim other than the last), forward
    and backward, every input/output dtype pair, at both CTA sizes: all 36
    with a zero stack frame. At 512 threads ptxas held it to 64 registers
    and the backward from a 16-bit y to a float32 dx spilled 4 bytes a
    thread until that instantiation was compiled for one CTA per SM
    (sm_col_min_ctas, softmax_columns.cuh)."""
    lines = [f"template __global__ void softmax_columns_kernel<{bwd}, {t1}, {t2}, float, {threads}>(sm_col_args);"
             for t1, t2 in itertools.product(KERNEL_TYPES, KERNEL_TYPES) for bwd in ("false", "true")
             for threads in (256, 512)]
    assert len(lines) == 9 * 2 * 2
    assert_no_stack_frames("cuda/softmax/softmax_columns.cuh", lines, tmp_path)
