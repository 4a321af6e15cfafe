"""torch_oss.enable() / disable() / enabled(): PyTorch's softmax, log_softmax,
scaled_dot_product_attention and cross_entropy (and their aliases) routed to
torch.ops.oss in eager mode and under torch.compile(fullgraph=True); fallbacks,
their accounting and strict mode; exact restoration of the original functions."""

import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
from _util import (ATTENTION_ATOL, DEVICES, FLOAT_DTYPES, SOFTMAX_ATOL, assert_tolerance, attention_reference,
                   awkward_randn)
from torch._dynamo.testing import AotEagerAndRecordGraphs
from torch.utils._python_dispatch import TorchDispatchMode

import torch_oss
from torch_oss import patching

SDPA = "torch.nn.functional.scaled_dot_product_attention"
CROSS_ENTROPY = "torch.nn.functional.cross_entropy"


@pytest.fixture(autouse=True)
def clean_state():
    torch_oss.disable()
    torch_oss.reset_fallback_stats()
    yield
    torch_oss.disable()
    torch_oss.reset_fallback_stats()


def enabled(**kw):
    return torch_oss.enabled(transformers=False, **kw)


class OpRecorder(TorchDispatchMode):
    """Records the names of the operators that reach the dispatcher (below
    autograd), e.g. "oss.softmax.default" or "aten._softmax.default"."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))

    def has(self, prefix):
        return any(op.startswith(prefix) for op in self.ops)


def graph_ops(gm):
    """Targets of the call nodes of an FX graph, as strings ('method:softmax'
    for method calls)."""
    out = set()
    for n in gm.graph.nodes:
        if n.op == "call_function":
            out.add(str(n.target))
        elif n.op == "call_method":
            out.add(f"method:{n.target}")
    return out


def mentions(ops, word):
    return any(word in op for op in ops)


# name -> (is_log, fn(x, dim, **kw)); every fn looks its function up at call time
SOFTMAX_ALIASES = {
    "F.softmax": (False, lambda x, d, **kw: F.softmax(x, d, **kw)),
    "F.log_softmax": (True, lambda x, d, **kw: F.log_softmax(x, dim=d, **kw)),
    "torch.softmax": (False, lambda x, d, **kw: torch.softmax(x, d, **kw)),
    "torch.log_softmax": (True, lambda x, d, **kw: torch.log_softmax(x, d, **kw)),
    "Tensor.softmax": (False, lambda x, d, **kw: x.softmax(d, **kw)),
    "Tensor.log_softmax": (True, lambda x, d, **kw: x.log_softmax(dim=d, **kw)),
    "torch.special.softmax": (False, lambda x, d, **kw: torch.special.softmax(x, d, **kw)),
    "torch.special.log_softmax": (True, lambda x, d, **kw: torch.special.log_softmax(x, d, **kw)),
    "nn.Softmax": (False, lambda x, d, **kw: torch.nn.Softmax(dim=d)(x)),
    "nn.LogSoftmax": (True, lambda x, d, **kw: torch.nn.LogSoftmax(dim=d)(x)),
}
TAKES_DTYPE = [a for a in SOFTMAX_ALIASES if not a.startswith("nn.")]


def softmax_ref(x, dim, log, dtype=None):
    x64 = x.to(torch.float64)
    return F.log_softmax(x64, dim) if log else F.softmax(x64, dim)


# ---------------------------------------------------------------------------
# enable / disable / enabled
# ---------------------------------------------------------------------------


def current_attributes():
    return {name: getattr(owner_of(), attr) for name, (owner_of, attr) in patching._TARGETS.items()}


def test_enable_disable_restore_the_exact_originals():
    before = current_attributes()
    assert "softmax" not in vars(torch.Tensor) and "log_softmax" not in vars(torch.Tensor)
    assert not torch_oss.is_enabled()
    torch_oss.enable(transformers=False)
    torch_oss.enable(transformers=False)  # idempotent: no wrapper of a wrapper
    assert torch_oss.is_enabled()
    during = current_attributes()
    for name in before:
        assert during[name] is not before[name], name
        assert during[name] is patching._WRAPPERS[name], name
    assert F.softmax is patching._WRAPPERS["torch.nn.functional.softmax"]
    torch_oss.disable()
    assert not torch_oss.is_enabled()
    after = current_attributes()
    for name in before:
        assert after[name] is before[name], name
    # Tensor.softmax lives on torch._C.TensorBase; nothing is left on torch.Tensor
    assert "softmax" not in vars(torch.Tensor) and "log_softmax" not in vars(torch.Tensor)
    assert torch.Tensor.softmax is torch._C.TensorBase.softmax
    torch_oss.disable()  # disabling twice is harmless
    assert current_attributes() == after


def test_context_manager_nests_and_restores_state():
    q = torch.randn(1, 2, 4, 300)  # head dim 300: a fallback
    with enabled():
        assert torch_oss.is_enabled()
        with enabled(strict=True):
            with pytest.raises(torch_oss.FallbackError):
                F.scaled_dot_product_attention(q, q, q)
        assert torch_oss.is_enabled()  # the outer block is still active, and not strict
        with pytest.warns(torch_oss.FallbackWarning):
            F.scaled_dot_product_attention(q, q, q)
    assert not torch_oss.is_enabled()
    assert F.scaled_dot_product_attention is torch._C._nn.scaled_dot_product_attention
    with pytest.raises(RuntimeError, match="boom"):
        with enabled():
            raise RuntimeError("boom")
    assert not torch_oss.is_enabled() and torch.softmax is torch._C._VariableFunctions.softmax


def test_import_does_not_import_transformers():
    code = "import sys, torch_oss; assert 'transformers' not in sys.modules, 'transformers imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------
# Eager routing and values
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("alias", list(SOFTMAX_ALIASES))
def test_softmax_aliases_route_to_oss(device, alias):
    log, fn = SOFTMAX_ALIASES[alias]
    op = "oss.log_softmax" if log else "oss.softmax"
    for dtype in FLOAT_DTYPES:
        for shape, dim in (((5, 37), -1), ((3, 17, 6), 1), ((129,), 0)):
            x = awkward_randn(shape, dtype, device)
            peer = fn(x, dim)  # PyTorch's own function, same dtype
            with OpRecorder() as rec_peer:
                fn(x, dim)
            with enabled(), OpRecorder() as rec:
                ours = fn(x, dim)
            assert rec.has(op) and not rec.has("aten._softmax") and not rec.has("aten._log_softmax"), rec.ops
            assert not rec_peer.has(op)
            assert ours.dtype == peer.dtype == dtype
            assert_tolerance(f"{alias} {dtype} {shape} dim={dim}", ours, softmax_ref(x, dim, log), peer,
                             SOFTMAX_ATOL[dtype])
    assert torch_oss.fallback_stats() == {}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("alias", TAKES_DTYPE)
def test_softmax_dtype_argument(device, alias):
    log, fn = SOFTMAX_ALIASES[alias]
    x = awkward_randn((6, 50), torch.float16, device)
    peer = fn(x, -1, dtype=torch.float32)
    with enabled(), OpRecorder() as rec:
        ours = fn(x, -1, dtype=torch.float32)
    assert rec.has("oss.") and ours.dtype == torch.float32
    assert_tolerance(alias, ours, softmax_ref(x, -1, log), peer, SOFTMAX_ATOL[torch.float32])
    # integer input with dtype= casts first, as in PyTorch
    xi = torch.randint(-5, 5, (4, 9), device=device)
    with enabled():
        got = fn(xi, -1, dtype=torch.float64)
    torch.testing.assert_close(got, fn(xi, -1, dtype=torch.float64))
    assert torch_oss.fallback_stats() == {}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("alias", ["F.softmax", "Tensor.log_softmax", "torch.special.softmax"])
def test_softmax_gradients_route_to_oss(device, alias):
    log, fn = SOFTMAX_ALIASES[alias]
    x = awkward_randn((7, 45), torch.float32, device)
    grad = torch.randn_like(x)
    leaves = {k: x.detach().to(torch.float64 if k == "ref" else x.dtype).requires_grad_() for k in
              ("ours", "peer", "ref")}
    fn(leaves["peer"], -1).backward(grad)
    fn(leaves["ref"], -1).backward(grad.double())
    with enabled(), OpRecorder() as rec:
        fn(leaves["ours"], -1).backward(grad)
    assert rec.has("oss.log_softmax_backward" if log else "oss.softmax_backward"), rec.ops
    assert_tolerance(alias, leaves["ours"].grad, leaves["ref"].grad, leaves["peer"].grad, SOFTMAX_ATOL[x.dtype])


def test_functional_softmax_implicit_dim_keeps_pytorch_rule():
    x = torch.randn(2, 3, 4)
    with pytest.warns(UserWarning, match="Implicit dimension"):
        expected = F.softmax(x)
    with enabled(), OpRecorder() as rec:
        with pytest.warns(UserWarning, match="Implicit dimension") as record:
            got = F.softmax(x)
    assert rec.has("oss.softmax")
    assert record[0].filename == __file__  # the deprecation points at the caller, as in PyTorch
    torch.testing.assert_close(got, expected)


def sdpa_cases(dtype, device):
    def qkv(B, Hq, Hkv, Lq, Lk, D, Dv=None):
        Dv = Dv or D
        return (torch.randn(B, Hq, Lq, D, dtype=dtype, device=device),
                torch.randn(B, Hkv, Lk, D, dtype=dtype, device=device),
                torch.randn(B, Hkv, Lk, Dv, dtype=dtype, device=device))

    g = torch.Generator().manual_seed(0)
    bool_mask = torch.rand(2, 1, 19, 23, generator=g) > 0.4
    bool_mask[..., 0] = True  # no fully masked rows (PyTorch's CUDA kernels disagree on those)
    float_mask = torch.randn(1, 3, 19, 23, generator=g).to(dtype)
    return {
        "plain": (qkv(2, 3, 3, 19, 23, 32), {}),
        "causal_top_left": (qkv(1, 2, 2, 17, 29, 64), {"is_causal": True}),
        "gqa": (qkv(2, 6, 2, 33, 33, 40), {"enable_gqa": True, "is_causal": True}),
        "bool_mask": (qkv(2, 3, 3, 19, 23, 32), {"attn_mask": bool_mask.to(device)}),
        "float_mask_scale": (qkv(2, 3, 3, 19, 23, 16, 24), {"attn_mask": float_mask.to(device), "scale": 0.3}),
        "3d": (tuple(t[:, 0] for t in qkv(3, 1, 1, 21, 13, 8)), {}),
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_sdpa_routes_to_oss(device, dtype):
    for name, ((q, k, v), kw) in sdpa_cases(dtype, device).items():
        peer = F.scaled_dot_product_attention(q, k, v, **kw)
        with enabled(), OpRecorder() as rec:
            ours = F.scaled_dot_product_attention(q, k, v, **kw)
        assert rec.has("oss.attention") and not mentions(rec.ops, "scaled_dot_product"), (name, rec.ops)
        mask = kw.get("attn_mask")
        ref, _ = attention_reference(q, k, v, mask, kw.get("is_causal", False), kw.get("scale"),
                                     kw.get("enable_gqa", False))
        assert ours.dtype == peer.dtype and ours.shape == peer.shape
        assert_tolerance(f"sdpa {name} {dtype}", ours, ref, peer, ATTENTION_ATOL[dtype])
    assert torch_oss.fallback_stats() == {}


@pytest.mark.parametrize("device", DEVICES)
def test_sdpa_with_broadcast_leading_dims_routes_to_oss(device):
    """SDPA's shapes beyond (B, H, L, D): 5-D inputs with key/value broadcast
    over a leading dim, and a 3-D query against 4-D key/value, run on torch_oss
    (no fallback) with SDPA's result shape and values."""
    g = torch.Generator().manual_seed(7)
    cases = [((2, 2, 3, 19, 32), (2, 1, 3, 23, 32)), ((3, 17, 16), (2, 3, 29, 16))]
    for qshape, kshape in cases:
        q, k, v = (torch.randn(s, generator=g).to(device) for s in (qshape, kshape, kshape))
        peer = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
        with enabled(), OpRecorder() as rec:
            ours = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        assert rec.has("oss.attention") and not mentions(rec.ops, "scaled_dot_product"), (qshape, rec.ops)
        assert ours.shape == peer.shape
        assert_tolerance(f"sdpa {qshape} {kshape}", ours, ref, peer, ATTENTION_ATOL[torch.float32])
    assert torch_oss.fallback_stats() == {}


