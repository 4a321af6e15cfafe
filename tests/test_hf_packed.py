"""Packed sequences in Hugging Face models with attn_implementation="oss": a
batch of one row holding several documents (position_ids restarting at 0 for
each, as transformers.DataCollatorWithFlattening makes it) runs
torch_oss.attention_varlen, reached either from position_ids (transformers'
packed mask is recognised and checked, one host synchronisation per forward)
or from the FlashAttention kwargs cu_seq_lens_q/k, max_length_q/k (used as
given). Tiny Llama (grouped-query attention) and Mistral (a sliding window
shorter than a document) models from random weights: logits and one training
step's gradients against transformers' own packed handling ("sdpa" on the
packed batch; float64 as the reference, the same dtype as PyTorch's peer) and
against the "oss" model run on each document separately. A padded batch (a
2-D attention_mask, no cache) runs its real tokens through attention_varlen,
one sequence per row, after its mask is checked; unpacked and cached batches
keep the dense path; torch.compile; the fallback of a packed call; the score
variants (sinks, softcap, sliding-window layers) of gpt-oss, Gemma 2 and
Qwen 2 models.

Tolerance: tests/_util.py's rule (docs/testing.md)."""

import copy

import pytest
import torch
import torch.nn.functional as F
from _util import ATTENTION_ATOL, DEVICES, assert_tolerance, cuda_param
from torch._dynamo.testing import AotEagerAndRecordGraphs
from torch.utils._python_dispatch import TorchDispatchMode

transformers = pytest.importorskip("transformers")
masking_utils = pytest.importorskip("transformers.masking_utils")

import torch_oss  # noqa: E402
from torch_oss import transformers_integration as hf_oss  # noqa: E402

VOCAB = 128
DOCS = (5, 9, 3)  # document lengths of the packed row
LAYERS = 2


@pytest.fixture(autouse=True, scope="module")
def registered():
    torch_oss.register_transformers()
    yield


@pytest.fixture(autouse=True)
def clean_state():
    torch_oss.disable()
    torch_oss.reset_fallback_stats()
    hf_oss._PACKED_CACHE.clear()
    hf_oss._PADDED_CACHE.clear()
    yield
    torch_oss.disable()
    torch_oss.reset_fallback_stats()


class Calls(TorchDispatchMode):
    """Counts the attention ops that run: torch_oss's varlen op (forward and
    backward), its dense op, and PyTorch's attention kernels."""

    def __init__(self):
        super().__init__()
        self.varlen = self.varlen_backward = self.dense = self.torch_sdpa = 0
        self.varlen_args = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if name.startswith("oss.attention_varlen_backward"):
            self.varlen_backward += 1
        elif name.startswith("oss.attention_varlen"):
            self.varlen += 1
            # the dispatcher drops trailing arguments equal to their defaults
            full = {a.name: args[i] if i < len(args) else (kwargs or {}).get(a.name, a.default_value)
                    for i, a in enumerate(func._schema.arguments)}
            window = full["window_size"]
            self.varlen_args.append({"cu_q": full["cu_seqlens_q"], "max_q": full["max_seqlen_q"],
                                     "causal": full["is_causal"],
                                     "window": [window] * 2 if isinstance(window, int) else list(window)})
        elif name.startswith(("oss.attention.", "oss.attention_with_residual")):
            self.dense += 1
        elif "scaled_dot_product" in name or name.startswith(("aten._softmax", "aten._safe_softmax")):
            self.torch_sdpa += 1
        return func(*args, **(kwargs or {}))


# ---------------------------------------------------------------------------
# Tiny models and packed batches
# ---------------------------------------------------------------------------


def config(family):
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=LAYERS,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, attention_dropout=0.0,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if family == "llama":
        return transformers.LlamaConfig(**common)
    if family == "mistral":  # a sliding window shorter than the longest document
        return transformers.MistralConfig(sliding_window=4, **common)
    raise ValueError(family)


