"""Cross-entropy benchmark: forward + backward of a mean loss over class-index
targets (what a training step runs on an LM head's logits), for torch_oss
against F.cross_entropy and torch.compile(F.cross_entropy) timed in the same
run, as GB/s and % of the device-to-device copy ceiling measured in the same
run. Bytes per call: the logits read once plus their gradient written once
(the least any implementation moves), so an implementation that reads the
logits twice (a forward, then a backward that reads them again) is at most at
2/3 of the copy ceiling.

    python3 bench/cross_entropy.py                       # GPU: vocab 32000, 50257, 128256, 262144; 16384 rows; bf16
    python3 bench/cross_entropy.py --tokens 32768 --vocabs 128256 --rounds 3
    python3 bench/cross_entropy.py --smoke                # tiny shapes on the CPU (checks the script runs)
    python3 bench/cross_entropy.py --probs [--smoke]      # class-probability targets

Implementations, each timed for forward + backward of the same mean loss:
  torch_oss          torch_oss.cross_entropy(x, t) then autograd: the forward
                     writes the gradient in its pass over the logits, the
                     backward hands it on (upstream gradient 1)
  torch_oss x0.5     the same with an upstream gradient of 0.5: the backward
                     rewrites the gradient (a second pass over the logits)
  torch_oss two ops  torch.ops.oss.cross_entropy then autograd: the forward op
                     (one read) and the backward op (one read, one write), as
                     a compiled graph runs them
  F.cross_entropy    eager PyTorch, then autograd
  compile            torch.compile(F.cross_entropy), then autograd
Every implementation's gradient is checked against a float64 reference (some
rows) before it is timed. Results: a table on stdout and results/cross_entropy.json.

--probs: class-probability targets (a softmax of the input's dtype and
shape), forward + backward of a mean loss: torch_oss.cross_entropy (the fused
probability kernels: a forward pass over the logits and the target, a
backward pass reading both again and writing the gradient) against
F.cross_entropy and torch.compile(F.cross_entropy), same run. Bytes per call:
the logits and the target read once plus the gradient written once (so a
forward + backward that reads both twice is at most at 3/5 of the copy
ceiling). Results in results/cross_entropy_probs.json.

--linear: the LM head and the loss, forward + backward of a mean loss over
8 x 4096 tokens, hidden 4096, vocabulary 128256 (GPU; tiny shapes with
--smoke): torch_oss.linear_cross_entropy against F.linear + F.cross_entropy,
time and peak memory beyond the inputs (torch.cuda.max_memory_allocated),
same run; the loss and the gradients checked against each other first.
"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))  # this tree's torch_oss, before an installed one
import common  # noqa: E402

import torch_oss  # noqa: E402

VOCABS = [32000, 50257, 128256, 262144]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CHECK_ROWS = 64


def implementations(compile_too):
    def autograd_of(loss_fn, upstream=1.0):
        def run(x, t):
            loss = loss_fn(x, t)
            (g,) = torch.autograd.grad(loss, x, torch.full_like(loss, upstream))
            return loss, g
        run.upstream = upstream  # the check divides the gradient by it
        return run

    impls = {
        "torch_oss": autograd_of(lambda x, t: torch_oss.cross_entropy(x, t)),
        "torch_oss x0.5": autograd_of(lambda x, t: torch_oss.cross_entropy(x, t), 0.5),
        "torch_oss two ops": autograd_of(lambda x, t: torch.ops.oss.cross_entropy(x, t)[0].mean()),
        "F.cross_entropy": autograd_of(lambda x, t: F.cross_entropy(x, t)),
    }
    if compile_too:
        # one specialised graph per shape, as a user compiling for a fixed shape gets
        torch._dynamo.config.recompile_limit = 1024
        impls["compile"] = autograd_of(torch.compile(lambda x, t: F.cross_entropy(x, t), dynamic=False))
    return impls


def check(name, grad, x, t, peer_grad):
    """Refuse to time an implementation whose gradient is wrong: on the first
    CHECK_ROWS rows, max|ours - ref64| <= 2 max|peer - ref64| + atol, with one
    rounding of each element's own magnitude allowed (the tests' rule)."""
    rows = slice(0, min(CHECK_ROWS, x.shape[0]))
    x64 = x[rows].double()
    ref = torch.softmax(x64, dim=1)
    ref[torch.arange(ref.shape[0], device=x.device), t[rows]] -= 1
    ref /= x.shape[0]
    eps = torch.finfo(grad.dtype).eps
    err = ((grad[rows].double() - ref).abs() - eps * ref.abs()).max().item()
    peer_err = (peer_grad[rows].double() - ref).abs().max().item()
    atol = {torch.float32: 1e-9}.get(grad.dtype, 1e-7)
    if not err <= 2 * peer_err + atol:
        raise AssertionError(f"{name}: gradient error {err:.3e} > {2 * peer_err + atol:.3e}; not timing it")


def time_and_record(timed, rounds, device, nbytes, copy_gbs, point, records, table):
    """Times `timed` (name -> call) in interleaved rounds and appends a record
    (`point` plus the figures) and a table row per implementation, speeds over
    F.cross_entropy's."""
    stats = {name: (m, tr) for name, (m, _, tr, _) in common.time_rounds(timed, rounds, device).items()}
    base = stats["F.cross_entropy"][0]
    for name, (ms, ms_trimmed) in stats.items():
        gbs = nbytes / ms / 1e6
        rec = dict(point, impl=name, ms=ms, ms_trimmed=ms_trimmed, gbs=gbs, pct_copy=100 * gbs / copy_gbs,
                   speedup_vs_F=base / ms)
        records.append(rec)
        table.append((point["vocab"], name, f"{ms:.3f}", f"{gbs:.0f}", f"{rec['pct_copy']:.1f}", f"{base / ms:.2f}x"))


