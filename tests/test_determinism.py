"""Determinism: forward results bitwise identical run to run (softmax and
attention, CPU and CUDA); the backward bitwise identical run to run on the CPU
(always) and on CUDA under torch.use_deterministic_algorithms(True), and still
correct there. On the CPU the kernels also promise results independent of the
thread count (csrc/cpu/*.c), which is checked too."""

import pytest
import torch
from _reliability import SOFTMAX_OPS, assert_bitwise_equal, dtype_id
from _util import ATTENTION_ATOL, DEVICES, assert_tolerance, attention_reference, cuda_param, sdpa_peer

import torch_oss

RUNS = 4


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def deterministic():
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous)


@pytest.fixture
def cpu_threads():
    """Restores torch's intra-op thread count after a test changes it."""
    previous = torch.get_num_threads()
    yield
    torch.set_num_threads(previous)


def randn(shape, dtype, device, scale=3.0):
    return (torch.randn(shape, dtype=torch.float64) * scale).to(dtype=dtype, device=device)


# ---------------------------------------------------------------------------
# softmax
# ---------------------------------------------------------------------------

# rows in one warp / one block / several blocks, a reduction over a middle dim and over dim 0
SOFTMAX_SHAPES = [((257, 1000), -1), ((7, 40000), -1), ((2, 300003), -1), ((1, 2**22 + 3), -1),
                  ((50, 300, 7), 1), ((4097, 9), 0)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("op_name", list(SOFTMAX_OPS))
@pytest.mark.parametrize("shape,dim", SOFTMAX_SHAPES, ids=[f"{s}-dim{d}" for s, d in SOFTMAX_SHAPES])
def test_softmax_forward_and_backward_bitwise_run_to_run(device, dtype, op_name, shape, dim):
    fn = SOFTMAX_OPS[op_name][0]
    backward = getattr(torch.ops.oss, f"{op_name}_backward")
    x = randn(shape, dtype, device)
    dy = randn(shape, dtype, device, 1.0)
    first_y = fn(x, dim)
    first_dx = backward(dy, first_y, dim, dtype)
    for run in range(1, RUNS):
        assert_bitwise_equal(f"{op_name} forward run {run}", fn(x, dim), first_y)
        assert_bitwise_equal(f"{op_name} backward run {run}", backward(dy, first_y, dim, dtype), first_dx)


@pytest.mark.parametrize("op_name", list(SOFTMAX_OPS))
@pytest.mark.parametrize("shape,dim", SOFTMAX_SHAPES, ids=[f"{s}-dim{d}" for s, d in SOFTMAX_SHAPES])
def test_cpu_softmax_independent_of_thread_count(cpu_threads, op_name, shape, dim):
    fn = SOFTMAX_OPS[op_name][0]
    backward = getattr(torch.ops.oss, f"{op_name}_backward")
    x = randn(shape, torch.float32, "cpu")
    dy = randn(shape, torch.float32, "cpu", 1.0)
    results = {}
    for threads in (1, 2, 3):
        torch.set_num_threads(threads)
        y = fn(x, dim)
        results[threads] = (y, backward(dy, y, dim, torch.float32))
    for threads in (2, 3):
        assert_bitwise_equal(f"{op_name} forward, {threads} threads vs 1", results[threads][0], results[1][0])
        assert_bitwise_equal(f"{op_name} backward, {threads} threads vs 1", results[threads][1], results[1][1])


# ---------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------

# (B, Hq, Hkv, Lq, Lk, D, is_causal, alignment, mask): decode rows over long keys
# (split-KV candidates), GQA with many query rows per key (dk/dv accumulate over
# many query blocks), long keys (dq accumulates over many key blocks), masks.
ATTENTION_CASES = [
    (2, 8, 2, 1, 8192, 128, False, "top_left", None),
    (1, 8, 1, 700, 300, 64, True, "bottom_right", None),
    (2, 4, 4, 300, 1500, 64, False, "top_left", "bool"),
    (1, 4, 2, 513, 513, 128, True, "top_left", "additive"),
    (1, 2, 2, 257, 129, 96, False, "top_left", None),
]
ATTENTION_IDS = ["decode_8k", "gqa8_causal_br", "long_keys_bool_mask", "gqa2_causal_additive", "d96"]


def attention_inputs(case, dtype, device):
    B, Hq, Hkv, Lq, Lk, D, is_causal, alignment, mask_kind = case
    q = randn((B, Hq, Lq, D), dtype, device, 1.0)
    k = randn((B, Hkv, Lk, D), dtype, device, 1.0)
    v = randn((B, Hkv, Lk, D), dtype, device, 1.0)
    mask = None
    if mask_kind == "bool":
        mask = torch.rand(B, 1, Lq, Lk, device=device) > 0.3
        mask[:, :, 5] = False  # a fully masked row
    elif mask_kind == "additive":
        mask = randn((Lq, Lk), dtype, device, 1.0)
        mask[:, 7::11] = float("-inf")
    kw = dict(attn_mask=mask, is_causal=is_causal, enable_gqa=Hq != Hkv, causal_alignment=alignment)
    return (q, k, v), kw


def run_backward(qkv, kw, dout):
    leaves = [t.detach().clone().requires_grad_() for t in qkv]
    out, lse = torch_oss.attention_with_lse(*leaves, **kw)
    out.backward(dout)
    return out.detach(), lse, [t.grad for t in leaves]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=dtype_id)
