"""Bad inputs: every one raises a clear exception naming the argument, on CPU
and CUDA; none crashes, hangs or returns a result."""

import pytest
import torch
from _util import DEVICES, cuda_param

import torch_oss

F32, F16 = torch.float32, torch.float16


def qkv(device, B=2, Hq=4, Hkv=4, Lq=8, Lk=8, D=16, Dv=None, dtype=F32):
    Dv = D if Dv is None else Dv
    return (torch.randn(B, Hq, Lq, D, dtype=dtype, device=device),
            torch.randn(B, Hkv, Lk, D, dtype=dtype, device=device),
            torch.randn(B, Hkv, Lk, Dv, dtype=dtype, device=device))


def attn(device, **over):
    """Calls torch_oss.attention on good inputs with some of them replaced."""
    q, k, v = qkv(device)
    args = dict(query=q, key=k, value=v)
    args.update(over)
    return lambda: torch_oss.attention(**args)


def op_attn(device, q, k, v, **kw):
    return lambda: torch.ops.oss.attention(q, k, v, kw.get("mask"), kw.get("causal", False), kw.get("scale"),
                                           kw.get("gqa", False), kw.get("align", "top_left"))


def bad_cases(device):
    x = torch.randn(4, 6, device=device)
    q, k, v = qkv(device)
    cases = [
        # softmax family
        ("softmax int input", lambda: torch_oss.softmax(torch.arange(6, device=device), 0), TypeError, "self"),
        ("softmax bool input", lambda: torch_oss.softmax(torch.ones(3, dtype=torch.bool, device=device), 0),
         TypeError, "self"),
        ("softmax complex input", lambda: torch_oss.softmax(torch.randn(3, dtype=torch.complex64, device=device), 0),
         TypeError, "self"),
        ("softmax dim out of range", lambda: torch_oss.softmax(x, 2), IndexError, "dim=2"),
        ("softmax negative dim out of range", lambda: torch_oss.log_softmax(x, -3), IndexError, "dim=-3"),
        ("softmax 0-dim with dim=1", lambda: torch_oss.softmax(torch.tensor(1.0, device=device), 1), IndexError,
         "dim=1"),
        ("softmax integer dtype=", lambda: torch_oss.softmax(x, 1, dtype=torch.int32), TypeError, "dtype"),
        ("softmax_backward shape mismatch",
         lambda: torch.ops.oss.softmax_backward(torch.randn(4, 5, device=device), x, 1, F32), ValueError,
         "grad_output"),
        ("softmax_backward integer input_dtype",
         lambda: torch.ops.oss.log_softmax_backward(x, x, 1, torch.int64), TypeError, "input_dtype"),
        ("softmax_backward integer grad",
         lambda: torch.ops.oss.softmax_backward(torch.ones(4, 6, dtype=torch.int64, device=device), x, 1, F32),
         TypeError, "grad_output"),
        # attention: dtypes
        ("attention integer query", attn(device, query=torch.ones(2, 4, 8, 16, dtype=torch.int32, device=device)),
         TypeError, "query"),
        ("attention bool key", attn(device, key=torch.ones(2, 4, 8, 16, dtype=torch.bool, device=device)),
         TypeError, "key"),
        ("attention complex value", attn(device, value=torch.randn(2, 4, 8, 16, dtype=torch.complex64,
                                                                    device=device)), TypeError, "value"),
        ("attention mixed dtypes", attn(device, key=k.half()), TypeError, "key.dtype"),
        ("attention mixed value dtype", attn(device, value=v.double()), TypeError, "value.dtype"),
        # ranks and shapes
        ("attention 1-D query", attn(device, query=q[0, 0, 0]), ValueError, "query must have at least 2 dims"),
        ("attention 5-D key", op_attn(device, q, k.unsqueeze(0), v), ValueError, "key"),
        ("attention batch dims that do not broadcast", attn(device, key=torch.cat([k, k[:1]]),
                                                           value=torch.cat([v, v[:1]])), ValueError, "broadcast"),
        ("attention gqa heads not a multiple", attn(device, key=k[:, :3], value=v[:, :3], enable_gqa=True),
         ValueError, "multiple"),
        ("attention kv heads mismatch", attn(device, value=v[:, :2]), ValueError, "value.size\\(1\\)"),
        ("attention kv length mismatch", attn(device, value=v[:, :, :5]), ValueError, "value.size\\(2\\)"),
        ("attention head dim mismatch", attn(device, key=torch.randn(2, 4, 8, 8, device=device)), ValueError,
         "key.size\\(-1\\)"),
        ("attention head dim 0", attn(device, query=torch.randn(2, 4, 8, 0, device=device),
                                      key=torch.randn(2, 4, 8, 0, device=device)), ValueError, "head_dim"),
        ("attention head dim 300", attn(device, query=torch.randn(2, 4, 8, 300, device=device),
                                        key=torch.randn(2, 4, 8, 300, device=device)), ValueError, "300"),
        ("attention value head dim 257", attn(device, value=torch.randn(2, 4, 8, 257, device=device)), ValueError,
         "value.size\\(-1\\)=257"),
        # GQA
        ("attention GQA without enable_gqa", attn(device, key=k[:, :2], value=v[:, :2]), ValueError, "enable_gqa"),
        ("attention heads not divisible",
         lambda: torch_oss.attention(torch.randn(2, 6, 8, 16, device=device), k, v, enable_gqa=True), ValueError,
         "multiple"),
        # masks
        ("attention mask wrong shape", attn(device, attn_mask=torch.ones(8, 7, dtype=torch.bool, device=device)),
         ValueError, "attn_mask"),
        ("attention mask too many dims",
         attn(device, attn_mask=torch.ones(1, 1, 1, 8, 8, dtype=torch.bool, device=device)), ValueError,
         "attn_mask"),
        ("attention mask integer dtype", attn(device, attn_mask=torch.ones(8, 8, dtype=torch.int64, device=device)),
         TypeError, "attn_mask"),
        ("attention mask other float dtype",
         attn(device, attn_mask=torch.zeros(8, 8, dtype=torch.float64, device=device)), TypeError, "attn_mask"),
        # scalars
        ("attention NaN scale", attn(device, scale=float("nan")), ValueError, "scale"),
        ("attention inf scale", op_attn(device, q, k, v, scale=float("inf")), ValueError, "scale"),
        ("attention dropout a bool", attn(device, dropout_p=True), ValueError, "dropout_p"),
        ("attention dropout above 1", attn(device, dropout_p=1.5), ValueError, "dropout_p"),
        ("attention dropout negative", attn(device, dropout_p=-0.1), ValueError, "dropout_p"),
        ("attention bad causal_alignment", attn(device, is_causal=True, causal_alignment="center"), ValueError,
         "causal_alignment"),
        ("attention op bad causal_alignment", op_attn(device, q, k, v, causal=True, align="diagonal"), ValueError,
         "causal_alignment"),
        # more dtypes: dtype= that is not floating, non-tensor inputs, other mask dtypes
        ("softmax bool dtype=", lambda: torch_oss.softmax(x, 1, dtype=torch.bool), TypeError, "dtype"),
        ("log_softmax complex dtype=", lambda: torch_oss.log_softmax(x, 1, dtype=torch.complex64), TypeError,
         "dtype"),
        ("log_softmax int8 input", lambda: torch_oss.log_softmax(torch.ones(3, dtype=torch.int8, device=device), 0),
         TypeError, "self"),
        ("softmax dim far out of range", lambda: torch_oss.softmax(x, 2**40), IndexError, "dim=1099511627776"),
        ("attention query not a tensor", attn(device, query=None), TypeError, "query"),
        ("attention op query not a tensor", lambda: torch.ops.oss.attention(None, k, v), TypeError, "query"),
        ("attention integer key and value",
         attn(device, key=torch.ones(2, 4, 8, 16, dtype=torch.int64, device=device),
              value=torch.ones(2, 4, 8, 16, dtype=torch.int64, device=device)), TypeError, "key"),
        ("attention float16 query, float32 key and value", attn(device, query=q.half()), TypeError, "key.dtype"),
        ("attention bfloat16 value", attn(device, value=v.bfloat16()), TypeError, "value.dtype"),
        ("attention 3-D mixed dtypes", lambda: torch_oss.attention(q[0], k[0].double(), v[0]), TypeError,
         "key.dtype"),
        ("attention mask uint8", attn(device, attn_mask=torch.ones(8, 8, dtype=torch.uint8, device=device)),
         TypeError, "attn_mask"),
        ("attention mask complex", attn(device, attn_mask=torch.zeros(8, 8, dtype=torch.complex64, device=device)),
         TypeError, "attn_mask"),
        ("attention float16 mask for float32 query",
         attn(device, attn_mask=torch.zeros(8, 8, dtype=F16, device=device)), TypeError, "attn_mask"),
        # more ranks and shapes
        ("attention mask that does not broadcast", attn(device, query=q.unsqueeze(0), key=k.unsqueeze(0),
                                                         value=v.unsqueeze(0),
                                                         attn_mask=torch.zeros(3, 1, 1, 8, 8, device=device)),
         ValueError, "attn_mask"),
        ("attention 1-D value", op_attn(device, q, k, v[0, 0, 0]), ValueError, "value must be 4-D"),
        ("attention key with 0 heads", attn(device, key=k[:, :0], value=v[:, :0], enable_gqa=True), ValueError,
         "key.size\\(1\\)=0"),
        ("attention value batch mismatch", op_attn(device, q, k, v[:1]), ValueError, "value.size\\(0\\)"),
        ("attention value head dim 0", attn(device, value=v[..., :0]), ValueError, "value.size\\(-1\\)=0"),
        ("attention head dim 257", attn(device, query=torch.randn(2, 4, 8, 257, device=device),
                                        key=torch.randn(2, 4, 8, 257, device=device)), ValueError,
         "query.size\\(-1\\)=257"),
        ("attention more kv heads than query heads", attn(device, query=q[:, :2], enable_gqa=True), ValueError,
         "multiple"),
        ("attention mask wrong batch", attn(device, attn_mask=torch.ones(3, 1, 8, 8, dtype=torch.bool,
                                                                           device=device)), ValueError, "attn_mask"),
        ("attention mask wrong heads", attn(device, attn_mask=torch.ones(1, 3, 8, 8, dtype=torch.bool,
                                                                           device=device)), ValueError, "attn_mask"),
        ("attention mask wrong len_q", attn(device, attn_mask=torch.ones(5, 8, dtype=torch.bool, device=device)),
         ValueError, "attn_mask"),
        ("attention 1-D mask wrong length", attn(device, attn_mask=torch.ones(7, dtype=torch.bool, device=device)),
         ValueError, "attn_mask"),
        # more scalars
        ("attention -inf scale", attn(device, scale=float("-inf")), ValueError, "scale"),
        ("attention scale not a number", attn(device, scale="0.5"), ValueError, "scale"),
        ("attention NaN dropout", attn(device, dropout_p=float("nan")), ValueError, "dropout_p"),
        ("attention dropout not a number", attn(device, dropout_p="0.1"), ValueError, "dropout_p"),
        ("attention causal_alignment not a string", attn(device, is_causal=True, causal_alignment=1), ValueError,
         "causal_alignment"),
        # more backward ops
        ("softmax_backward integer output",
         lambda: torch.ops.oss.softmax_backward(x, torch.ones(4, 6, dtype=torch.int32, device=device), 1, F32),
         TypeError, "output"),
        ("softmax_backward complex grad",
         lambda: torch.ops.oss.log_softmax_backward(torch.randn(4, 6, dtype=torch.complex64, device=device), x, 1,
                                                    F32), TypeError, "grad_output"),
        ("softmax_backward dim out of range", lambda: torch.ops.oss.softmax_backward(x, x, 2, F32), IndexError,
         "dim=2"),
        ("attention_backward out dtype",
         lambda: torch.ops.oss.attention_backward(torch.randn_like(q), q, k, v, torch.randn_like(q).double(),
                                                  torch.zeros(2, 4, 8, device=device), None, False, None, False,
                                                  "top_left", False), TypeError, "out.dtype"),
        ("attention_backward wrong out shape",
         lambda: torch.ops.oss.attention_backward(torch.randn_like(q), q, k, v, torch.randn(2, 4, 8, 15, device=device),
                                                  torch.zeros(2, 4, 8, device=device), None, False, None, False,
                                                  "top_left", False), ValueError, "out has shape"),
        ("attention_backward integer grad_out",
         lambda: torch.ops.oss.attention_backward(torch.ones(2, 4, 8, 16, dtype=torch.int32, device=device), q, k,
                                                  v, torch.randn_like(q), torch.zeros(2, 4, 8, device=device), None,
                                                  False, None, False, "top_left", False), TypeError, "grad_out"),
        ("attention_backward GQA without enable_gqa",
         lambda: torch.ops.oss.attention_backward(torch.randn_like(q), q, k[:, :2], v[:, :2], torch.randn_like(q),
                                                  torch.zeros(2, 4, 8, device=device), None, False, None, False,
                                                  "top_left", False), ValueError, "enable_gqa"),
        # backward op
        ("attention_backward wrong lse shape",
         lambda: torch.ops.oss.attention_backward(torch.randn_like(q), q, k, v, torch.randn_like(q),
                                                  torch.zeros(2, 4, 7, device=device), None, False, None, False,
                                                  "top_left", False), ValueError, "lse"),
        ("attention_backward wrong grad_out shape",
         lambda: torch.ops.oss.attention_backward(torch.randn(2, 4, 8, 15, device=device), q, k, v,
                                                  torch.randn_like(q), torch.zeros(2, 4, 8, device=device), None,
                                                  False, None, False, "top_left", False), ValueError, "grad_out"),
        # attention: score variants
        ("attention window_size not a pair", attn(device, window_size=(3,)), ValueError, "window_size"),
        ("attention window_size below -1", attn(device, window_size=(-2, 4)), ValueError, "window_size"),
        ("attention window_size float", attn(device, window_size=(1.5, 2)), ValueError, "window_size"),
        ("attention window_size int", attn(device, window_size=4), ValueError, "window_size"),
        ("attention softcap negative", attn(device, softcap=-1.0), ValueError, "softcap"),
        ("attention softcap nan", attn(device, softcap=float("nan")), ValueError, "softcap"),
        ("attention softcap inf", attn(device, softcap=float("inf")), ValueError, "softcap"),
        ("attention softcap string", attn(device, softcap="1"), ValueError, "softcap"),
        ("attention alibi_slopes not a tensor", attn(device, alibi_slopes=[0.5] * 4), TypeError, "alibi_slopes"),
        ("attention alibi_slopes float64",
         attn(device, alibi_slopes=torch.ones(4, dtype=torch.float64, device=device)), TypeError, "alibi_slopes"),
        ("attention alibi_slopes wrong heads", attn(device, alibi_slopes=torch.ones(3, device=device)), ValueError,
         "alibi_slopes"),
        ("attention alibi_slopes wrong batch", attn(device, alibi_slopes=torch.ones(3, 4, device=device)),
         ValueError, "alibi_slopes"),
        ("attention alibi_slopes 3-D", attn(device, alibi_slopes=torch.ones(2, 4, 1, device=device)), ValueError,
         "alibi_slopes"),
        ("attention alibi_slopes on meta", attn(device, alibi_slopes=torch.ones(4, device="meta")), ValueError,
         "alibi_slopes"),
        ("attention alibi_slopes requires grad",
         attn(device, alibi_slopes=torch.ones(4, device=device, requires_grad=True)), NotImplementedError,
         "alibi_slopes"),
        ("attention sinks integer", attn(device, sinks=torch.ones(4, dtype=torch.int32, device=device)), TypeError,
         "sinks"),
        ("attention sinks wrong heads", attn(device, sinks=torch.ones(2, device=device)), ValueError, "sinks"),
        ("attention sinks 2-D", attn(device, sinks=torch.ones(2, 4, device=device)), ValueError, "sinks"),
        ("attention sinks on meta", attn(device, sinks=torch.ones(4, device="meta")), ValueError, "sinks"),
        ("attention deterministic not a bool", attn(device, deterministic=1), TypeError, "deterministic"),
        ("attention op window_size below -1",
         lambda: torch.ops.oss.attention(q, k, v, None, False, None, False, "top_left", [0, -3]), ValueError,
         "window_size"),
        ("attention op softcap negative",
         lambda: torch.ops.oss.attention(q, k, v, None, False, None, False, "top_left", [-1, -1], -2.0), ValueError,
         "softcap"),
        ("attention op sinks wrong heads",
         lambda: torch.ops.oss.attention(q, k, v, None, False, None, False, "top_left", [-1, -1], 0.0, None,
                                         torch.zeros(5, device=device)), ValueError, "sinks"),
        ("attention_with_kvcache sinks wrong heads",
         lambda: torch_oss.attention_with_kvcache(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  sinks=torch.zeros(3, device=device)), ValueError, "sinks"),
    ]
    return cases


