"""Hugging Face transformers models with attn_implementation="oss" against the
same models with "sdpa" and a float64 run: Llama-style (grouped-query
attention), GPT-2-style (per-layer scaling) and BERT-style (bidirectional)
models from tiny configs with random weights. Logits (with padding), one
training step's gradients, greedy generation with a KV cache, a chunked
prefill (bottom-right causal), torch.compile(fullgraph=True), the mask
builder, registration, dropout in training, and the fallback / strict mode.

Tolerance: tests/_util.py's rule with the model run in float64 (same weights,
"sdpa") as the reference and the same-dtype "sdpa" run as PyTorch's peer."""

import copy
import warnings

import pytest
import torch
from _util import ATTENTION_ATOL, DEVICES, assert_tolerance, cuda_param
from torch._dynamo.testing import AotEagerAndRecordGraphs
from torch.utils._python_dispatch import TorchDispatchMode

transformers = pytest.importorskip("transformers")
masking_utils = pytest.importorskip("transformers.masking_utils")

import torch_oss  # noqa: E402
from torch_oss import transformers_integration as hf_oss  # noqa: E402

HF_FALLBACK = "transformers attn_implementation='oss'"
VOCAB = 128


@pytest.fixture(autouse=True, scope="module")
def registered():
    torch_oss.register_transformers()
    yield


@pytest.fixture(autouse=True)
def clean_state():
    torch_oss.disable()
    torch_oss.reset_fallback_stats()
    yield
    torch_oss.disable()
    torch_oss.reset_fallback_stats()


class AttentionCalls(TorchDispatchMode):
    """Records the calls of torch.ops.oss.attention and of its training form
    attention_with_residual (with their mask and causal arguments), counts
    those of attention_varlen (with its tokens and causal flag) and PyTorch's
    attention kernels (fused SDPA ops, or the softmax of the math path that
    SDPA with dropout decomposes into)."""

    def __init__(self):
        super().__init__()
        self.oss, self.varlen, self.torch_sdpa = [], [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if name.split(".")[:2] == ["oss", "attention_varlen"]:
            self.varlen.append({"tokens": args[0].shape[0], "causal": len(args) > 7 and args[7]})
        elif name.split(".")[:2] in (["oss", "attention"], ["oss", "attention_with_residual"]):
            # the dispatcher drops trailing arguments equal to their defaults
            full = list(args) + [None, False, None, False, "top_left"][len(args) - 3:]
            mask = full[3]
            self.oss.append({"mask": None if mask is None else tuple(mask.shape), "is_causal": full[4],
                             "alignment": full[7], "gqa": full[6], "lq": args[0].shape[2], "lk": args[1].shape[2]})
        elif "scaled_dot_product" in name or name.startswith(("aten._softmax", "aten._safe_softmax")):
            self.torch_sdpa += 1
        return func(*args, **(kwargs or {}))


# ---------------------------------------------------------------------------
# Tiny models
# ---------------------------------------------------------------------------


def config(family, **overrides):
    if family == "llama":
        cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                       num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=128,
                                       attention_dropout=0.0, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    elif family == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=128, n_embd=64, n_layer=2, n_head=4,
                                      attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, bos_token_id=1,
                                      eos_token_id=2, pad_token_id=0, scale_attn_by_inverse_layer_idx=True)
    elif family == "bert":
        cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=96, max_position_embeddings=128, hidden_dropout_prob=0.0,
                                      attention_probs_dropout_prob=0.0, pad_token_id=0)
    else:
        raise ValueError(family)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cfg


def build(family, attn="sdpa", seed=0, **overrides):
    torch.manual_seed(seed)
    cfg = config(family, **overrides)
    auto = transformers.AutoModelForMaskedLM if family == "bert" else transformers.AutoModelForCausalLM
    model = auto.from_config(cfg, attn_implementation=attn)
    # random weights scaled up a little so attention is far from uniform
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "emb" not in name and "wpe" not in name and "wte" not in name:
                p.mul_(2.0)
    return model.eval()