def probs_main(args, device, dtype, vocabs, tokens, rounds):
    """--probs: class-probability targets (the module docstring)."""
    def autograd_of(loss_fn):
        def run(x, t):
            loss = loss_fn(x, t)
            (g,) = torch.autograd.grad(loss, x)
            return loss, g
        return run

    impls = {"torch_oss": autograd_of(lambda x, t: torch_oss.cross_entropy(x, t)),
             "F.cross_entropy": autograd_of(lambda x, t: F.cross_entropy(x, t))}
    if not args.no_compile:
        torch._dynamo.config.recompile_limit = 1024
        impls["compile"] = autograd_of(torch.compile(lambda x, t: F.cross_entropy(x, t), dynamic=False))
    env = common.environment(device)
    copy_gbs = common.copy_bandwidth_gbs(device)
    print(f"cross-entropy with class probabilities, forward+backward on {env.get('gpu', env.get('cpu'))}, torch "
          f"{env['torch']}, commit {env['commit']}; {args.dtype}, {tokens} rows")
    print(f"copy ceiling: {copy_gbs:.0f} GB/s (read + write); bytes = logits and target read once + gradient "
          "written once")
    records, table = [], []
    for vocab in vocabs:
        torch.manual_seed(0)
        x = (torch.randn(tokens, vocab, device=device) * 3).to(dtype).requires_grad_()
        t = torch.randn(tokens, vocab, device=device).softmax(1).to(dtype)
        nbytes = 3 * x.numel() * x.element_size()
        _, peer_grad = impls["F.cross_entropy"](x, t)
        rows = slice(0, min(CHECK_ROWS, tokens))
        x64, t64 = x[rows].detach().double(), t[rows].double()
        ref = (torch.softmax(x64, 1) * t64.sum(1, keepdim=True) - t64) / tokens
        peer_err = (peer_grad[rows].double() - ref).abs().max().item()
        timed = {}
        for name, fn in impls.items():
            _, g = fn(x, t)
            eps = torch.finfo(g.dtype).eps
            err = ((g[rows].double() - ref).abs() - eps * ref.abs()).max().item()
            atol = {torch.float32: 1e-9}.get(g.dtype, 1e-7)
            if not err <= 2 * peer_err + atol:
                raise AssertionError(f"{name} {tokens}x{vocab}: gradient error {err:.3e} > "
                                     f"{2 * peer_err + atol:.3e}; not timing it")
            del g
            timed[name] = lambda fn=fn: fn(x, t)
        del peer_grad
        time_and_record(timed, rounds, device, nbytes, copy_gbs, dict(vocab=vocab, tokens=tokens, dtype=args.dtype),
                        records, table)
        del x, t, timed
    common.print_table("forward + backward (mean loss, class probabilities)",
                       ["vocab", "impl", "ms", "GB/s", "% copy", "vs F"], table)
    common.write_json("cross_entropy_probs" + ("_smoke" if args.smoke else ""),
                      dict(env=env, copy_gbs=copy_gbs, rounds=rounds, records=records))