CASE_NAMES = [c[0] for c in bad_cases("cpu")]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", CASE_NAMES)
def test_bad_input_raises_naming_the_argument(device, name):
    (case,) = [c for c in bad_cases(device) if c[0] == name]
    _, call, exc_type, pattern = case
    with pytest.raises(exc_type, match=pattern):
        call()


def test_there_are_at_least_75_cases():
    assert len(CASE_NAMES) >= 75
    assert len(set(CASE_NAMES)) == len(CASE_NAMES), "case names must be unique"


@pytest.mark.parametrize("device", [cuda_param("cuda")])
def test_mixed_devices(device):
    q, k, v = qkv(device)
    with pytest.raises(ValueError, match="key is on cpu"):
        torch_oss.attention(q, k.cpu(), v)
    with pytest.raises(ValueError, match="value is on cpu"):
        torch_oss.attention(q, k, v.cpu())
    with pytest.raises(ValueError, match="key is on cuda"):
        torch_oss.attention(q.cpu(), k, v.cpu())
    with pytest.raises(ValueError, match="attn_mask is on cpu"):
        torch_oss.attention(q, k, v, attn_mask=torch.ones(8, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match="grad_output is on"):
        torch.ops.oss.softmax_backward(torch.randn(3, 3), torch.randn(3, 3, device=device), 1, F32)
    out, lse = torch.ops.oss.attention(q, k, v)
    with pytest.raises(ValueError, match="grad_out is on cpu"):
        torch.ops.oss.attention_backward(torch.randn_like(out).cpu(), q, k, v, out, lse, None, False, None, False,
                                         "top_left", False)
    with pytest.raises(ValueError, match="lse is on cpu"):
        torch.ops.oss.attention_backward(torch.randn_like(out), q, k, v, out, lse.cpu(), None, False, None, False,
                                         "top_left", False)


def meta_cases(device):
    """A tensor on the meta device (no data) mixed with real ones: must raise
    like any other device mismatch (F.scaled_dot_product_attention and
    aten's softmax backward do), never return a tensor of uninitialised memory."""
    q, k, v = qkv(device)
    x = torch.randn(3, 3, device=device)
    out, lse = torch.ops.oss.attention(q, k, v)
    bwd = lambda **over: lambda: torch.ops.oss.attention_backward(  # noqa: E731
        *[over.get(n, t) for n, t in (("grad_out", torch.randn_like(out)), ("query", q), ("key", k), ("value", v),
                                      ("out", out), ("lse", lse))], None, False, None, False, "top_left", False)
    return {
        "key": (lambda: torch_oss.attention(q, k.to("meta"), v), "key"),
        "value": (lambda: torch_oss.attention(q, k, v.to("meta")), "value"),
        "attn_mask": (lambda: torch_oss.attention(q, k, v, attn_mask=torch.ones(8, 8, dtype=torch.bool,
                                                                                  device="meta")), "attn_mask"),
        "softmax_backward output": (lambda: torch.ops.oss.softmax_backward(x, x.to("meta"), 1, F32), "output"),
        "attention_backward out": (bwd(out=out.to("meta")), "out"),
        "attention_backward grad_out": (bwd(grad_out=out.to("meta")), "grad_out"),
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(meta_cases("cpu")))
def test_tensor_on_meta_device_mixed_with_real_ones_raises(device, case):
    call, name = meta_cases(device)[case]
    with pytest.raises((ValueError, RuntimeError), match=name):
        result = call()
        pytest.fail(f"returned {type(result).__name__} instead of raising (mixed {device} and meta tensors)")


@pytest.mark.parametrize("device", DEVICES)
def test_errors_leave_the_process_usable(device):
    # after every failed call of the table, ordinary calls still work (no sticky error state)
    for _, call, exc_type, _ in bad_cases(device):
        with pytest.raises(exc_type):
            call()
    q, k, v = qkv(device)
    out = torch_oss.attention(q, k, v)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v), atol=1e-5,
                               rtol=1e-4)
    x = torch.randn(5, 7, device=device)
    torch.testing.assert_close(torch_oss.softmax(x, 1), torch.softmax(x, 1))
    if device == "cuda":
        torch.cuda.synchronize()  # no asynchronous error left behind by a rejected launch