def build(family, attn="sdpa", seed=0):
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config(family), attn_implementation=attn)
    with torch.no_grad():  # weights scaled up a little so attention is far from uniform
        for name, p in model.named_parameters():
            if p.dim() == 2 and "emb" not in name:
                p.mul_(2.0)
    return model.eval()


def documents(lengths=DOCS, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in lengths]


def packed_batch(docs, device, route):
    """The collator's batch for the route: "position_ids" (position_ids
    only) or "cu_seq_lens" (position_ids and the FlashAttention kwargs)."""
    collator = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=route == "cu_seq_lens",
                                                       return_position_ids=True)
    batch = collator([{"input_ids": d} for d in docs])
    batch.pop("labels")
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def packed_loss(logits, docs):
    """Next-token cross-entropy within each document of a packed row, summed
    and divided by the number of predictions (the loss of the per-document
    runs too)."""
    total, start, count = 0.0, 0, 0
    for d in docs:
        n = len(d)
        target = torch.tensor(d[1:], device=logits.device)
        total = total + F.cross_entropy(logits[0, start:start + n - 1].float(), target, reduction="sum")
        start, count = start + n, count + n - 1
    return total / count


def run_packed(model, docs, device, route, train=False):
    """(logits, loss) of the packed row, use_cache=False (with a cache,
    transformers treats the row as one sequence)."""
    logits = model(**packed_batch(docs, device, route), use_cache=False).logits
    return logits, (packed_loss(logits, docs) if train else None)


def run_per_document(model, docs, device, train=False):
    logits = torch.cat([model(torch.tensor([d], device=device), use_cache=False).logits for d in docs], dim=1)
    return logits, (packed_loss(logits, docs) if train else None)


def grads_of(model, loss):
    model.zero_grad()
    loss.backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def copies(model, dtype, device):
    """(oss, sdpa, sdpa in float64) copies of one model."""
    ours = copy.deepcopy(model).to(device=device, dtype=dtype)
    ours.set_attn_implementation("oss")
    peer = copy.deepcopy(model).to(device=device, dtype=dtype)
    ref = copy.deepcopy(model).to(device=device, dtype=torch.float64)
    return ours, peer, ref


# ---------------------------------------------------------------------------
# Logits and gradients
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("route", ["position_ids", "cu_seq_lens"])
@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_packed_batch_matches_per_document_and_dense(device, dtype, route, family, monkeypatch):
    """The packed row through the "oss" model runs attention_varlen in every
    layer (forward and backward, no dense attention) and gives the logits and
    parameter gradients of transformers' packed handling ("sdpa" with its
    block-diagonal mask) and of the "oss" model run document by document."""
    derived = []
    derive = hf_oss._derive_packed
    monkeypatch.setattr(hf_oss, "_derive_packed", lambda *a: derived.append(1) or derive(*a))
    docs = documents()
    ours, peer, ref = copies(build(family), dtype, device)
    # gradients in float32, as in test_models.py: in bfloat16 a whole model's gradients are chains of
    # roundings whose largest errors differ by more than 2x between two equally accurate runs
    train = dtype == torch.float32

    with Calls() as calls:
        got, loss = run_packed(ours.train(train), docs, device, route, train)
        got_grads = grads_of(ours, loss) if train else None
    assert calls.varlen == LAYERS and calls.dense == 0 and calls.torch_sdpa == 0, vars(calls)
    assert calls.varlen_backward == (LAYERS if train else 0)
    window = [3, 3] if family == "mistral" else [-1, -1]
    assert all(a["cu_q"].tolist() == [0, 5, 14, 17] and a["max_q"] == 9 and a["causal"] and a["window"] == window
               for a in calls.varlen_args), calls.varlen_args
    # position_ids: the documents are read once per forward, not per layer; the kwargs need no reading
    assert len(derived) == (1 if route == "position_ids" else 0)
    assert torch_oss.fallback_stats() == {}

    with Calls() as peer_calls:
        want, want_loss = run_packed(peer.train(train), docs, device, "position_ids", train)
    assert peer_calls.varlen == 0  # transformers' own dense packed mask
    want64, ref_loss = run_packed(ref.train(train), docs, device, "position_ids", train)
    # transformers' packed handling is the per-document computation
    torch.testing.assert_close(want64, run_per_document(ref, docs, device)[0], atol=1e-10, rtol=1e-10)
    atol = ATTENTION_ATOL[dtype]
    assert_tolerance(f"{family} {route} packed logits vs sdpa", got, want64, want, atol)

    ours_docs = copy.deepcopy(ours)
    with Calls() as doc_calls:
        per_doc, per_doc_loss = run_per_document(ours_docs.train(train), docs, device, train)
    assert doc_calls.varlen == 0 and doc_calls.dense == LAYERS * len(docs)
    assert_tolerance(f"{family} {route} packed logits vs oss per document", got, want64, per_doc, atol)

    if train:
        ref_grads, peer_grads = grads_of(ref, ref_loss), grads_of(peer, want_loss)
        doc_grads = grads_of(ours_docs, per_doc_loss)
        assert got_grads.keys() == ref_grads.keys() and len(got_grads) > 10
        for n in ref_grads:
            assert_tolerance(f"{family} {route} grad {n} vs sdpa", got_grads[n], ref_grads[n], peer_grads[n], atol)
            assert_tolerance(f"{family} {route} grad {n} vs oss per document", got_grads[n], ref_grads[n],
                             doc_grads[n], atol)