def inputs(batch, length, device, pad=0, side="left", seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    if pad:
        if side == "left":
            mask[-1, :pad] = 0
            ids[-1, :pad] = 0
        else:
            mask[-1, -pad:] = 0
            ids[-1, -pad:] = 0
    return ids.to(device), mask.to(device)


def three_runs(model, dtype, device):
    """(ours, peer, ref64) copies of one model: "oss" and "sdpa" in dtype, "sdpa" in float64."""
    peer = copy.deepcopy(model).to(device=device, dtype=dtype)
    ours = copy.deepcopy(peer)
    ours.set_attn_implementation("oss")
    ref = copy.deepcopy(model).to(device=device, dtype=torch.float64)
    assert ours.config._attn_implementation == "oss" and peer.config._attn_implementation == "sdpa"
    return ours, peer, ref


FAMILIES = ["llama", "gpt2", "bert"]


def model_dtype(device):
    return torch.bfloat16 if device == "cuda" else torch.float32


# ---------------------------------------------------------------------------
# Logits, gradients, generation
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("pad", [0, 5], ids=["no_padding", "padding"])
def test_logits_match_sdpa_and_float64(device, family, pad):
    dtype = model_dtype(device)
    ours, peer, ref = three_runs(build(family), dtype, device)
    side = "right" if family == "bert" else "left"
    ids, mask = inputs(3, 29, device, pad=pad, side=side)
    with torch.no_grad():
        with AttentionCalls() as calls:
            got = ours(ids, attention_mask=mask).logits
        want = peer(ids, attention_mask=mask).logits
        want64 = ref(ids, attention_mask=mask).logits
    layers = 2
    assert calls.torch_sdpa == 0
    if pad:  # the real tokens alone, through attention_varlen
        assert not calls.oss and len(calls.varlen) == layers, (calls.oss, calls.varlen)
        assert all(c["tokens"] == int(mask.sum()) and c["causal"] == (family != "bert") for c in calls.varlen)
    else:
        assert len(calls.oss) == layers and not calls.varlen, calls.oss
        if family == "llama":
            assert all(c["gqa"] for c in calls.oss)  # 8 query heads on 2 K/V heads, no repeat_kv
        assert all(c["mask"] is None for c in calls.oss)
        assert all(c["is_causal"] == (family != "bert") for c in calls.oss)
    assert torch.isfinite(got).all()
    valid = mask.bool()
    assert_tolerance(f"{family} logits {dtype} pad={pad}", got[valid], want64[valid], want[valid],
                     ATTENTION_ATOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", FAMILIES)
def test_training_step_gradients_match(device, family):
    ours, peer, ref = three_runs(build(family), torch.float32, device)
    ids, mask = inputs(2, 23, device, pad=4, side="right" if family == "bert" else "left")
    labels = ids.masked_fill(mask == 0, -100)
    grads = {}
    for name, model in (("ours", ours), ("peer", peer), ("ref", ref)):
        model.train()
        with AttentionCalls() as calls:
            model(ids, attention_mask=mask, labels=labels).loss.backward()
        if name == "ours":
            assert len(calls.varlen) == 2 and not calls.oss and calls.torch_sdpa == 0
        grads[name] = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert grads["ours"].keys() == grads["ref"].keys() and len(grads["ours"]) > 10
    for n in grads["ref"]:
        assert_tolerance(f"{family} grad {n}", grads["ours"][n], grads["ref"][n], grads["peer"][n],
                         ATTENTION_ATOL[torch.float32])
    assert torch_oss.fallback_stats() == {}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_greedy_generation_with_kv_cache_matches(device, family):
    # float64 so that a near-tie between two logits cannot flip a token
    ours, peer, _ = three_runs(build(family), torch.float64, device)
    for batch, pad in ((1, 0), (3, 4)):
        ids, mask = inputs(batch, 11, device, pad=pad)
        kw = dict(attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
        with torch.no_grad():
            with AttentionCalls() as calls:
                got = ours.generate(ids, **kw)
            want = peer.generate(ids, **kw)
        assert got.shape[1] > ids.shape[1] + 1
        assert torch.equal(got, want), (got, want)
        assert calls.torch_sdpa == 0 and len(calls.oss) >= 2 * 11
        decode = [c for c in calls.oss if c["lq"] == 1]
        assert decode and all(c["lk"] > 1 for c in decode)
        if pad == 0:  # no mask tensor at all: is_causal with bottom-right alignment
            assert all(c["mask"] is None and c["is_causal"] and c["alignment"] == "bottom_right" for c in calls.oss)


@pytest.mark.parametrize("device", DEVICES)
def test_chunked_prefill_uses_bottom_right_causal(device):
    """Several new tokens after a KV cache (Lq < Lk): the mask builder hands
    no mask, the attention runs bottom-right-aligned is_causal, and the logits
    equal those of sdpa with its explicit mask."""
    ours, peer, ref = three_runs(build("llama"), torch.float32, device)
    ids, _ = inputs(2, 19, device)
    prefix, chunk = ids[:, :12], ids[:, 12:]
    out = {}
    for name, model in (("ours", ours), ("peer", peer), ("ref", ref)):
        with torch.no_grad():
            cache = transformers.DynamicCache()
            model(prefix, past_key_values=cache, use_cache=True)
            with AttentionCalls() as calls:
                out[name] = model(chunk, past_key_values=cache, use_cache=True).logits
        if name == "ours":
            assert len(calls.oss) == 2
            assert all(c["mask"] is None and c["is_causal"] and c["alignment"] == "bottom_right" and c["lq"] == 7
                       and c["lk"] == 19 for c in calls.oss), calls.oss
    assert_tolerance("chunked prefill logits", out["ours"], out["ref"], out["peer"], ATTENTION_ATOL[torch.float32])
    # and the same logits as running the whole sequence at once
    with torch.no_grad():
        full = ref(ids).logits[:, 12:]
    assert_tolerance("chunked vs full", out["ours"], full, out["peer"], ATTENTION_ATOL[torch.float32])


@pytest.mark.parametrize("device", DEVICES)
def test_enable_routes_the_sdpa_implementation(device):
    """torch_oss.enable() with an unchanged attn_implementation="sdpa" model:
    transformers' sdpa function calls the routed F.scaled_dot_product_attention."""
    dtype = model_dtype(device)
    _, peer, ref = three_runs(build("llama"), dtype, device)
    ids, mask = inputs(3, 21, device, pad=4)
    with torch.no_grad():
        want, want64 = peer(ids, attention_mask=mask).logits, ref(ids, attention_mask=mask).logits
        with torch_oss.enabled(transformers=False), AttentionCalls() as calls:
            got = peer(ids, attention_mask=mask).logits
    assert len(calls.oss) == 2 and calls.torch_sdpa == 0
    valid = mask.bool()
    assert_tolerance("enable() + sdpa logits", got[valid], want64[valid], want[valid], ATTENTION_ATOL[dtype])
    assert torch_oss.fallback_stats() == {}


# ---------------------------------------------------------------------------
# torch.compile
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", FAMILIES)
def test_compile_fullgraph_no_graph_breaks(device, family):
    """The compiled "oss" model: no graph break, our op in the graph, and
    logits that match the float64 "sdpa" model by the tolerance rule (the
    float32 "sdpa" model as PyTorch's peer)."""
    torch._dynamo.reset()
    model, peer, ref = three_runs(build(family), torch.float32, device)
    ids, mask = inputs(2, 21, device)
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(ids, attention_mask=mask)
        backend = AotEagerAndRecordGraphs()
        got = torch.compile(model, backend=backend, fullgraph=True)(ids, attention_mask=mask).logits
        want, want64 = peer(ids, attention_mask=mask).logits, ref(ids, attention_mask=mask).logits
    assert explained.graph_break_count == 0, explained.break_reasons
    ops = {str(n.target) for g in backend.fw_graphs for n in g.graph.nodes if n.op == "call_function"}
    assert any(op.startswith("oss.attention") for op in ops), ops
    assert not any("scaled_dot_product" in op for op in ops), ops
    assert_tolerance(f"compiled {family} logits", got, want64, want, ATTENTION_ATOL[torch.float32])


@pytest.mark.parametrize("device", [cuda_param("cuda")])
def test_compile_inductor_training_step_cuda(device):
    """A training step of the inductor-compiled "oss" model on the GPU: its loss
    and every parameter gradient against the float64 "sdpa" model by the
    tolerance rule, the eager "sdpa" model as PyTorch's peer. float32, as in
    test_training_step_gradients_match: in bfloat16 a whole model's gradients
    are chains of roundings whose largest errors differ by more than 2x
    between two equally accurate runs."""
    torch._dynamo.reset()
    ours, peer, ref = three_runs(build("llama"), torch.float32, device)
    ids, mask = inputs(2, 64, device)
    compiled = torch.compile(ours.train(), fullgraph=True)
    results = {}
    for name, fn in (("ours", compiled), ("peer", peer.train()), ("ref", ref.train())):
        loss = fn(ids, attention_mask=mask, labels=ids).loss
        loss.backward()
        model = ours if name == "ours" else (peer if name == "peer" else ref)
        results[name] = (loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    atol = ATTENTION_ATOL[torch.float32]
    assert_tolerance("compiled loss", results["ours"][0].reshape(1), results["ref"][0].reshape(1),
                     results["peer"][0].reshape(1), atol)
    grads = {name: r[1] for name, r in results.items()}
    assert grads["ours"].keys() == grads["ref"].keys() and len(grads["ours"]) > 10
    for n in grads["ref"]:
        assert_tolerance(f"compiled grad {n}", grads["ours"][n], grads["ref"][n], grads["peer"][n], atol)


# ---------------------------------------------------------------------------
# The mask builder
# ---------------------------------------------------------------------------


def sdpa_mask_full(**kw):
    kw.setdefault("allow_is_causal_skip", False)
    return masking_utils.sdpa_mask(**kw)


def test_mask_builder_cases():
    mask = hf_oss.mask
    base = dict(batch_size=2, device="cpu")
    # exactly causal with the queries at the end of the keys: no mask tensor
    assert mask(q_length=6, kv_length=6, **base) is None
    assert mask(q_length=3, kv_length=9, q_offset=6, **base) is None  # chunk after a DynamicCache
    assert mask(q_length=1, kv_length=9, q_offset=8, **base) is None  # decoding step
    ones = torch.ones(2, 9, dtype=torch.bool)
    assert mask(q_length=3, kv_length=9, q_offset=6, attention_mask=ones, **base) is None
    # everything else is the sdpa builder's boolean mask
    cases = [
        dict(q_length=3, kv_length=9, q_offset=0),  # StaticCache prefill: keys beyond the queries are empty
        dict(q_length=3, kv_length=9, q_offset=6, attention_mask=ones.clone().index_fill_(1, torch.tensor([0, 1]),
                                                                                           False)),  # padding
        dict(q_length=3, kv_length=9, q_offset=6, allow_is_causal_skip=False),
        dict(q_length=4, kv_length=6, q_offset=6, kv_offset=4, local_size=5,
             mask_function=masking_utils.sliding_window_causal_mask_function(5)),
        dict(q_length=2, kv_length=8, q_offset=torch.tensor(6)),  # tensor offsets (StaticCache)
    ]
    for kw in cases:
        got = mask(**base, **kw)
        kw = dict(kw)
        kw.pop("allow_is_causal_skip", None)
        want = sdpa_mask_full(**base, **kw)
        assert got is not None and got.dtype == torch.bool, kw
        assert torch.equal(got, want), kw
    # bidirectional (encoder) masks: skipped without padding, as for sdpa
    bidir = dict(mask_function=masking_utils.bidirectional_mask_function, allow_is_causal_skip=False,
                 allow_is_bidirectional_skip=True)
    assert mask(q_length=5, kv_length=5, **base, **bidir) is None
    padded = torch.ones(2, 5, dtype=torch.bool)
    padded[1, 3:] = False
    got = mask(q_length=5, kv_length=5, attention_mask=padded, **base, **bidir)
    assert torch.equal(got, masking_utils.sdpa_mask(q_length=5, kv_length=5, attention_mask=padded, **base, **bidir))


def test_bottom_right_convention_equals_explicit_mask():
    """attention_forward with no mask on Lq < Lk equals sdpa with the explicit
    causal mask the "sdpa" builder makes for the same positions."""
    torch.manual_seed(0)
    module = torch.nn.Module()
    module.is_causal = True
    module.num_key_value_groups = 2  # what sdpa_attention_forward reads to repeat K/V
    q = torch.randn(2, 4, 5, 16, dtype=torch.float64)
    k = torch.randn(2, 2, 12, 16, dtype=torch.float64)
    v = torch.randn(2, 2, 12, 16, dtype=torch.float64)
    ours, _ = hf_oss.attention_forward(module, q, k, v, None, scaling=0.2)
    explicit = masking_utils.sdpa_mask(batch_size=2, q_length=5, kv_length=12, q_offset=7,
                                       allow_is_causal_skip=False)
    want, _ = transformers.integrations.sdpa_attention.sdpa_attention_forward(module, q, k, v, explicit, scaling=0.2)
    torch.testing.assert_close(ours, want, atol=1e-12, rtol=1e-12)
    assert ours.shape == (2, 5, 4, 16) and ours.is_contiguous()


# ---------------------------------------------------------------------------
# Registration, fallbacks
# ---------------------------------------------------------------------------


def test_registration_and_loading_paths(tmp_path):
    from transformers import AttentionInterface

    saved = AttentionInterface._global_mapping.pop("oss")
    saved_mask = masking_utils.AttentionMaskInterface._global_mapping.pop("oss")
    try:
        with pytest.raises(ValueError):
            build("llama", attn="oss")
        torch_oss.enable()  # registers when transformers is importable
        assert AttentionInterface._global_mapping["oss"] is hf_oss.attention_forward
        assert masking_utils.AttentionMaskInterface._global_mapping["oss"] is hf_oss.mask
    finally:
        AttentionInterface._global_mapping["oss"] = saved
        masking_utils.AttentionMaskInterface._global_mapping["oss"] = saved_mask
        torch_oss.disable()
    model = build("llama")
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="oss").eval()
    assert loaded.config._attn_implementation == "oss"
    ids, mask = inputs(2, 9, "cpu", pad=2)
    with torch.no_grad(), AttentionCalls() as calls:
        got = loaded(ids, attention_mask=mask).logits
    assert len(calls.varlen) == 2 and calls.torch_sdpa == 0
    model.set_attn_implementation("oss")
    with torch.no_grad():
        torch.testing.assert_close(got, model(ids, attention_mask=mask).logits)


def test_dropout_in_training_is_served():
    """attention_dropout > 0 in train(): torch_oss's dropout, no fallback; the
    same seed gives the same logits, another seed others, and gradients flow."""
    model = build("llama", attn="oss", attention_dropout=0.5).train()
    ids, mask = inputs(2, 9, "cpu")
    logits = []
    with AttentionCalls() as calls, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for seed in (0, 0, 1):
            torch.manual_seed(seed)
            logits.append(model(ids, attention_mask=mask).logits)
    assert len(calls.oss) == 6 and calls.torch_sdpa == 0
    assert not [w for w in caught if issubclass(w.category, torch_oss.FallbackWarning)]
    assert torch_oss.fallback_stats() == {}
    assert torch.equal(logits[0], logits[1]) and not torch.equal(logits[0], logits[2])
    logits[0].sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    model.eval()  # no dropout in eval: deterministic logits
    with torch.no_grad():
        torch.manual_seed(5)
        a = model(ids, attention_mask=mask).logits
        torch.manual_seed(6)
        assert torch.equal(a, model(ids, attention_mask=mask).logits)


class _Subclass(torch.Tensor):
    """A tensor subclass: what torch_oss leaves to PyTorch (a fallback)."""


def test_fallback_keeps_bottom_right_convention():
    """A fallback (here: a tensor subclass) on a chunk after a cache must not
    turn the missing mask into sdpa's top-left is_causal."""
    torch.manual_seed(0)
    module = torch.nn.Module()
    module.is_causal = True
    q = torch.randn(1, 2, 3, 8, dtype=torch.float64)
    k = torch.randn(1, 2, 10, 8, dtype=torch.float64)
    v = torch.randn(1, 2, 10, 8, dtype=torch.float64)
    torch.manual_seed(1)
    with pytest.warns(torch_oss.FallbackWarning):
        fell_back, _ = hf_oss.attention_forward(module, q.as_subclass(_Subclass), k, v, None)
    served, _ = hf_oss.attention_forward(module, q, k, v, None)
    torch.testing.assert_close(fell_back.as_subclass(torch.Tensor), served, atol=1e-9, rtol=1e-9)


def test_score_variant_kwargs_are_served():
    """softcap, s_aux (sinks, with their gradient) and sliding_window reach
    torch_oss.attention's variants; the eager fallback (taken here for a
    tensor subclass) computes the same."""
    torch.manual_seed(0)
    module = torch.nn.Module()
    module.is_causal = True
    q = torch.randn(2, 4, 5, 8, dtype=torch.float64)
    k = torch.randn(2, 2, 12, 8, dtype=torch.float64)
    v = torch.randn(2, 2, 12, 8, dtype=torch.float64)
    sinks = torch.randn(4, dtype=torch.float32).double().requires_grad_()
    kw = dict(softcap=3.0, s_aux=sinks, sliding_window=4)
    served, _ = hf_oss.attention_forward(module, q, k, v, None, **kw)
    served.sum().backward()
    assert sinks.grad is not None and sinks.grad.abs().sum() > 0
    want = torch_oss.attention(q, k, v, is_causal=True, causal_alignment="bottom_right", enable_gqa=True,
                               softcap=3.0, sinks=sinks.detach(), window_size=(3, 3)).transpose(1, 2)
    torch.testing.assert_close(served, want, atol=0, rtol=0)
    with pytest.warns(torch_oss.FallbackWarning):
        fell_back, _ = hf_oss.attention_forward(module, q.as_subclass(_Subclass), k, v, None, **kw)
    torch.testing.assert_close(fell_back.as_subclass(torch.Tensor), served.detach(), atol=1e-6, rtol=1e-6)
    # with a mask the mask builder's window is in the mask: sliding_window adds nothing
    mask = torch.rand(2, 1, 5, 12) > 0.3
    a, _ = hf_oss.attention_forward(module, q, k, v, mask, sliding_window=2)
    b, _ = hf_oss.attention_forward(module, q, k, v, mask)
    assert torch.equal(a, b)


def _variant_model(family):
    common = dict(vocab_size=101, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, sliding_window=5, max_position_embeddings=128)
    if family == "gpt_oss":  # attention sinks (s_aux) and sliding-window layers
        cfg = transformers.GptOssConfig(intermediate_size=64, num_local_experts=4, num_experts_per_tok=2,
                                        layer_types=["sliding_attention", "full_attention"], **common)
    elif family == "gemma2":  # logit softcapping and sliding-window layers
        cfg = transformers.Gemma2Config(intermediate_size=96, attn_logit_softcapping=2.0, **common)
    elif family == "mistral":  # a sliding window on every layer
        cfg = transformers.MistralConfig(intermediate_size=96, **common)
    else:  # qwen2: sliding-window layers mixed with full ones
        cfg = transformers.Qwen2Config(intermediate_size=96, use_sliding_window=True, max_window_layers=0,
                                       layer_types=["sliding_attention", "full_attention"], **common)
    cfg._attn_implementation = "eager"
    return transformers.AutoModelForCausalLM.from_config(cfg).float()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", ["gpt_oss", "gemma2", "mistral", "qwen2"])
@pytest.mark.parametrize("side", [None, "left", "right"], ids=["no_padding", "left_padding", "right_padding"])
def test_variant_models_match_eager(family, device, side):
    """Models whose attention passes s_aux / softcap / sliding_window: logits and
    every parameter's gradient (the sinks' included) as with 'eager', no fallback;
    a padded batch (its real tokens through attention_varlen, the window longer
    than some rows) at the real positions, the loss over the targets of real
    positions."""
    torch_oss.register_transformers()
    torch.manual_seed(0)
    model = _variant_model(family).to(device)
    ids = torch.randint(0, 101, (3, 13), device=device)
    mask = torch.ones(3, 13, dtype=torch.long, device=device)
    if side == "left":
        mask[1, :4] = mask[2, :9] = 0
    elif side == "right":
        mask[1, -4:] = mask[2, -9:] = 0
    real = mask.bool()
    # the loss over targets predicted from real positions: the last padding position before a row's
    # first real token (left padding) sees no key, and "eager" gives it the mean of every value there
    # (a softmax of equal masked scores), where torch_oss and SDPA give 0
    predicted_from_real = torch.cat([real[:, :1], real[:, :-1]], 1)
    labels = ids.masked_fill(~(real & predicted_from_real), -100)
    results = {}
    for impl in ("eager", "oss"):
        model.set_attn_implementation(impl)
        model.zero_grad()
        torch_oss.reset_fallback_stats()
        with AttentionCalls() as calls:
            out = model(ids, attention_mask=mask if side else None, labels=labels)
            out.loss.backward()
        assert torch_oss.fallback_stats() == {}
        if impl == "oss" and side:
            assert len(calls.varlen) == 2 and not calls.oss, (calls.varlen, calls.oss)
        results[impl] = (out.logits.detach()[real], {n: p.grad.clone() for n, p in model.named_parameters()
                                                     if p.grad is not None})
    torch.testing.assert_close(results["oss"][0], results["eager"][0], atol=2e-5, rtol=1e-4)
    assert results["oss"][1].keys() == results["eager"][1].keys()
    if family == "gpt_oss":
        assert any(name.endswith("sinks") for name in results["oss"][1])
    for name, grad in results["eager"][1].items():
        torch.testing.assert_close(results["oss"][1][name], grad, atol=2e-5, rtol=1e-3, msg=name)
