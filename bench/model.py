"""A Llama-style causal LM with attn_implementation="oss" against "sdpa" (the
same weights, switched with model.set_attn_implementation): forward and
forward+backward time, tokens/s and peak memory per sequence length.

GPU: a Llama-3.2-1B-shaped model (1.24 B parameters: hidden 2048, 16 layers,
32 query / 8 key-value heads of dim 64, MLP 8192, vocabulary 128256) with random
weights in bfloat16, batch 1, sequence lengths 2048, 4096 and 8192.
CPU: a tiny configuration in float32, so that `make bench` runs everywhere.

Before timing, both implementations are checked against the model in float64
(same weights, "sdpa") with tests/_util.py's rule, on logits and on the
gradients of the attention projections of the first and last layer:
max|ours - ref64| <= 2 * max|sdpa - ref64| + atol * max|ref64| (atol scaled
to each tensor, as gradients are far from 1). A failed check exits with status
1 and times nothing.

    python bench/model.py                     # GPU if visible, else CPU
    python bench/model.py --seqlens 2048 4096 --batch 2
"""

import argparse
import copy
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import bench, environment, print_table, write_json  # noqa: E402

CONFIGS = {
    # Llama-3.2-1B's shapes
    "1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500000.0,
               tie_word_embeddings=True),
    "tiny": dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=False),
}
ATOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-4, torch.bfloat16: 1e-3}


def parse_args():
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if cuda else "cpu")
    p.add_argument("--config", choices=sorted(CONFIGS), default=None, help="default: 1b on cuda, tiny on cpu")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default=None,
                   help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--seqlens", type=int, nargs="+", default=None, help="default: 2048 4096 8192 (cuda), 128 256 (cpu)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--check-seqlen", type=int, default=None,
                   help="sequence length of the correctness check (default: the shortest timed one, at most 1024: the "
                   "float64 reference of the 1 B model must fit in 80 GB)")
    p.add_argument("--no-check", action="store_true", help="skip the float64 comparison")
    args = p.parse_args()
    gpu = args.device == "cuda"
    args.config = args.config or ("1b" if gpu else "tiny")
    args.dtype = getattr(torch, args.dtype or ("bfloat16" if gpu else "float32"))
    args.seqlens = args.seqlens or ([2048, 4096, 8192] if gpu else [128, 256])
    args.check_seqlen = args.check_seqlen or min(1024, min(args.seqlens))
    return args


def build_model(transformers, name, device):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**CONFIGS[name], attention_dropout=0.0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    return model.eval()


def max_err(a, b):
    return (a.double() - b.double()).abs().max().item()