@pytest.mark.parametrize("case", ATTENTION_CASES, ids=ATTENTION_IDS)
def test_attention_forward_bitwise_run_to_run(device, dtype, case):
    qkv, kw = attention_inputs(case, dtype, device)
    first_out, first_lse = torch_oss.attention_with_lse(*qkv, **kw)
    for run in range(1, RUNS):
        out, lse = torch_oss.attention_with_lse(*qkv, **kw)
        assert_bitwise_equal(f"attention out run {run}", out, first_out)
        assert_bitwise_equal(f"attention lse run {run}", lse, first_lse)


@pytest.mark.parametrize("case", ATTENTION_CASES, ids=ATTENTION_IDS)
def test_cpu_attention_backward_bitwise_and_independent_of_thread_count(cpu_threads, case):
    """The CPU backward is deterministic without asking (each task owns its dK,
    dV and dQ rows), whatever the thread count."""
    qkv, kw = attention_inputs(case, torch.float32, "cpu")
    dout = randn(qkv[0].shape[:-1] + (qkv[2].shape[-1],), torch.float32, "cpu", 1.0)
    torch.set_num_threads(2)
    first = run_backward(qkv, kw, dout)
    again = run_backward(qkv, kw, dout)
    torch.set_num_threads(1)
    single = run_backward(qkv, kw, dout)
    for other, what in ((again, "run 2"), (single, "1 thread")):
        assert_bitwise_equal(f"out {what}", other[0], first[0])
        assert_bitwise_equal(f"lse {what}", other[1], first[1])
        for name, a, b in zip(("dq", "dk", "dv"), other[2], first[2]):
            assert_bitwise_equal(f"{name} {what}", a, b)


# Larger CUDA cases: many key blocks adding into each dQ block (the Hopper
# backward orders those additions in deterministic mode): a full square,
# and keys in more blocks than an H100 has SMs, bottom-right causal (the
# first key blocks all reach query block 0 at once); head dim 256, whose
# Hopper backward leaves dQ to the query-major kernel in deterministic mode
# (causal with GQA, and a full square)
CUDA_ONLY_CASES = [
    (1, 4, 4, 2048, 2048, 64, False, "top_left", None),
    (1, 2, 1, 300, 20000, 128, True, "bottom_right", None),
    (1, 4, 2, 300, 700, 256, True, "top_left", None),
    (1, 4, 4, 2048, 2048, 256, False, "top_left", None),
]
CUDA_ONLY_IDS = ["square_2k", "keys_20k_causal_br", "d256_gqa2_causal", "d256_square_2k"]

