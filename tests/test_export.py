"""torch.export of modules that call the torch_oss ops (directly, or through
torch_oss.enable()): the exported program holds torch.ops.oss nodes, runs, matches
eager mode at other sequence lengths (dynamic shapes), survives
run_decompositions() and a save/load round trip, and a Hugging Face model with
attn_implementation="oss" exports too."""

import pytest
import torch
import torch.nn.functional as F
from _util import DEVICES

import torch_oss

STRICT = [False, True]
STRICT_IDS = ["non_strict", "strict"]


@pytest.fixture(autouse=True)
def clean_state():
    torch_oss.disable()
    torch_oss.reset_fallback_stats()
    yield
    torch_oss.disable()


class Block(torch.nn.Module):
    """Attention (grouped-query, causal, optional padding mask) + a softmax
    gate + log_softmax head, calling torch_oss directly or PyTorch's functions
    (``use_oss=False``, the reference; also the form torch_oss.enable() routes)."""

    def __init__(self, dim=48, heads=6, kv_heads=2, use_oss=True):
        super().__init__()
        self.heads, self.kv_heads, self.hd, self.use_oss = heads, kv_heads, dim // heads, use_oss
        self.q = torch.nn.Linear(dim, dim)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * self.hd)
        self.gate = torch.nn.Linear(dim, 5)
        self.head = torch.nn.Linear(dim, 17)

    def forward(self, x, key_padding):
        B, L, _ = x.shape
        q = self.q(x).view(B, L, self.heads, self.hd).transpose(1, 2)
        k, v = self.kv(x).view(B, L, 2, self.kv_heads, self.hd).unbind(2)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        mask = key_padding[:, None, None, :] & torch.ones(L, L, dtype=torch.bool, device=x.device).tril()
        if self.use_oss:
            y = torch_oss.attention(q, k, v, attn_mask=mask, enable_gqa=True)
            gate = torch_oss.softmax(self.gate(x), -1)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
            gate = self.gate(x).softmax(-1)
        y = y.transpose(1, 2).reshape(B, L, -1) * gate.amax(-1, keepdim=True)
        return F.log_softmax(self.head(y), dim=-1) if not self.use_oss else torch_oss.log_softmax(self.head(y), -1)


def example(B, L, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, L, 48, generator=g).to(device)
    padding = torch.ones(B, L, dtype=torch.bool)
    padding[-1, : L // 3] = False  # left padding in the last row
    return x, padding.to(device)


def node_targets(ep):
    return [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]


def pair(device):
    torch.manual_seed(0)
    ours = Block(use_oss=True).to(device).eval()
    ref = Block(use_oss=False).to(device).eval()
    ref.load_state_dict(ours.state_dict())
    return ours, ref


def check_runs_like_eager(module, ref, device, lengths=(7, 19, 33)):
    for L in lengths:
        x, pad = example(2, L, device, seed=L)
        valid = pad[:, :, None].expand(-1, -1, 17)  # padded query rows see no key in the first rows
        got, want = module(x, pad), ref(x, pad)
        torch.testing.assert_close(got[valid], want[valid], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("strict", STRICT, ids=STRICT_IDS)
def test_export_direct_calls_dynamic_seq_len(device, strict):
    ours, ref = pair(device)
    seq = torch.export.Dim("seq", min=2, max=64)
    ep = torch.export.export(ours, example(2, 11, device), dynamic_shapes=({1: seq}, {1: seq}), strict=strict)
    targets = node_targets(ep)
    assert "oss.attention.default" in targets and "oss.softmax.default" in targets, targets
    assert "oss.log_softmax.default" in targets
    assert not any("scaled_dot_product" in t or "aten._softmax" in t for t in targets), targets
    check_runs_like_eager(ep.module(), ref, device)
    # decomposing to the core aten set keeps the custom ops (they have no decomposition) and still runs
    decomposed = ep.run_decompositions()
    assert "oss.attention.default" in node_targets(decomposed)
    check_runs_like_eager(decomposed.module(), ref, device, lengths=(13,))


@pytest.mark.parametrize("device", DEVICES)
def test_export_save_load_round_trip(device, tmp_path):
    ours, ref = pair(device)
    seq = torch.export.Dim("seq", min=2, max=64)
    ep = torch.export.export(ours, example(2, 9, device), dynamic_shapes=({1: seq}, {1: seq}), strict=False)
    path = tmp_path / "block.pt2"
    torch.export.save(ep, str(path))
    loaded = torch.export.load(str(path))
    assert "oss.attention.default" in node_targets(loaded)
    check_runs_like_eager(loaded.module(), ref, device, lengths=(9, 25))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("strict", STRICT, ids=STRICT_IDS)
def test_export_pytorch_functions_under_enable(device, strict):
    _, ref = pair(device)
    seq = torch.export.Dim("seq", min=2, max=64)
    with torch_oss.enabled(transformers=False):
        ep = torch.export.export(ref, example(2, 11, device), dynamic_shapes=({1: seq}, {1: seq}), strict=strict)
    targets = node_targets(ep)
    assert "oss.attention.default" in targets and "oss.softmax.default" in targets, targets
    assert "oss.log_softmax.default" in targets, targets
    assert not any("scaled_dot_product" in t or "aten._softmax" in t for t in targets), targets
    # the exported program keeps torch_oss after disable()
    check_runs_like_eager(ep.module(), ref, device)
    assert torch_oss.fallback_stats() == {}


@pytest.mark.parametrize("device", DEVICES)
def test_export_transformers_model(device):
    transformers = pytest.importorskip("transformers")
    torch_oss.register_transformers()
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="oss").to(device).eval()
    ids = torch.randint(0, 96, (2, 13), device=device)
    mask = torch.ones(2, 13, dtype=torch.long, device=device)
    mask[1, :3] = 0
    with torch.no_grad():
        expected = model(ids, attention_mask=mask, use_cache=False).logits
        ep = torch.export.export(model, (ids,), kwargs={"attention_mask": mask, "use_cache": False}, strict=False)
    targets = node_targets(ep)
    assert targets.count("oss.attention.default") == 2, targets
    assert not any("scaled_dot_product" in t for t in targets), targets
    got = ep.module()(ids, attention_mask=mask, use_cache=False).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