@pytest.mark.parametrize("device", DEVICES)
def test_packed_rows_in_a_batch(device):
    """Two packed rows with different documents (position_ids (2, L), as
    transformers handles them: each row block-diagonal): one varlen call per
    layer over the flattened rows, the logits of the documents run alone."""
    docs = [documents((4, 7, 5), seed=2), documents((9, 7), seed=3)]
    model = build("llama", attn="oss").float().to(device)
    ids = torch.tensor([sum(row, []) for row in docs], device=device)
    pos = torch.tensor([[i for d in row for i in range(len(d))] for row in docs], device=device)
    with torch.no_grad():
        with Calls() as calls:
            got = model(ids, position_ids=pos, use_cache=False).logits
        want = torch.cat([run_per_document(model, row, device)[0] for row in docs])
        model.set_attn_implementation("sdpa")
        peer = model(ids, position_ids=pos, use_cache=False).logits
        want64 = copy.deepcopy(model).double()(ids, position_ids=pos, use_cache=False).logits
    assert calls.varlen == LAYERS and calls.dense == 0
    assert calls.varlen_args[0]["cu_q"].tolist() == [0, 4, 11, 16, 25, 32] and calls.varlen_args[0]["max_q"] == 9
    assert_tolerance("packed rows vs per document", got, want64, want, ATTENTION_ATOL[torch.float32])
    assert_tolerance("packed rows vs sdpa", got, want64, peer, ATTENTION_ATOL[torch.float32])