CUDA_MARKS = cuda_param(None).marks
# the CPU backward is deterministic in any mode: there, float32 and the two cheaper cases
DETERMINISTIC_PARAMS = [
    pytest.param(("cpu", torch.float32), case, id=f"cpu-float32-{name}")
    for case, name in zip(ATTENTION_CASES, ATTENTION_IDS) if name in ("gqa2_causal_additive", "d96")
] + [
    pytest.param(("cuda", dtype), case, id=f"cuda-{dtype_id(dtype)}-{name}", marks=CUDA_MARKS)
    for dtype in (torch.bfloat16, torch.float16, torch.float32) for case, name in zip(ATTENTION_CASES, ATTENTION_IDS)
] + [
    pytest.param(("cuda", dtype), case, id=f"cuda-{dtype_id(dtype)}-{name}", marks=CUDA_MARKS)
    for dtype in (torch.bfloat16, torch.float16) for case, name in zip(CUDA_ONLY_CASES, CUDA_ONLY_IDS)
]


@pytest.mark.parametrize("device_dtype,case", DETERMINISTIC_PARAMS)
def test_deterministic_backward_bitwise_and_correct(device_dtype, case, deterministic):
    """torch.use_deterministic_algorithms(True): dq, dk, dv bitwise identical
    over runs, and as accurate as the default mode (tolerance rule against
    float64). References are computed outside deterministic mode (cuBLAS
    matmuls refuse to run in it without CUBLAS_WORKSPACE_CONFIG)."""
    device, dtype = device_dtype
    qkv, kw = attention_inputs(case, dtype, device)
    dout = randn(qkv[0].shape[:-1] + (qkv[2].shape[-1],), dtype, device, 1.0)
    runs = [run_backward(qkv, kw, dout) for _ in range(RUNS)]
    for i, other in enumerate(runs[1:], 1):
        for name, a, b in zip(("dq", "dk", "dv"), other[2], runs[0][2]):
            assert_bitwise_equal(f"deterministic {name} run {i}", a, b)
    torch.use_deterministic_algorithms(False)
    ref = [t.detach().double().requires_grad_() for t in qkv]
    peer = [t.detach().clone().requires_grad_() for t in qkv]
    mask, is_causal, gqa, align = kw["attn_mask"], kw["is_causal"], kw["enable_gqa"], kw["causal_alignment"]
    attention_reference(*ref, mask, is_causal, None, gqa, align)[0].backward(dout.double())
    sdpa_peer(*peer, mask, is_causal, None, gqa, align).backward(dout)
    for i, name in enumerate(("dq", "dk", "dv")):
        assert_tolerance(f"deterministic {name} {dtype}", runs[0][2][i], ref[i].grad, peer[i].grad,
                         ATTENTION_ATOL[dtype])


@pytest.mark.parametrize("device", [cuda_param("cuda")])
def test_deterministic_flag_reaches_the_backward_op(device, deterministic):
    """The flag is read when the forward runs (autograd saves it): a forward
    under deterministic mode gives a bitwise reproducible backward even when
    the backward itself runs after the flag is switched off."""
    qkv, kw = attention_inputs(ATTENTION_CASES[1], torch.bfloat16, device)
    dout = randn(qkv[0].shape, torch.bfloat16, device, 1.0)
    grads = []
    for _ in range(RUNS):
        torch.use_deterministic_algorithms(True)
        leaves = [t.detach().clone().requires_grad_() for t in qkv]
        out = torch_oss.attention(*leaves, **kw)
        torch.use_deterministic_algorithms(False)
        out.backward(dout)
        grads.append([t.grad for t in leaves])
    for other in grads[1:]:
        for name, a, b in zip(("dq", "dk", "dv"), other, grads[0]):
            assert_bitwise_equal(f"{name} (flag at forward time)", a, b)