def linear_main(args, device, dtype):
    tokens, hidden_size, vocab = (64, 32, 1000) if args.smoke else (8 * 4096, 4096, 128256)
    torch.manual_seed(0)
    h = (torch.randn(tokens, hidden_size, device=device) * 0.05).to(dtype).requires_grad_()
    w = (torch.randn(vocab, hidden_size, device=device) * 0.05).to(dtype).requires_grad_()
    t = torch.randint(0, vocab, (tokens,), device=device)
    impls = {
        "torch_oss.linear_cross_entropy": lambda: torch_oss.linear_cross_entropy(h, w, t),
        "F.linear + F.cross_entropy": lambda: F.cross_entropy(F.linear(h, w), t),
    }
    cuda = device == "cuda"
    results, grads = {}, {}
    for name, fn in impls.items():
        def step(fn=fn):
            fn().backward()
            h.grad = w.grad = None

        loss = fn()
        loss.backward()
        grads[name] = (loss.detach().float(), h.grad.float(), w.grad.float())
        h.grad = w.grad = None
        peak = None
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            step()
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - base
        ms = common.bench(step, device, rep_ms=1 if args.smoke else 300)
        results[name] = (ms, peak)
    (l_a, gh_a, gw_a), (l_b, gh_b, gw_b) = grads.values()
    for what, a, b in (("loss", l_a, l_b), ("grad hidden", gh_a, gh_b), ("grad weight", gw_a, gw_b)):
        rel = ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
        if not rel < 2e-2:
            raise AssertionError(f"linear cross-entropy: {what} differs from F.linear + F.cross_entropy by {rel:.2e}")
    env = common.environment(device)
    peer_ms, peer_peak = results["F.linear + F.cross_entropy"]
    table, records = [], []
    for name, (ms, peak) in results.items():
        gib = None if peak is None else peak / 2**30
        records.append(dict(impl=name, tokens=tokens, hidden=hidden_size, vocab=vocab, dtype=str(dtype), ms=ms,
                            peak_gib=gib, time_vs_peer=ms / peer_ms,
                            peak_vs_peer=None if peak is None else peak / peer_peak))
        table.append((name, f"{ms:.1f}", f"{ms / peer_ms:.2f}", "-" if gib is None else f"{gib:.2f}",
                      "-" if peak is None else f"{peak / peer_peak:.2f}"))
    common.print_table(f"LM head + loss, forward + backward, {tokens} tokens, hidden {hidden_size}, vocabulary "
                       f"{vocab}, {dtype}, {env.get('gpu', env.get('cpu'))}",
                       ["impl", "ms", "time / peer", "peak GiB", "peak / peer"], table)
    common.write_json("linear_cross_entropy" + ("_smoke" if args.smoke else ""), dict(env=env, records=records))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU, one round")
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    ap.add_argument("--vocabs", default=None, help="comma-separated class counts")
    ap.add_argument("--tokens", type=int, default=None, help="rows of logits (default 16384 GPU, 64 smoke)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--linear", action="store_true", help="linear_cross_entropy against F.linear + F.cross_entropy")
    ap.add_argument("--probs", action="store_true", help="class-probability targets (timed as the module says)")
    args = ap.parse_args()
    if args.device is None and not torch.cuda.is_available():
        args.smoke = True  # `make bench` on a machine without a GPU: check that the script runs
    device = args.device or ("cpu" if args.smoke else "cuda")
    vocabs = [int(v) for v in args.vocabs.split(",")] if args.vocabs else ([1000, 5003] if args.smoke else VOCABS)
    tokens = args.tokens or (64 if args.smoke or device != "cuda" else 16384)
    rounds = 1 if args.smoke else args.rounds
    dtype = DTYPES[args.dtype]
    if args.linear:
        return linear_main(args, device, dtype if device == "cuda" else torch.float32)
    if args.probs:
        return probs_main(args, device, dtype, vocabs, tokens, rounds)

    env = common.environment(device)
    copy_gbs = common.copy_bandwidth_gbs(device)
    print(f"cross-entropy forward+backward on {env.get('gpu', env.get('cpu'))}, torch {env['torch']}, "
          f"commit {env['commit']}; {args.dtype}, {tokens} rows")
    print(f"copy ceiling: {copy_gbs:.0f} GB/s (read + write); bytes = logits read once + gradient written once")

    impls = implementations(not args.no_compile)
    records, table = [], []
    for vocab in vocabs:
        x = (torch.randn(tokens, vocab, device=device) * 3).to(dtype).requires_grad_()
        t = torch.randint(0, vocab, (tokens,), device=device)
        nbytes = 2 * x.numel() * x.element_size()
        _, peer_grad = impls["F.cross_entropy"](x, t)
        timed = {}
        for name, fn in impls.items():
            _, g = fn(x, t)
            check(f"{name} {tokens}x{vocab}", g / fn.upstream, x.detach(), t, peer_grad)
            del g
            timed[name] = lambda fn=fn: fn(x, t)
        del peer_grad
        time_and_record(timed, rounds, device, nbytes, copy_gbs, dict(vocab=vocab, tokens=tokens, dtype=args.dtype),
                        records, table)
        del x, t, timed

    common.print_table("forward + backward (mean loss)", ["vocab", "impl", "ms", "GB/s", "% copy", "vs F"], table)
    common.write_json("cross_entropy" + ("_smoke" if args.smoke else ""),
                      dict(env=env, copy_gbs=copy_gbs, rounds=rounds, records=records))


if __name__ == "__main__":
    main()