# ---------------------------------------------------------------------------
# What keeps the dense path
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_unpacked_padded_and_cached_batches_are_not_split_into_documents(device, family):
    """The logits of "sdpa", and no documents split off, for: an unpacked
    batch and a packed row run with a cache (use_cache=True: transformers
    treats it as one sequence), both dense; a padded batch (a 2-D
    attention_mask), also with position_ids that restart and with the
    FlashAttention kwargs (transformers does not pack-detect with a padding
    mask: the documents see each other), whose real tokens run through
    attention_varlen one row per sequence."""
    ours, peer, ref = copies(build(family), torch.float32, device)
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(3, VOCAB, (2, 17), generator=g).to(device)
    padding = torch.ones(2, 17, dtype=torch.long, device=device)
    padding[1, :3] = 0
    restarts = torch.tensor([[*range(5), *range(9), *range(3)]] * 2, device=device)
    cu = dict(cu_seq_lens_q=torch.tensor([0, 5, 14, 17], dtype=torch.int32, device=device),
              cu_seq_lens_k=torch.tensor([0, 5, 14, 17], dtype=torch.int32, device=device),
              max_length_q=9, max_length_k=9)
    packed = packed_batch(documents(), device, "position_ids")
    cases = {
        "unpacked": dict(input_ids=ids, use_cache=False),
        "padded": dict(input_ids=ids, attention_mask=padding, use_cache=False),
        "padded, restarting position_ids": dict(input_ids=ids, attention_mask=padding, position_ids=restarts,
                                                use_cache=False),
        "padded, restarting position_ids, cu_seq_lens": dict(input_ids=ids[:1], attention_mask=padding[1:],
                                                             position_ids=restarts[:1], use_cache=False, **cu),
        "packed with a cache": dict(**packed, use_cache=True),
    }
    for name, kw in cases.items():
        with torch.no_grad():
            with Calls() as calls:
                got = ours(**kw).logits
            want = peer(**kw).logits
            ref_kw = {k: v for k, v in kw.items() if not k.startswith(("cu_", "max_length"))}
            want64 = ref(**ref_kw).logits
        if "attention_mask" in kw:
            rows = kw["attention_mask"].shape[0]
            assert calls.varlen == LAYERS and calls.dense == 0, (name, vars(calls))
            assert all(len(c["cu_q"]) == rows + 1 for c in calls.varlen_args), (name, calls.varlen_args)
        else:
            assert calls.varlen == 0 and calls.dense == LAYERS, (name, vars(calls))
        valid = kw["attention_mask"].bool() if "attention_mask" in kw else torch.ones(got.shape[:2], dtype=torch.bool)
        assert_tolerance(f"{family} {name}", got[valid], want64[valid], want[valid], ATTENTION_ATOL[torch.float32])
    assert torch_oss.fallback_stats() == {}


def packed_row_qkv():
    """q (1, 4, 17, 16) and k, v (1, 2, 17, 16), float64: one packed row of
    the DOCS documents, GQA 2."""
    return (torch.randn(1, 4, 17, 16, dtype=torch.float64), torch.randn(1, 2, 17, 16, dtype=torch.float64),
            torch.randn(1, 2, 17, 16, dtype=torch.float64))