def run_once(model, ids, params):
    """Logits and the gradients of `params` (only those: the float64 copy of a
    1 B model has no memory to spare) for the next-token cross-entropy of ids,
    computed in float32 (float64 for the float64 reference: the library's loss
    would round the reference to float32)."""
    wanted = {id(p) for p in params}
    for p in model.parameters():
        p.grad = None
        p.requires_grad_(id(p) in wanted)
    try:
        logits = model(ids, use_cache=False).logits
        wide = logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32)
        loss = torch.nn.functional.cross_entropy(wide[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        return logits.detach(), [p.grad.detach().clone() for p in params]
    finally:
        for p in model.parameters():
            p.requires_grad_(True)
            p.grad = None


def check(model, args, batch):
    """Casts `model` to the benchmark dtype; runs its float64 copy (the same
    weights) as the reference, then "sdpa" and "oss". Returns (ok, rows of the
    check table)."""
    device = args.device
    ids = torch.randint(0, model.config.vocab_size, (batch, args.check_seqlen), device=device,
                        generator=torch.Generator(device).manual_seed(1))
    layers = model.model.layers
    names = [f"layers.{i}.self_attn.{p}_proj.weight" for i in (0, len(layers) - 1) for p in ("q", "k", "v", "o")]

    def chosen(m):
        return [m.get_parameter(f"model.{n}") for n in names]

    model.to(args.dtype)
    ref_model = copy.deepcopy(model).to(torch.float64)  # the same (rounded) weights, computed in float64; "sdpa"
    ref_logits, ref_grads = run_once(ref_model, ids, chosen(ref_model))
    del ref_model
    results = {}
    for impl in ("sdpa", "oss"):
        model.set_attn_implementation(impl)
        results[impl] = run_once(model, ids, chosen(model))
    model.zero_grad(set_to_none=True)
    rows, ok = [], True
    tensors = [("logits", ref_logits, results["oss"][0], results["sdpa"][0])]
    tensors += [(n, r, o, s) for n, r, o, s in zip(names, ref_grads, results["oss"][1], results["sdpa"][1])]
    for name, ref, ours, peer in tensors:
        e_ours, e_peer = max_err(ours, ref), max_err(peer, ref)
        # atol scaled to the tensor: gradients are far from 1 in magnitude
        bound = 2 * e_peer + ATOL[args.dtype] * ref.abs().max().item()
        good = bool(torch.isfinite(ours).all()) and e_ours <= bound
        ok &= good
        rows.append([name, f"{e_peer:.3e}", f"{e_ours:.3e}", f"{bound:.3e}", "ok" if good else "FAIL"])
    del results, ref_logits, ref_grads, tensors
    if device == "cuda":
        torch.cuda.empty_cache()
    return ok, rows


def timed(model, impl, mode, ids):
    model.set_attn_implementation(impl)
    if mode == "forward":
        def fn():
            with torch.no_grad():
                model(ids, use_cache=False)
    else:
        def fn():
            model.zero_grad(set_to_none=True)
            model(ids, labels=ids, use_cache=False).loss.backward()
    peak = None
    if ids.device.type == "cuda":
        fn()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() / 2**30
    # a model step takes 10-200 ms on the GPU: warm up and repeat for a second, so the
    # median covers more than a handful of steps (with the default 100 ms, one run's
    # first point came out 2.6x slower than the same point in the next run)
    ms = bench(fn, ids.device.type, warmup_ms=250, rep_ms=1000)
    model.zero_grad(set_to_none=True)
    return ms, peak


def main():
    args = parse_args()
    try:
        import transformers
    except ImportError:
        print("bench/model.py: transformers is not installed (pip install transformers); nothing to do")
        return 0
    import torch_oss

    torch_oss.register_transformers()
    model = build_model(transformers, args.config, args.device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"Llama-style model '{args.config}': {n_params / 1e6:.1f} M parameters, {args.dtype}, batch {args.batch}, "
          f"device {args.device}")
    check_rows, ok = [], True
    if not args.no_check:
        ok, check_rows = check(model, args, args.batch)
        print_table(f"check at seqlen {args.check_seqlen}: max|x - ref64| of sdpa and oss, bound = 2 x sdpa + atol x "
                    "max|ref64|",
                    ["tensor", "sdpa err", "oss err", "bound", ""], check_rows)
        if not ok:
            print("bench/model.py: attn_implementation='oss' does not match 'sdpa' by the tolerance rule; not timing")
            return 1
    else:
        model.to(args.dtype)
    model.train()  # no dropout in this config; train() as in a training step
    rows, results = [], []
    for L in args.seqlens:
        ids = torch.randint(0, model.config.vocab_size, (args.batch, L), device=args.device)
        for mode in ("forward", "forward+backward"):
            t = {impl: timed(model, impl, mode, ids) for impl in ("sdpa", "oss")}
            tokens = args.batch * L
            tps = {impl: tokens / (t[impl][0] / 1e3) for impl in t}
            results.append({"seqlen": L, "batch": args.batch, "mode": mode,
                            **{f"{impl}_ms": t[impl][0] for impl in t},
                            **{f"{impl}_tokens_per_s": tps[impl] for impl in t},
                            **{f"{impl}_peak_gib": t[impl][1] for impl in t},
                            "speedup_oss_over_sdpa": t["sdpa"][0] / t["oss"][0]})
            peak = lambda impl: "-" if t[impl][1] is None else f"{t[impl][1]:.1f}"  # noqa: E731
            rows.append([L, mode, f"{t['sdpa'][0]:.2f}", f"{t['oss'][0]:.2f}", f"{tps['sdpa']:.0f}",
                         f"{tps['oss']:.0f}", f"{t['sdpa'][0] / t['oss'][0]:.3f}", peak("sdpa"), peak("oss")])
    print_table(f"Llama-style {args.config} ({n_params / 1e6:.1f} M params, {str(args.dtype)[6:]}, batch {args.batch}) "
                f"on {args.device}: attn_implementation 'oss' vs 'sdpa'",
                ["seqlen", "mode", "sdpa ms", "oss ms", "sdpa tok/s", "oss tok/s", "oss speedup", "sdpa GiB",
                 "oss GiB"], rows)
    fallbacks = torch_oss.fallback_stats()
    if fallbacks:
        print(f"torch_oss fallbacks during the run: {fallbacks}")
    write_json(f"model_{args.device}", {"environment": environment(args.device), "model": {"config": args.config,
                         **CONFIGS[args.config], "parameters": n_params, "dtype": str(args.dtype)},
                         "check": {"seqlen": args.check_seqlen, "rows": check_rows, "ok": ok},
                         "results": results, "fallbacks": fallbacks})
    return 0


if __name__ == "__main__":
    sys.exit(main())
