"""Concurrency: the ops called from several Python threads and several CUDA
streams at once give the results of sequential calls (bitwise: the kernels are
deterministic), they run on the caller's current stream, and no hidden global
state leaks between threads (an error provoked in one thread does not change
the results or the error messages of another)."""

import threading

import pytest
import torch
from _reliability import assert_bitwise_equal
from _util import DEVICES, cuda_param

import torch_oss

THREADS = 4


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def randn(shape, dtype, device, scale=1.0):
    return (torch.randn(shape, dtype=torch.float64) * scale).to(dtype=dtype, device=device)


def workload(device, seed, dtype=torch.float32):
    """A list of (name, fn, inputs): softmax family forward and backward and
    attention forward and backward (with GQA, causal and a mask), each with
    inputs of its own."""
    torch.manual_seed(seed)
    x = randn((33, 1000 + seed), dtype, device, 3.0)
    y = torch_oss.softmax(x, -1)
    dy = randn(y.shape, dtype, device)
    B, Hq, Hkv, Lq, Lk, D = 2, 4, 2, 70 + seed, 130, 64
    q, k, v = (randn(s, dtype, device) for s in ((B, Hq, Lq, D), (B, Hkv, Lk, D), (B, Hkv, Lk, D)))
    mask = torch.rand(B, 1, Lq, Lk, device=device) > 0.2
    out, lse = torch.ops.oss.attention(q, k, v, mask, True, None, True, "bottom_right")
    dout = randn(out.shape, dtype, device)

    def attention_backward(dout, q, k, v, out, lse, mask):
        return torch.ops.oss.attention_backward(dout, q, k, v, out, lse, mask, True, None, True, "bottom_right",
                                                False)

    return [
        ("softmax", lambda x: torch_oss.softmax(x, -1), (x,)),
        ("log_softmax dim 0", lambda x: torch_oss.log_softmax(x, 0), (x,)),
        ("softmax_backward", lambda dy, y: torch.ops.oss.softmax_backward(dy, y, -1, dtype), (dy, y)),
        ("attention", lambda q, k, v, m: torch_oss.attention_with_lse(q, k, v, attn_mask=m, is_causal=True,
                                                                       enable_gqa=True,
                                                                       causal_alignment="bottom_right"),
         (q, k, v, mask)),
        ("attention_backward", attention_backward, (dout, q, k, v, out, lse, mask)),
    ]


def flatten(result):
    return list(result) if isinstance(result, (tuple, list)) else [result]


def sequential_results(works):
    return [[flatten(fn(*inputs)) for _, fn, inputs in work] for work in works]