def test_packed_mask_is_checked_before_it_is_replaced():
    """The position_ids route replaces only the exact block-diagonal causal
    mask of those position_ids: a mask the builder made for other
    documents, or one changed in place after a first call, is used as it
    is (and the cached documents are not reused for it)."""
    torch.manual_seed(0)
    module = torch.nn.Module()
    module.is_causal = True
    q, k, v = packed_row_qkv()
    pos = torch.tensor([[*range(5), *range(9), *range(3)]])

    def packed_mask(position_ids):
        docs = masking_utils.find_packed_sequence_indices(position_ids)
        # causal within each document (positions rise by 1 inside one), with
        # the mask functions every transformers release that packs has
        fn = masking_utils.and_masks(masking_utils.causal_mask_function,
                                     masking_utils.packed_sequence_mask_function(docs))
        return hf_oss.mask(batch_size=1, q_length=17, kv_length=17, mask_function=fn, allow_is_causal_skip=False)

    def dense(mask):
        want = torch_oss.attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return want.transpose(1, 2)

    mask = packed_mask(pos)
    assert getattr(mask, hf_oss._MASK_KIND) == "packed"
    with Calls() as calls:
        out, _ = hf_oss.attention_forward(module, q, k, v, mask, position_ids=pos)
    assert calls.varlen == 1 and calls.dense == 0
    torch.testing.assert_close(out, dense(mask), atol=1e-12, rtol=1e-12)

    other = packed_mask(torch.tensor([[*range(8), *range(9)]]))  # other documents
    with Calls() as calls:
        out, _ = hf_oss.attention_forward(module, q, k, v, other, position_ids=pos)
    assert calls.varlen == 0 and calls.dense == 1
    torch.testing.assert_close(out, dense(other), atol=1e-12, rtol=1e-12)

    mask[..., 7, 2] = True  # changed in place: its version moves on, the check runs again
    with Calls() as calls:
        out, _ = hf_oss.attention_forward(module, q, k, v, mask, position_ids=pos)
    assert calls.varlen == 0 and calls.dense == 1
    torch.testing.assert_close(out, dense(mask), atol=1e-12, rtol=1e-12)

    # the unpadded kind (no packing detected) never takes the position_ids route
    plain = hf_oss.mask(batch_size=1, q_length=17, kv_length=17, local_size=4,
                        mask_function=masking_utils.sliding_window_causal_mask_function(4))
    assert getattr(plain, hf_oss._MASK_KIND) == "unpadded"
    with Calls() as calls:
        hf_oss.attention_forward(module, q, k, v, plain, position_ids=pos, sliding_window=4)
    assert calls.varlen == 0 and calls.dense == 1
    # a padding mask is tagged as such: its real tokens run, as one sequence
    # (the padding route), whatever position_ids say
    padded = hf_oss.mask(batch_size=1, q_length=17, kv_length=17, allow_is_causal_skip=False,
                         attention_mask=torch.ones(1, 17, dtype=torch.bool).index_fill_(1, torch.tensor([0]), False))
    assert getattr(padded, hf_oss._MASK_KIND) == "padded"
    with Calls() as calls:
        out, _ = hf_oss.attention_forward(module, q, k, v, padded, position_ids=pos)
    assert calls.varlen == 1 and calls.dense == 0 and calls.varlen_args[0]["cu_q"].tolist() == [0, 16]
    torch.testing.assert_close(out[:, 1:], dense(padded)[:, 1:], atol=1e-12, rtol=1e-12)
    assert not out[:, 0].any()


def padding_rows(spec, length):
    """A (len(spec), length) bool padding mask: each spec entry (left pad,
    right pad) or a list of padded positions."""
    real = torch.ones(len(spec), length, dtype=torch.bool)
    for r, pads in enumerate(spec):
        if isinstance(pads, tuple):
            real[r, :pads[0]] = False
            real[r, length - pads[1]:] = False
        else:
            real[r, pads] = False
    return real


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_padded_batch_runs_its_real_tokens(device, causal, monkeypatch):
    """The mask builder's mask for a padding mask: attention_varlen over each
    row's real tokens, whose outputs are the dense call's on that mask, 0 at
    the padding positions (where the dense mask lets a padding query after
    the real tokens, or any of a bidirectional model, see them), gradients
    included; one mask check and host synchronisation per mask object
    however many layers use it. Rows with left, right, inner and complete
    padding, GQA, dropout off, float64."""
    torch.manual_seed(0)
    module = torch.nn.Module()
    module.is_causal = causal
    module.config = transformers.LlamaConfig()  # no cross-attention
    B, L = 5, 13
    real = padding_rows([(0, 0), (3, 0), (0, 4), [2, 5, 6], (13, 0)], L).to(device)
    fn = masking_utils.causal_mask_function if causal else masking_utils.bidirectional_mask_function
    mask = hf_oss.mask(batch_size=B, q_length=L, kv_length=L, mask_function=fn, attention_mask=real,
                       allow_is_causal_skip=causal, device=device)
    assert getattr(mask, hf_oss._MASK_KIND) == "padded"
    q = torch.randn(B, 4, L, 16, dtype=torch.float64, device=device, requires_grad=True)
    k, v = (torch.randn(B, 2, L, 16, dtype=torch.float64, device=device, requires_grad=True) for _ in range(2))
    derived = []
    derive = hf_oss._derive_padded
    monkeypatch.setattr(hf_oss, "_derive_padded", lambda *a: derived.append(1) or derive(*a))
    for _ in range(3):  # three layers with one mask
        with Calls() as calls:
            out, _ = hf_oss.attention_forward(module, q, k, v, mask, scaling=0.3)
        assert calls.varlen == 1 and calls.dense == 0
        assert calls.varlen_args[0]["cu_q"].tolist() == [0, 13, 23, 32, 42, 42]
        assert calls.varlen_args[0]["causal"] == causal
    assert len(derived) == 1
    want = torch_oss.attention(q, k, v, attn_mask=mask, scale=0.3, enable_gqa=True).transpose(1, 2)
    keep = real[:, :, None, None]
    torch.testing.assert_close(out, want * keep, atol=1e-12, rtol=1e-12)
    assert not out[~real].any()
    g = torch.randn_like(out) * keep  # the padding positions' outputs feed nothing
    grads = torch.autograd.grad(out, (q, k, v), g)
    want_grads = torch.autograd.grad(want, (q, k, v), g)
    for n, a, b in zip("qkv", grads, want_grads):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12, msg=f"d{n}")