@pytest.mark.parametrize("device", DEVICES)
def test_multihead_attention_module_routes_to_oss(device):
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(32, 4, batch_first=True, device=device)
    x = torch.randn(2, 11, 32, device=device, requires_grad=True)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(11, device=device)
    expected = mha(x, x, x, attn_mask=mask, need_weights=False, is_causal=True)[0]
    with enabled(), OpRecorder() as rec:
        got = mha(x, x, x, attn_mask=mask, need_weights=False, is_causal=True)[0]
    assert rec.has("oss.attention"), rec.ops
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


# ---------------------------------------------------------------------------
# Fallbacks
# ---------------------------------------------------------------------------


class MyTensor(torch.Tensor):
    pass


def fallback_cases(device):
    q = torch.randn(1, 2, 9, 16, device=device)
    q300 = torch.randn(1, 2, 9, 300, device=device)
    x = torch.randn(4, 10, device=device)
    mask = torch.randn(9, 9, device=device).requires_grad_()
    sub = x.as_subclass(MyTensor)
    buf = torch.empty(4, 10, device=device)
    probs, labels = torch.rand(4, 10, device=device).softmax(-1), torch.randint(0, 10, (4,), device=device)
    return [
        # (function, reason substring, call, compare the value with PyTorch's)
        (CROSS_ENTROPY, "probability targets of dtype torch.float64", lambda: F.cross_entropy(x, probs.double()),
         True),
        (CROSS_ENTROPY, "size_average", lambda: F.cross_entropy(x, labels, size_average=False), True),
        (SDPA, "head dim 300 >", lambda: F.scaled_dot_product_attention(q300, q300, q300), True),
        ("torch.softmax", "out=", lambda: torch.softmax(x, -1, out=buf), True),
        ("torch.Tensor.softmax", "tensor subclass (MyTensor)", lambda: sub.softmax(-1), True),
        (SDPA, "attn_mask requires grad", lambda: F.scaled_dot_product_attention(q, q, q, attn_mask=mask), True),
        ("torch.nn.functional.log_softmax", "tensor subclass", lambda: F.log_softmax(sub, 1), True),
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_fallbacks_run_pytorch_count_and_warn_once(device):
    cases = fallback_cases(device)
    expected = [call() if compare else None for _, _, call, compare in cases]  # before enable: PyTorch
    with enabled():
        for (function, reason, call, compare), want in zip(cases, expected):
            with OpRecorder() as rec, warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got = call()
                call()
            assert not rec.has("oss."), (function, rec.ops)
            ours = [w for w in caught if issubclass(w.category, torch_oss.FallbackWarning)]
            assert len(ours) == 1, (function, [str(w.message) for w in caught])
            assert reason in str(ours[0].message) and function in str(ours[0].message)
            assert ours[0].filename == __file__, (function, ours[0].filename)  # points at the caller
            counts = torch_oss.fallback_stats()[function]
            assert [c for r, c in counts.items() if reason in r] == [2], counts
            if compare:
                assert type(got) is type(want)
                torch.testing.assert_close(got, want, atol=0, rtol=0)
    # each call was counted once, under the function the user called
    total = sum(c for per in torch_oss.fallback_stats().values() for c in per.values())
    assert total == 2 * len(cases), torch_oss.fallback_stats()
    torch_oss.reset_fallback_stats()
    assert torch_oss.fallback_stats() == {}


@pytest.mark.parametrize("device", DEVICES)
def test_unsupported_dtype_falls_back_with_pytorch_error(device):
    xi = torch.randint(0, 5, (3, 4), device=device)
    with pytest.raises(RuntimeError) as pytorch_error:
        torch.softmax(xi, -1)
    with enabled():
        with pytest.warns(torch_oss.FallbackWarning, match="input dtype torch.int64"):
            with pytest.raises(RuntimeError) as ours:
                torch.softmax(xi, -1)
    assert str(ours.value) == str(pytorch_error.value)
    assert torch_oss.fallback_stats() == {"torch.softmax": {next(iter(torch_oss.fallback_stats()["torch.softmax"])): 1}}


@pytest.mark.parametrize("device", DEVICES)
def test_strict_mode_raises_instead_of_falling_back(device):
    q = torch.randn(1, 2, 9, 16, device=device)
    q300 = torch.randn(1, 2, 9, 300, device=device)
    with enabled(strict=True):
        with pytest.raises(torch_oss.FallbackError, match="strict mode.*head dim 300"):
            F.scaled_dot_product_attention(q300, q300, q300)
        with pytest.raises(NotImplementedError, match="out= is not supported"):
            torch.softmax(q, -1, out=torch.empty_like(q))
        with OpRecorder() as rec:  # what torch_oss serves still runs
            F.scaled_dot_product_attention(q, q, q)
        assert rec.has("oss.attention")
    assert torch_oss.fallback_stats() == {}


# ---------------------------------------------------------------------------
# Autocast
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_autocast_matches_pytorch_policies(device):
    amp_dtype = torch.bfloat16 if device == "cpu" else torch.float16
    q, k, v = (torch.randn(2, 3, 20, 32, device=device) for _ in range(3))
    x = torch.randn(5, 40, device=device, dtype=amp_dtype)
    with torch.autocast(device, dtype=amp_dtype):
        peer_attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        peer_sm = F.softmax(x, -1)
        with enabled(), OpRecorder() as rec:
            ours_attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            ours_sm = F.softmax(x, -1)
    assert rec.has("oss.attention") and rec.has("oss.softmax")
    assert ours_attn.dtype == peer_attn.dtype == amp_dtype  # attention runs in the autocast dtype
    assert ours_sm.dtype == peer_sm.dtype  # float32 on CUDA (fp32_set_opt_dtype), unchanged on CPU
    ref, _ = attention_reference(q.to(amp_dtype), k.to(amp_dtype), v.to(amp_dtype), is_causal=True)
    assert_tolerance("autocast sdpa", ours_attn, ref, peer_attn, ATTENTION_ATOL[amp_dtype])
    assert_tolerance("autocast softmax", ours_sm, softmax_ref(x, -1, False), peer_sm, SOFTMAX_ATOL[ours_sm.dtype])


# ---------------------------------------------------------------------------
# torch.compile
# ---------------------------------------------------------------------------


def compile_and_record(fn, *args):
    backend = AotEagerAndRecordGraphs()
    out = torch.compile(fn, backend=backend, fullgraph=True)(*args)
    return out, backend


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_aliases_route_to_oss_without_graph_breaks(device):
    torch._dynamo.reset()
    x = awkward_randn((6, 30), torch.float32, device)
    for alias, (log, fn) in SOFTMAX_ALIASES.items():
        op = "oss.log_softmax" if log else "oss.softmax"
        for where, f in (("input", lambda t, fn=fn: fn(t, -1) * 2), ("intermediate", lambda t, fn=fn: fn(t * 3, -1))):
            leaf = x.detach().clone().requires_grad_()
            with enabled():
                explained = torch._dynamo.explain(f)(leaf)
                out, rec = compile_and_record(f, leaf)
                out.sum().backward()
            label = f"{alias} on an {where} tensor"
            assert explained.graph_break_count == 0, (label, explained.break_reasons)
            fw, bw = graph_ops(rec.fw_graphs[0]), graph_ops(rec.bw_graphs[0])
            assert mentions(fw, op) and not mentions(fw, "aten._softmax") and not mentions(fw, "aten._log_softmax"), \
                (label, fw)
            assert mentions(bw, op + "_backward"), (label, bw)
            if not (alias.startswith("Tensor.") and where == "intermediate"):
                # dynamo itself inlined the wrapper (module docstring: Tensor methods on intermediates are
                # routed when AOTAutograd traces the graph instead)
                assert mentions(graph_ops(rec.graphs[0]), op), (label, graph_ops(rec.graphs[0]))
            expected = f(x.detach().clone())
            assert_tolerance(label, out, expected.double(), None, 1e-5)
    assert torch_oss.fallback_stats() == {}


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_code_recompiles_after_disable(device):
    torch._dynamo.reset()

    def f(x, q):
        return F.softmax(x, -1).sum() + F.scaled_dot_product_attention(q, q, q, is_causal=True).sum() + \
            torch.log_softmax(x, 0).sum() + x.softmax(1).sum()

    backend = AotEagerAndRecordGraphs()
    compiled = torch.compile(f, backend=backend, fullgraph=True)
    x, q = torch.randn(4, 9, device=device), torch.randn(1, 2, 7, 16, device=device)
    with enabled():
        first = compiled(x, q)
    second = compiled(x, q)  # originals again: dynamo's guards on the patched attributes recompile
    with enabled(), torch.profiler.profile() as prof:
        third = compiled(x, q)  # the first compiled entry's guards hold again: reused, no third graph
    assert len(backend.fw_graphs) == 2
    ops = [graph_ops(g) for g in backend.fw_graphs]
    assert mentions(ops[0], "oss.softmax") and mentions(ops[0], "oss.attention") and mentions(ops[0], "oss.log")
    assert not mentions(ops[1], "oss.") and mentions(ops[1], "aten._softmax"), ops[1]
    assert "oss::attention" in {e.key for e in prof.key_averages()}
    torch.testing.assert_close(first, second, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(first, third)


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_fallbacks_counted_per_call_and_warned_once(device):
    torch._dynamo.reset()
    q = torch.randn(1, 2, 9, 300, device=device)  # head dim 300: attention falls back

    def f(q):
        return F.scaled_dot_product_attention(q, q, q) + F.softmax(q, -1)

    with enabled(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, rec = compile_and_record(f, q)
        compiled = torch.compile(f, backend=rec, fullgraph=True)
        for _ in range(3):
            compiled(q)
    ours = [w for w in caught if issubclass(w.category, torch_oss.FallbackWarning)]
    assert len(ours) == 1 and "head dim 300" in str(ours[0].message)
    assert list(torch_oss.fallback_stats()) == [SDPA]
    assert list(torch_oss.fallback_stats()[SDPA].values()) == [4]
    fw = graph_ops(rec.fw_graphs[0])
    assert mentions(fw, "oss.softmax") and not mentions(fw, "oss.attention"), fw
    assert mentions(graph_ops(rec.graphs[0]), "aten.scaled_dot_product_attention"), graph_ops(rec.graphs[0])
    assert out.shape == q.shape


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_strict_mode_raises(device):
    torch._dynamo.reset()
    q = torch.randn(1, 2, 9, 300, device=device)  # head dim 300: a fallback
    with enabled(strict=True):
        with pytest.raises(Exception, match="strict mode"):
            torch.compile(lambda q: F.scaled_dot_product_attention(q, q, q), backend="eager", fullgraph=True)(q)
        # without fullgraph dynamo falls back to eager for the frame, where the error is the plain FallbackError
        with pytest.raises(torch_oss.FallbackError):
            torch.compile(lambda q: F.scaled_dot_product_attention(q, q, q) * 2, backend="eager")(q)


@pytest.mark.parametrize("device", DEVICES)
def test_inductor_block_fullgraph(device):
    torch._dynamo.reset()
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 96, device=device)

    def block(x):
        q, k, v = lin(x).view(2, 13, 3, 4, 8).unbind(2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return torch.log_softmax(y.transpose(1, 2).reshape(2, 13, 32), -1)

    x = torch.randn(2, 13, 32, device=device)
    expected = block(x)
    with enabled():
        got = torch.compile(block, fullgraph=True)(x)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert torch_oss.fallback_stats() == {}


# ---------------------------------------------------------------------------
# F.cross_entropy
# ---------------------------------------------------------------------------


def _cross_entropy_cases(device, dtype):
    classes = 1000
    weight = torch.rand(classes, dtype=dtype, device=device) + 0.5
    return [
        {},
        {"reduction": "none"},
        {"reduction": "sum", "label_smoothing": 0.1},
        {"weight": weight},
        {"weight": weight, "label_smoothing": 0.2, "reduction": "none"},
        {"ignore_index": 7},
    ]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cross_entropy_routes_to_oss(device, dtype):
    """Values, result dtype and gradients of F.cross_entropy while enabled,
    against float64 with PyTorch's own result as the peer (tolerance rule)."""
    x = awkward_randn((37, 1000), dtype, device)
    target = torch.randint(0, 1000, (37,), device=device)
    target[3] = -100
    target[5] = 7
    for kwargs in _cross_entropy_cases(device, dtype):
        if kwargs.get("ignore_index", -100) != -100:
            target = target.clone()
            target[3] = 8  # -100 is a class index out of range there
        wide = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
        leaves = {name: x.detach().to(torch.float64 if name == "ref" else dtype).requires_grad_()
                  for name in ("ours", "peer", "ref")}
        peer = F.cross_entropy(leaves["peer"], target, **kwargs)
        ref = F.cross_entropy(leaves["ref"], target, **wide)
        with enabled(), OpRecorder() as rec:
            ours = F.cross_entropy(leaves["ours"], target, **kwargs)
        label = f"{dtype} {device} {sorted(kwargs)}"
        assert rec.has("oss.cross_entropy"), (label, rec.ops)
        assert ours.dtype == peer.dtype and ours.shape == peer.shape, label
        atol = SOFTMAX_ATOL[dtype]
        assert_tolerance(f"loss {label}", ours, ref, peer, atol)
        grad = torch.randn_like(ref)
        for name, out in (("ours", ours), ("peer", peer), ("ref", ref)):
            out.backward(grad.to(out.dtype))
        assert leaves["ours"].grad.dtype == dtype
        assert_tolerance(f"grad {label}", leaves["ours"].grad, leaves["ref"].grad, leaves["peer"].grad, atol)
    assert torch_oss.fallback_stats() == {}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cross_entropy_probability_targets_route_to_oss(device, dtype):
    """F.cross_entropy with class probabilities of the input's dtype while
    enabled: torch_oss's fused probability kernel serves it (not the composed
    log_softmax form); value, result dtype and gradient against float64 with
    PyTorch's own result as the peer."""
    x = awkward_randn((37, 1000), dtype, device)
    probs = torch.rand(37, 1000, device=device).softmax(-1).to(dtype)
    for kwargs in ({}, {"reduction": "none", "label_smoothing": 0.1},
                   {"weight": torch.rand(1000, dtype=dtype, device=device) + 0.5, "reduction": "sum"}):
        wide = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
        leaves = {name: x.detach().to(torch.float64 if name == "ref" else dtype).requires_grad_()
                  for name in ("ours", "peer", "ref")}
        peer = F.cross_entropy(leaves["peer"], probs, **kwargs)
        ref = F.cross_entropy(leaves["ref"], probs.double(), **wide)
        with enabled(), OpRecorder() as rec:
            ours = F.cross_entropy(leaves["ours"], probs, **kwargs)
        label = f"{dtype} {device} {sorted(kwargs)}"
        assert rec.has("oss.cross_entropy_probs") and not rec.has("oss.log_softmax"), (label, rec.ops)
        assert ours.dtype == peer.dtype and ours.shape == peer.shape, label
        assert_tolerance(f"loss {label}", ours, ref, peer, SOFTMAX_ATOL[dtype])
        grad = torch.randn_like(ref)
        for out in (ours, peer, ref):
            out.backward(grad.to(out.dtype))
        assert_tolerance(f"grad {label}", leaves["ours"].grad, leaves["ref"].grad, leaves["peer"].grad,
                         SOFTMAX_ATOL[dtype])
    assert torch_oss.fallback_stats() == {}


def test_cross_entropy_under_autocast_returns_float32():
    x = awkward_randn((8, 300), torch.bfloat16, "cpu").requires_grad_()
    target = torch.randint(0, 300, (8,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = F.cross_entropy(x, target)
        with enabled():
            got = F.cross_entropy(x, target)
    assert got.dtype == want.dtype == torch.float32
    got.backward()
    assert x.grad.dtype == torch.bfloat16
    ref = F.cross_entropy(x.detach().double(), target)
    assert_tolerance("autocast loss", got, ref, want, SOFTMAX_ATOL[torch.float32])


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_cross_entropy_routes_to_oss(device):
    torch._dynamo.reset()
    x = awkward_randn((16, 500), torch.float32, device).requires_grad_()
    target = torch.randint(0, 500, (16,), device=device)

    def loss_of(x):
        return F.cross_entropy(x * 2, target, label_smoothing=0.05)

    with enabled():
        explained = torch._dynamo.explain(loss_of)(x)
        out, rec = compile_and_record(loss_of, x)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert mentions(graph_ops(rec.fw_graphs[0]), "oss.cross_entropy"), graph_ops(rec.fw_graphs[0])
    assert_tolerance("compiled cross_entropy", out, loss_of(x.detach().double()), loss_of(x.detach()),
                     SOFTMAX_ATOL[torch.float32])