def run_threads(target, n):
    errors = []
    barrier = threading.Barrier(n)

    def wrapped(i):
        try:
            barrier.wait()
            target(i)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append((i, e))

    threads = [threading.Thread(target=wrapped, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
        assert not t.is_alive(), "a thread hung"
    if errors:
        i, e = errors[0]
        raise AssertionError(f"thread {i} failed ({len(errors)} threads in all): {e!r}") from e


# ---------------------------------------------------------------------------
# threads (CPU and CUDA)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_threads_match_sequential_results(device):
    works = [workload(device, seed) for seed in range(THREADS)]
    expected = sequential_results(works)
    if device == "cuda":
        torch.cuda.synchronize()  # inputs and references are ready before the side streams start
    got = [None] * THREADS

    def body(i):
        stream = torch.cuda.Stream() if device == "cuda" else None
        results = []
        with torch.cuda.stream(stream) if stream is not None else _nullcontext():
            for _ in range(3):
                results = [flatten(fn(*inputs)) for _, fn, inputs in works[i]]
        if stream is not None:
            stream.synchronize()
        got[i] = results

    run_threads(body, THREADS)
    for i in range(THREADS):
        for (name, _, _), ours, ref in zip(works[i], got[i], expected[i]):
            for j, (a, b) in enumerate(zip(ours, ref)):
                assert_bitwise_equal(f"thread {i} {name} output {j}", a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_autograd_in_threads_matches_sequential(device):
    """Full forward + backward through autograd in every thread at once."""
    def job(seed):
        torch.manual_seed(100 + seed)
        q, k, v = (randn((1, 4, 90, 32), torch.float32, device).requires_grad_() for _ in range(3))
        x = randn((17, 301), torch.float32, device, 3.0).requires_grad_()
        return q, k, v, x

    def compute(q, k, v, x):
        out = torch_oss.attention(q, k, v, is_causal=True)
        loss = (out * out).sum() + (torch_oss.log_softmax(x, -1) * x.detach()).sum()
        return torch.autograd.grad(loss, (q, k, v, x))

    inputs = [job(i) for i in range(THREADS)]
    expected = [compute(*inp) for inp in inputs]
    got = [None] * THREADS

    def body(i):
        for _ in range(3):
            got[i] = compute(*inputs[i])
        if device == "cuda":
            torch.cuda.current_stream().synchronize()

    run_threads(body, THREADS)
    for i in range(THREADS):
        for name, a, b in zip(("dq", "dk", "dv", "dx"), got[i], expected[i]):
            assert_bitwise_equal(f"thread {i} {name}", a, b)


# ---------------------------------------------------------------------------
# CUDA streams
# ---------------------------------------------------------------------------

SLEEP_CYCLES = 200_000_000  # ~0.1 s of GPU time


@pytest.mark.parametrize("device", [cuda_param("cuda")])
def test_ops_run_on_the_current_stream(device):
    """Each op is called on a side stream whose inputs are written by that same
    stream after a long sleep. On the side stream, the op sees the inputs;
    launched on any other stream (the default one, say) it would read the NaN
    the buffers held before the copy, and the result would differ."""
    work = workload(device, 7)
    expected = sequential_results([work])[0]
    torch.cuda.synchronize()
    for (name, fn, inputs), ref in zip(work, expected):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            staged = []
            for t in inputs:
                s = torch.empty_like(t)
                if s.dtype.is_floating_point:
                    s.fill_(float("nan"))
                else:
                    s.fill_(False if s.dtype == torch.bool else 0)
                staged.append(s)
            torch.cuda._sleep(SLEEP_CYCLES)
            for s, t in zip(staged, inputs):
                s.copy_(t)
            result = flatten(fn(*staged))
        side.synchronize()
        for j, (a, b) in enumerate(zip(result, ref)):
            assert_bitwise_equal(f"{name} output {j} on a side stream", a, b)


@pytest.mark.parametrize("device", [cuda_param("cuda")])
def test_many_streams_at_once(device):
    """Several streams, each running the whole workload on its own inputs
    (queued without synchronisation in between), give the sequential results."""
    works = [workload(device, seed) for seed in range(THREADS)]
    expected = sequential_results(works)
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream() for _ in works]
    got = []
    for stream in streams:
        stream.wait_stream(torch.cuda.current_stream())
    for rep in range(3):
        got = [[] for _ in works]
        for i, (stream, work) in enumerate(zip(streams, works)):
            with torch.cuda.stream(stream):
                torch.cuda._sleep(SLEEP_CYCLES // 20)
                got[i] = [flatten(fn(*inputs)) for _, fn, inputs in work]
    torch.cuda.synchronize()
    for i in range(len(works)):
        for (name, _, _), ours, ref in zip(works[i], got[i], expected[i]):
            for j, (a, b) in enumerate(zip(ours, ref)):
                assert_bitwise_equal(f"stream {i} {name} output {j}", a, b)


# ---------------------------------------------------------------------------
# errors in one thread, results in another
# ---------------------------------------------------------------------------


def error_cases(device):
    """(callable, exception type, text its message must hold, texts it must not hold)."""
    q = torch.randn(1, 4, 8, 16, device=device)
    k = torch.randn(1, 2, 8, 16, device=device)
    x = torch.randn(4, 6, device=device)
    others = ["key.dtype", "dim=7", "enable_gqa", "head_dim must be in", "attn_mask"]
    cases = [
        (lambda: torch_oss.attention(q, k.double(), k), TypeError, "key.dtype"),
        (lambda: torch_oss.softmax(x, 7), IndexError, "dim=7"),
        (lambda: torch_oss.attention(q, k, k), ValueError, "enable_gqa"),
        (lambda: torch_oss.attention(q[..., :0], k[..., :0], k), ValueError, "head_dim must be in"),
        (lambda: torch_oss.attention(q, q, q, attn_mask=torch.ones(3, 8, dtype=torch.bool, device=device)),
         ValueError, "attn_mask"),
    ]
    return [(call, exc, text, [o for o in others if o != text]) for call, exc, text in cases]


@pytest.mark.parametrize("device", DEVICES)
def test_errors_in_one_thread_do_not_leak_into_others(device):
    """Half the threads keep provoking errors (each thread its own kind); the
    other half run good calls. Every good result equals the sequential one,
    every error message is the thread's own."""
    cases = error_cases(device)
    work = workload(device, 3)
    expected = sequential_results([work])[0]
    n = 2 * len(cases)
    iterations = 30

    def body(i):
        if i % 2 == 0:
            call, exc, text, foreign = cases[i // 2]
            for _ in range(iterations):
                try:
                    call()
                except exc as e:
                    msg = str(e)
                    assert text in msg, f"thread {i}: message {msg!r} lacks {text!r}"
                    leaked = [o for o in foreign if o in msg]
                    assert not leaked, f"thread {i}: message {msg!r} holds another thread's {leaked}"
                else:
                    raise AssertionError(f"thread {i}: bad call returned a result")
        else:
            for _ in range(iterations // 3):
                for (name, fn, inputs), ref in zip(work, expected):
                    for j, (a, b) in enumerate(zip(flatten(fn(*inputs)), ref)):
                        assert_bitwise_equal(f"thread {i} {name} output {j}", a, b)
            if device == "cuda":
                torch.cuda.current_stream().synchronize()

    run_threads(body, n)