def test_padded_masks_that_are_not_the_rule_stay_dense():
    """A padded mask the varlen call would not reproduce keeps the dense path:
    a sliding window over a row with an inner hole (the window counts
    positions, the packed tokens would count real tokens), a mask changed in
    place, and a bidirectional call of a model with cross-attention (whose
    padding may be the keys' alone)."""
    torch.manual_seed(0)
    module = torch.nn.Module()
    module.is_causal = True
    module.config = transformers.LlamaConfig()
    B, L, W = 2, 12, 4
    real = padding_rows([[3, 4], (2, 0)], L)
    q, k, v = (torch.randn(B, 2, L, 16, dtype=torch.float64) for _ in range(3))

    def dense(m):
        return torch_oss.attention(q, k, v, attn_mask=m).transpose(1, 2)

    windowed = hf_oss.mask(batch_size=B, q_length=L, kv_length=L, local_size=W, attention_mask=real,
                           mask_function=masking_utils.sliding_window_causal_mask_function(W))
    with Calls() as calls:
        out, _ = hf_oss.attention_forward(module, q, k, v, windowed, sliding_window=W)
    assert calls.varlen == 0 and calls.dense == 1
    torch.testing.assert_close(out, dense(windowed), atol=1e-12, rtol=1e-12)
    # without the hole the same window is the rule, and the varlen call runs
    edges = padding_rows([(0, 3), (2, 0)], L)
    windowed = hf_oss.mask(batch_size=B, q_length=L, kv_length=L, local_size=W, attention_mask=edges,
                           mask_function=masking_utils.sliding_window_causal_mask_function(W))
    with Calls() as calls:
        out, _ = hf_oss.attention_forward(module, q, k, v, windowed, sliding_window=W)
    assert calls.varlen == 1 and calls.dense == 0 and calls.varlen_args[0]["window"] == [W - 1, W - 1]
    torch.testing.assert_close(out, dense(windowed) * edges[:, :, None, None], atol=1e-12, rtol=1e-12)

    mask = hf_oss.mask(batch_size=B, q_length=L, kv_length=L, attention_mask=real)
    with Calls() as calls:
        hf_oss.attention_forward(module, q, k, v, mask)
    assert calls.varlen == 1
    mask[1, 0, 5, 0] = True  # a padding key made visible: the version moves on, the check fails
    with Calls() as calls:
        out, _ = hf_oss.attention_forward(module, q, k, v, mask)
    assert calls.varlen == 0 and calls.dense == 1
    torch.testing.assert_close(out, dense(mask), atol=1e-12, rtol=1e-12)

    module.is_causal = False
    module.config = transformers.BartConfig()  # encoder-decoder: cross-attention calls look the same
    mask = hf_oss.mask(batch_size=B, q_length=L, kv_length=L, attention_mask=real,
                       mask_function=masking_utils.bidirectional_mask_function, allow_is_causal_skip=False)
    with Calls() as calls:
        out, _ = hf_oss.attention_forward(module, q, k, v, mask)
    assert calls.varlen == 0 and calls.dense == 1
    torch.testing.assert_close(out, dense(mask), atol=1e-12, rtol=1e-12)


