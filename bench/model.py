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

--generate times Hugging Face model.generate() on the same model instead
(eager, the default DynamicCache, greedy, min_new_tokens = max_new_tokens so
every run generates the same count), "oss" against "sdpa": a prompt of
--prompt-len random tokens (default 2048; CPU 64), --new-tokens new tokens
(default 256; CPU 16), per batch size of --gen-batches (default 1 16; CPU 1 2).
Per batch: prefill time (time to the first token: generate with
max_new_tokens=1), total time, decode tokens/s = batch * (new - 1) / (total -
prefill), end-to-end tokens/s = batch * new / total, and oss / sdpa of the
decode tokens/s. Times: wall clock between torch.cuda.synchronize() calls, one
warm-up generate per implementation and batch, then --gen-runs rounds (default
5; CPU 1), each timing both implementations back to back (which goes first
alternates from round to round), so that a drift of the machine's speed, which
on a shared host can exceed the difference being measured, falls on both alike:
medians of the times, and the median over rounds of each round's oss / sdpa
decode tokens/s (the paired ratio, with its range). Checked first, per batch,
by the same rule against float64: the logits of the first generated position
(the prompt's last position) and those of one decoding step with a
DynamicCache (the prompt with use_cache=True, then one token with that cache);
the float64 reference runs one sequence at a time.
Generated tokens are not required to agree (bf16 argmax ties may go either
way); how many of the first 32 agree between oss and sdpa is printed, for
information. Results go to model_generate_<device>.json.

--padded times a padded batch instead (a 2-D attention_mask, right padding,
each row's length drawn from L/2 to L, the first row full; needs --batch of at
least 2): the loss and the check count the real tokens only, tokens/s counts
real tokens, and "oss" runs them packed (docs/models.md, padded batches).

    python bench/model.py                     # GPU if visible, else CPU
    python bench/model.py --seqlens 2048 4096 --batch 2
    python bench/model.py --padded --batch 4 --seqlens 2048
    python bench/model.py --generate          # generation, GPU if visible, else CPU
    python bench/model.py --generate --prompt-len 4096 --new-tokens 128 --gen-batches 1 4 16
"""

import argparse
import copy
import inspect
import os
import statistics
import sys
import time

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
    p.add_argument("--padded", action="store_true", help="a right-padded batch with its attention_mask (see above)")
    p.add_argument("--generate", action="store_true", help="time model.generate() instead (see above)")
    p.add_argument("--prompt-len", type=int, default=None, help="--generate: default 2048 (cuda), 64 (cpu)")
    p.add_argument("--gen-runs", type=int, default=None, help="--generate: timed rounds, default 5 (cuda), 1 (cpu)")
    p.add_argument("--new-tokens", type=int, default=None, help="--generate: default 256 (cuda), 16 (cpu)")
    p.add_argument("--gen-batches", type=int, nargs="+", default=None,
                   help="--generate: batch sizes, default 1 16 (cuda), 1 2 (cpu)")
    args = p.parse_args()
    gpu = args.device == "cuda"
    args.config = args.config or ("1b" if gpu else "tiny")
    args.dtype = getattr(torch, args.dtype or ("bfloat16" if gpu else "float32"))
    args.seqlens = args.seqlens or ([2048, 4096, 8192] if gpu else [128, 256])
    args.check_seqlen = args.check_seqlen or min(1024, min(args.seqlens))
    args.prompt_len = args.prompt_len or (2048 if gpu else 64)
    args.new_tokens = args.new_tokens or (256 if gpu else 16)
    args.gen_batches = args.gen_batches or ([1, 16] if gpu else [1, 2])
    if args.padded and (args.generate or args.batch < 2):
        p.error("--padded times forward and forward+backward of a batch of at least 2 rows (--batch)")
    if args.new_tokens < 2:
        p.error("--new-tokens must be at least 2 (decode tokens/s counts the tokens after the first)")
    return args


def build_model(transformers, name, device):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**CONFIGS[name], attention_dropout=0.0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    return model.eval()


def max_err(a, b):
    return (a.double() - b.double()).abs().max().item()


def random_ids(model, shape, device, seed):
    return torch.randint(0, model.config.vocab_size, shape, device=device,
                         generator=torch.Generator(device).manual_seed(seed))


def padding_mask(batch, length, device, seed):
    """(batch, length) bool, right padding: row lengths from length // 2 to
    length, the first row full (--padded takes a batch of at least 2)."""
    lengths = torch.randint(length // 2, length + 1, (batch,), generator=torch.Generator().manual_seed(seed))
    lengths[0] = length
    return (torch.arange(length)[None] < lengths[:, None]).to(device)


def cast_with_reference(model, dtype):
    """Casts `model` to dtype; returns its float64 copy with "sdpa" (the same,
    rounded, weights computed in float64): the reference of the checks."""
    model.to(dtype)
    ref_model = copy.deepcopy(model).to(torch.float64)
    ref_model.set_attn_implementation("sdpa")
    return ref_model


def compare(name, ref, ours, peer, dtype):
    """tests/_util.py's rule on one tensor: max|ours - ref64| <= 2 * max|peer -
    ref64| + atol * max|ref64|, atol scaled to the tensor (gradients are far from
    1 in magnitude). Returns (ok, row of the check table)."""
    e_ours, e_peer = max_err(ours, ref), max_err(peer, ref)
    bound = 2 * e_peer + ATOL[dtype] * ref.abs().max().item()
    good = bool(torch.isfinite(ours).all()) and e_ours <= bound
    return good, [name, f"{e_peer:.3e}", f"{e_ours:.3e}", f"{bound:.3e}", "ok" if good else "FAIL"]


def run_once(model, ids, params, mask=None):
    """Logits and the gradients of `params` (only those: the float64 copy of a
    1 B model has no memory to spare) for the next-token cross-entropy of ids
    (of the real tokens where `mask` pads the batch), computed in float32
    (float64 for the float64 reference: the library's loss would round the
    reference to float32)."""
    wanted = {id(p) for p in params}
    for p in model.parameters():
        p.grad = None
        p.requires_grad_(id(p) in wanted)
    try:
        logits = model(ids, attention_mask=mask, use_cache=False).logits
        wide = logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32)
        targets = ids[:, 1:] if mask is None else ids[:, 1:].masked_fill(~mask[:, 1:], -100)
        loss = torch.nn.functional.cross_entropy(wide[:, :-1].flatten(0, 1), targets.flatten())
        loss.backward()
        return logits.detach(), [p.grad.detach().clone() for p in params]
    finally:
        for p in model.parameters():
            p.requires_grad_(True)
            p.grad = None


def check(model, args):
    """Casts `model` to the benchmark dtype; runs its float64 copy (the same
    weights) as the reference, then "sdpa" and "oss". Returns (ok, rows of the
    check table)."""
    device = args.device
    ids = random_ids(model, (args.batch, args.check_seqlen), device, 1)
    mask = padding_mask(args.batch, args.check_seqlen, device, 1) if args.padded else None
    layers = model.model.layers
    names = [f"layers.{i}.self_attn.{p}_proj.weight" for i in (0, len(layers) - 1) for p in ("q", "k", "v", "o")]

    def chosen(m):
        return [m.get_parameter(f"model.{n}") for n in names]

    ref_model = cast_with_reference(model, args.dtype)
    ref_logits, ref_grads = run_once(ref_model, ids, chosen(ref_model), mask)
    del ref_model
    results = {}
    for impl in ("sdpa", "oss"):
        model.set_attn_implementation(impl)
        results[impl] = run_once(model, ids, chosen(model), mask)
    if mask is not None:  # the logits of real positions (padding positions' differ by design)
        ref_logits = ref_logits[mask]
        results = {impl: (logits[mask], grads) for impl, (logits, grads) in results.items()}
    model.zero_grad(set_to_none=True)
    rows, ok = [], True
    tensors = [("logits", ref_logits, results["oss"][0], results["sdpa"][0])]
    tensors += [(n, r, o, s) for n, r, o, s in zip(names, ref_grads, results["oss"][1], results["sdpa"][1])]
    for name, ref, ours, peer in tensors:
        good, row = compare(name, ref, ours, peer, args.dtype)
        ok &= good
        rows.append(row)
    del results, ref_logits, ref_grads, tensors
    if device == "cuda":
        torch.cuda.empty_cache()
    return ok, rows


def prefill_and_step(model, ids, step, rows):
    """The logits of the first generated position (the prompt's last) and of one
    decoding step: ids (B, L) through the model with a DynamicCache, then the
    token step (B, 1) with that cache; `rows` sequences at a time."""
    from transformers import DynamicCache

    # the argument is `cache` from transformers 5.24 on, `past_key_values` before (deprecated since)
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    first, second = [], []
    with torch.no_grad():
        for i, s in zip(ids.split(rows), step.split(rows)):
            cache = {name: DynamicCache(config=model.config)}  # filled in place by both calls
            first.append(model(i, use_cache=True, logits_to_keep=1, **cache).logits[:, -1])
            second.append(model(s, use_cache=True, logits_to_keep=1, **cache).logits[:, -1])
    return torch.cat(first), torch.cat(second)


def check_generate(model, args):
    """check() for --generate, per batch of --gen-batches: prefill_and_step() of
    a --prompt-len prompt and one more token, "sdpa" and "oss" against the
    float64 copy. The reference runs one sequence at a time: its math attention
    holds (H, L, L) float64 scores. Returns (ok, rows of the check table)."""
    ref_model = cast_with_reference(model, args.dtype)
    rows, ok = [], True
    for batch in args.gen_batches:
        ids = random_ids(model, (batch, args.prompt_len), args.device, 1)
        step = random_ids(model, (batch, 1), args.device, 2)
        ref = prefill_and_step(ref_model, ids, step, 1)
        got = {}
        for impl in ("sdpa", "oss"):
            model.set_attn_implementation(impl)
            got[impl] = prefill_and_step(model, ids, step, batch)
        for j, what in enumerate(("first generated position logits", "decoding step logits (KV cache)")):
            good, row = compare(f"batch {batch}: {what}", ref[j], got["oss"][j], got["sdpa"][j], args.dtype)
            ok &= good
            rows.append(row)
    del ref_model, ref, got
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return ok, rows


def timed(model, impl, mode, ids, mask=None):
    model.set_attn_implementation(impl)
    labels = ids if mask is None else ids.masked_fill(~mask, -100)
    if mode == "forward":
        def fn():
            with torch.no_grad():
                model(ids, attention_mask=mask, use_cache=False)
    else:
        def fn():
            model.zero_grad(set_to_none=True)
            model(ids, attention_mask=mask, labels=labels, use_cache=False).loss.backward()
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


def timed_generate(model, ids, new_tokens, runs, impls=("sdpa", "oss")):
    """Per implementation: the tokens of a warm-up greedy generate() of
    new_tokens, then `runs` rounds, each timing generate() of exactly 1 token
    (the prefill) and of new_tokens for every implementation back to back, the
    order alternating from round to round. Returns ({impl: [(prefill s, total
    s), ...]}, {impl: tokens})."""
    mask = torch.ones_like(ids)  # what a tokenizer gives; generate() would otherwise guess it from pad tokens
    cuda = ids.device.type == "cuda"

    def run(impl, n):
        model.set_attn_implementation(impl)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             pad_token_id=model.config.eos_token_id)
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        if out.shape[1] != ids.shape[1] + n:
            raise RuntimeError(f"generate() gave {out.shape[1] - ids.shape[1]} new tokens, not {n}")
        return seconds, out[:, ids.shape[1]:]

    tokens = {impl: run(impl, new_tokens)[1] for impl in impls}
    times = {impl: [] for impl in impls}
    for r in range(runs):
        for impl in (impls if r % 2 == 0 else impls[::-1]):
            times[impl].append((run(impl, 1)[0], run(impl, new_tokens)[0]))
    return times, tokens


def time_steps(model, args, title):
    """The default mode: forward and forward+backward per --seqlens. Returns the
    JSON results."""
    model.train()  # no dropout in this config; train() as in a training step
    rows, results = [], []
    for L in args.seqlens:
        ids = torch.randint(0, model.config.vocab_size, (args.batch, L), device=args.device)
        mask = padding_mask(args.batch, L, args.device, 2) if args.padded else None
        for mode in ("forward", "forward+backward"):
            t = {impl: timed(model, impl, mode, ids, mask) for impl in ("sdpa", "oss")}
            tokens = args.batch * L if mask is None else int(mask.sum())
            tps = {impl: tokens / (t[impl][0] / 1e3) for impl in t}
            results.append({"seqlen": L, "batch": args.batch, "mode": mode, "padded": args.padded, "tokens": tokens,
                            **{f"{impl}_ms": t[impl][0] for impl in t},
                            **{f"{impl}_tokens_per_s": tps[impl] for impl in t},
                            **{f"{impl}_peak_gib": t[impl][1] for impl in t},
                            "speedup_oss_over_sdpa": t["sdpa"][0] / t["oss"][0]})
            peak = lambda impl: "-" if t[impl][1] is None else f"{t[impl][1]:.1f}"  # noqa: E731
            rows.append([L, mode, f"{t['sdpa'][0]:.2f}", f"{t['oss'][0]:.2f}", f"{tps['sdpa']:.0f}",
                         f"{tps['oss']:.0f}", f"{t['sdpa'][0] / t['oss'][0]:.3f}", peak("sdpa"), peak("oss")])
    padded = ", padded (tok/s: real tokens)" if args.padded else ""
    print_table(f"{title}, batch {args.batch}{padded}) on {args.device}: attn_implementation 'oss' vs 'sdpa'",
                ["seqlen", "mode", "sdpa ms", "oss ms", "sdpa tok/s", "oss tok/s", "oss speedup", "sdpa GiB",
                 "oss GiB"], rows)
    return results


def time_generation(model, args, title):
    """--generate: generate() per --gen-batches. Returns the JSON results."""
    model.eval()
    runs = args.gen_runs or (5 if args.device == "cuda" else 1)
    new = args.new_tokens
    n_agree = min(32, new)
    rows, results = [], []
    for batch in args.gen_batches:
        ids = random_ids(model, (batch, args.prompt_len), args.device, 3)
        times, tokens = timed_generate(model, ids, new, runs)
        # per round: decode tokens/s from that round's two generate() calls
        rounds = {impl: [batch * (new - 1) / (total - prefill) for prefill, total in times[impl]] for impl in times}
        ratios = [o / s for o, s in zip(rounds["oss"], rounds["sdpa"])]
        ratio = statistics.median(ratios)
        t = {impl: (statistics.median(p for p, _ in times[impl]), statistics.median(x for _, x in times[impl]))
             for impl in times}
        decode = {impl: statistics.median(rounds[impl]) for impl in rounds}
        e2e = {impl: batch * new / t[impl][1] for impl in t}
        agree = int((tokens["oss"][:, :n_agree] == tokens["sdpa"][:, :n_agree]).sum())
        results.append({"batch": batch, "prompt_len": args.prompt_len, "new_tokens": new, "runs": runs,
                        **{f"{impl}_prefill_ms": t[impl][0] * 1e3 for impl in t},
                        **{f"{impl}_total_ms": t[impl][1] * 1e3 for impl in t},
                        **{f"{impl}_decode_tokens_per_s": decode[impl] for impl in t},
                        **{f"{impl}_e2e_tokens_per_s": e2e[impl] for impl in t},
                        "decode_oss_over_sdpa": ratio, "decode_oss_over_sdpa_per_round": ratios,
                        "first_tokens_compared": batch * n_agree, "first_tokens_agreeing": agree})
        rows.append([batch, f"{t['sdpa'][0] * 1e3:.1f}", f"{t['oss'][0] * 1e3:.1f}", f"{t['sdpa'][1] * 1e3:.1f}",
                     f"{t['oss'][1] * 1e3:.1f}", f"{decode['sdpa']:.1f}", f"{decode['oss']:.1f}",
                     f"{e2e['sdpa']:.1f}", f"{e2e['oss']:.1f}",
                     f"{ratio:.3f} ({min(ratios):.2f}-{max(ratios):.2f})",
                     f"{agree}/{batch * n_agree}"])
    print_table(f"{title}) on {args.device}: generate(), prompt {args.prompt_len} + {new} new tokens, greedy, "
                f"DynamicCache, eager, medians of {runs} interleaved rounds; attn_implementation 'oss' vs 'sdpa'",
                ["batch", "sdpa prefill ms", "oss prefill ms", "sdpa total ms", "oss total ms", "sdpa decode tok/s",
                 "oss decode tok/s", "sdpa e2e tok/s", "oss e2e tok/s", "oss/sdpa decode (range)",
                 f"same first {n_agree}"], rows)
    return results


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
    shape = (f"batches {' '.join(map(str, args.gen_batches))}, prompt {args.prompt_len} + {args.new_tokens} new "
             "tokens" if args.generate else f"batch {args.batch}")
    print(f"Llama-style model '{args.config}': {n_params / 1e6:.1f} M parameters, {args.dtype}, {shape}, "
          f"device {args.device}")
    if args.generate:
        where = {"prompt_len": args.prompt_len, "batches": args.gen_batches}
        where_text = f"prompt length {args.prompt_len}, then one decoding step with a DynamicCache"
    else:
        where = {"seqlen": args.check_seqlen}
        where_text = f"seqlen {args.check_seqlen}"
    check_rows, ok = [], True
    if not args.no_check:
        ok, check_rows = (check_generate if args.generate else check)(model, args)
        print_table(f"check at {where_text}: max|x - ref64| of sdpa and oss, bound = 2 x sdpa + atol x max|ref64|",
                    ["tensor", "sdpa err", "oss err", "bound", ""], check_rows)
        if not ok:
            print("bench/model.py: attn_implementation='oss' does not match 'sdpa' by the tolerance rule; not timing")
            return 1
    else:
        model.to(args.dtype)
    title = f"Llama-style {args.config} ({n_params / 1e6:.1f} M params, {str(args.dtype)[6:]}"
    results = (time_generation if args.generate else time_steps)(model, args, title)
    fallbacks = torch_oss.fallback_stats()
    if fallbacks:
        print(f"torch_oss fallbacks during the run: {fallbacks}")
    name = f"model_generate_{args.device}" if args.generate else f"model_{args.device}"
    write_json(name, {"environment": environment(args.device), "model": {"config": args.config,
                      **CONFIGS[args.config], "parameters": n_params, "dtype": str(args.dtype)},
                      "check": {**where, "rows": check_rows, "ok": ok}, "results": results, "fallbacks": fallbacks})
    return 0


if __name__ == "__main__":
    sys.exit(main())