def test_cu_seq_lens_checks_and_fallback():
    """cu_seq_lens on the CPU are checked (a bad one raises, naming it); a
    call that falls back (a tensor subclass) computes the same documents
    with a dense mask made from cu_seq_lens, the score variants included."""
    torch.manual_seed(0)
    module = torch.nn.Module()
    module.is_causal = True
    q, k, v = packed_row_qkv()
    cu = torch.tensor([0, 5, 14, 17], dtype=torch.int32)
    kw = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=9, max_length_k=9)
    with pytest.raises(ValueError, match="cu_seq_lens_q"):
        hf_oss.attention_forward(module, q, k, v, None, **dict(kw, cu_seq_lens_q=torch.tensor([0, 5, 14, 16])))
    with pytest.raises(ValueError, match="cu_seq_lens_k"):
        hf_oss.attention_forward(module, q, k, v, None, **dict(kw, max_length_k=8))
    sinks = torch.randn(4, dtype=torch.float64)
    for variants in ({}, dict(sliding_window=3), dict(softcap=2.0, s_aux=sinks, sliding_window=4)):
        with Calls() as calls:
            served, _ = hf_oss.attention_forward(module, q, k, v, None, scaling=0.3, **kw, **variants)
        assert calls.varlen == 1
        window = variants.get("sliding_window")
        want = torch.cat([
            torch_oss.attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], is_causal=True, scale=0.3,
                                enable_gqa=True, softcap=variants.get("softcap", 0.0), sinks=variants.get("s_aux"),
                                window_size=(-1, -1) if window is None else (window - 1, window - 1))
            for a, b in ((0, 5), (5, 14), (14, 17))], dim=2).transpose(1, 2)
        torch.testing.assert_close(served, want, atol=1e-12, rtol=1e-12)
        with pytest.warns(torch_oss.FallbackWarning):
            fell_back, _ = hf_oss.attention_forward(module, q.as_subclass(Subclass), k, v, None, scaling=0.3, **kw,
                                                    **variants)
        torch.testing.assert_close(fell_back.as_subclass(torch.Tensor), want, atol=1e-6, rtol=1e-6)
        torch_oss.reset_fallback_stats()


@pytest.mark.parametrize("device", [cuda_param("cuda")])
def test_cu_seq_lens_route_does_not_synchronise_cuda(device):
    """With cu_seq_lens on the GPU and max lengths as ints, a packed call
    (forward and backward) makes no host synchronisation."""
    torch.manual_seed(0)
    module = torch.nn.Module()
    module.is_causal = True
    q, k, v = (torch.randn(1, h, 17, 64, device=device, dtype=torch.bfloat16, requires_grad=True) for h in (4, 2, 2))
    cu = torch.tensor([0, 5, 14, 17], dtype=torch.int32, device=device)
    kw = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu.clone(), max_length_q=9, max_length_k=9)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with Calls() as calls:
            out, _ = hf_oss.attention_forward(module, q, k, v, None, scaling=0.125, **kw)
            out.sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert calls.varlen == 1 and calls.varlen_backward == 1 and calls.dense == 0


class Subclass(torch.Tensor):
    """A tensor subclass: what torch_oss leaves to PyTorch (a fallback)."""


# ---------------------------------------------------------------------------
# torch.compile
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_compile_packed(device):
    """Compiled (fullgraph): with the FlashAttention kwargs the graph holds
    attention_varlen; with position_ids only the dense op (reading the
    documents would need a host synchronisation). Both give the packed
    logits."""
    torch._dynamo.reset()
    model = build("llama", attn="oss").float().to(device)
    docs = documents()
    with torch.no_grad():
        want = run_per_document(model, docs, device)[0]
        for route, op in (("cu_seq_lens", "oss.attention_varlen"), ("position_ids", "oss.attention.")):
            backend = AotEagerAndRecordGraphs()
            compiled = torch.compile(model, backend=backend, fullgraph=True)
            got = compiled(**packed_batch(docs, device, route), use_cache=False).logits
            ops = {str(n.target) for g in backend.fw_graphs for n in g.graph.nodes if n.op == "call_function"}
            assert any(o.startswith(op) for o in ops), (route, ops)
            torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
            torch._dynamo.reset()


# ---------------------------------------------------------------------------
# Score variants: sinks, softcap, sliding-window layers
# ---------------------------------------------------------------------------


def _variant_model(family):
    common = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, sliding_window=4, max_position_embeddings=128)
    if family == "gpt_oss":  # attention sinks (s_aux) and sliding-window layers
        cfg = transformers.GptOssConfig(intermediate_size=64, num_local_experts=4, num_experts_per_tok=2,
                                        layer_types=["sliding_attention", "full_attention"], **common)
    elif family == "gemma2":  # logit softcapping and sliding-window layers
        cfg = transformers.Gemma2Config(intermediate_size=96, attn_logit_softcapping=2.0, **common)
    else:  # qwen2: sliding-window layers mixed with full ones
        cfg = transformers.Qwen2Config(intermediate_size=96, use_sliding_window=True, max_window_layers=0,
                                       layer_types=["sliding_attention", "full_attention"], **common)
    cfg._attn_implementation = "eager"
    return transformers.AutoModelForCausalLM.from_config(cfg).float()


VARIANT_CASES = [("gpt_oss", "cu_seq_lens"), ("gpt_oss", "position_ids"), ("gemma2", "position_ids"),
                 ("gemma2", "cu_seq_lens"), ("qwen2", "position_ids")]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family,route", VARIANT_CASES, ids=["-".join(c) for c in VARIANT_CASES])
def test_packed_variant_models(device, family, route):
    """Packed rows of models whose attention passes s_aux / softcap /
    sliding_window: attention_varlen in every layer (forward and backward),
    logits and every parameter's gradient (the sinks' included) as with
    "eager" run document by document. gpt-oss builds its masks without
    position_ids, so transformers does not see the documents: from
    position_ids alone its packed row is one sequence, with "oss" as with
    "eager" (the dense path); its FlashAttention kwargs do separate them."""
    torch.manual_seed(0)
    model = _variant_model(family).to(device)
    docs = documents()
    packs = not (family == "gpt_oss" and route == "position_ids")
    model.set_attn_implementation("eager")
    if packs:
        logits, loss = run_per_document(model.train(), docs, device, train=True)
    else:
        logits, loss = run_packed(model.train(), docs, device, route, train=True)
    want = (logits.detach(), grads_of(model, loss))
    model.set_attn_implementation("oss")
    with Calls() as calls:
        logits, loss = run_packed(model.train(), docs, device, route, train=True)
        got = (logits.detach(), grads_of(model, loss))
    if packs:
        assert calls.varlen == 2 and calls.dense == 0 and calls.varlen_backward == 2, vars(calls)
        assert sorted(a["window"][0] for a in calls.varlen_args) == [-1, 3]
    else:
        assert calls.varlen == 0 and calls.dense == 2
    assert torch_oss.fallback_stats() == {}
    torch.testing.assert_close(got[0], want[0], atol=2e-5, rtol=1e-4)
    assert got[1].keys() == want[1].keys()
    if family == "gpt_oss":
        assert any(name.endswith("sinks") for name in got[1])
    for name, grad in want[1].items():
        torch.testing.assert_close(got[1][name], grad, atol=2e-5, rtol=1e-3, msg=name)
