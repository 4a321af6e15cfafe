"""Context-parallel attention: forward+backward time of
torch_oss.distributed.ring_attention on P ranks against torch_oss.attention on
one device over the same S tokens, and the per-device efficiency
T1 / (P * TP).

    torchrun --nproc-per-node 2 bench/context_parallel.py                 # GPUs, NCCL
    torchrun --nproc-per-node 2 bench/context_parallel.py --device cpu --seqlens 256 --heads 2 --head-dim 32
                                                                           # CPU smoke run, gloo

T1 is measured first by rank 0 alone (the other ranks wait), on the full
sequence; TP is the slowest rank's time of each ring iteration (every
iteration starts at a barrier), median over iterations. Each configuration
also reports max |ring - single| of the outputs (the ring's output gathered
to every rank), so a broken run shows itself. Prints a table and writes
results/context_parallel.json.
"""

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import environment, print_table, write_json  # noqa: E402

import torch_oss  # noqa: E402
import torch_oss.distributed as cp  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seqlens", default="32768,131072", help="global sequence lengths S, comma-separated")
    p.add_argument("--heads", type=int, default=16, help="query heads")
    p.add_argument("--kv-heads", type=int, default=None, help="key/value heads (default: --heads)")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    p.add_argument("--causal", default="1,0", help="causal settings to run, comma-separated 1/0")
    p.add_argument("--layout", choices=cp.LAYOUTS, default="zigzag")
    p.add_argument("--comm", choices=cp.COMMS, default="ring")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--no-single", action="store_true", help="skip the single-device baseline (no T1, no check)")
    return p.parse_args()


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fwd_bwd(fn, inputs, dout):
    for t in inputs:
        t.grad = None
    out = fn(*inputs)
    out.backward(dout)
    return out


def time_single(args, device, inputs, dout, causal):
    gqa = inputs[0].shape[1] != inputs[1].shape[1]

    def fn(q, k, v):
        return torch_oss.attention(q, k, v, is_causal=causal, enable_gqa=gqa)

    times = []
    for i in range(args.warmup + args.iters):
        sync(device)
        t0 = time.perf_counter()
        out = fwd_bwd(fn, inputs, dout)
        sync(device)
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times), out.detach()


def time_ring(args, device, inputs, dout, causal, group):
    gqa = inputs[0].shape[1] != inputs[1].shape[1]

    def fn(q, k, v):
        return cp.ring_attention(q, k, v, group=group, is_causal=causal, layout=args.layout, enable_gqa=gqa,
                                 comm=args.comm, check_shapes=False)

    # one call with the shape check, outside the timing
    cp.ring_attention(*(t.detach() for t in inputs), group=group, is_causal=causal, layout=args.layout,
                      enable_gqa=gqa, comm=args.comm)
    times = []
    slowest = torch.zeros(1, dtype=torch.float64, device=device if dist.get_backend() == "nccl" else "cpu")
    for i in range(args.warmup + args.iters):
        sync(device)
        dist.barrier(group)
        t0 = time.perf_counter()
        out = fwd_bwd(fn, inputs, dout)
        sync(device)
        slowest.fill_(time.perf_counter() - t0)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
        if i >= args.warmup:
            times.append(slowest.item())
    return statistics.median(times), out.detach()


def main():
    args = parse_args()
    backend = "nccl" if args.device == "cuda" else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dtype = DTYPES[args.dtype]
    hkv = args.kv_heads or args.heads
    seqlens = [int(s) for s in args.seqlens.split(",") if s]
    causals = [bool(int(c)) for c in args.causal.split(",") if c]
    rows, records = [], []
    for S in seqlens:
        for causal in causals:
            gen = torch.Generator().manual_seed(S + causal)  # the same full tensors on every rank

            def full(h, d=args.head_dim):
                return torch.randn(args.batch, h, S, d, generator=gen).to(dtype)

            q, k, v, dout = full(args.heads), full(hkv), full(hkv), full(args.heads)
            t1, ref = None, None
            if not args.no_single:
                if rank == 0:
                    ins = [t.to(device).requires_grad_(True) for t in (q, k, v)]
                    t1, ref = time_single(args, device, ins, dout.to(device), causal)
                    del ins
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                dist.barrier()
            shards = [cp.shard(t, None, args.layout).to(device).requires_grad_(True) for t in (q, k, v)]
            tp, out = time_ring(args, device, shards, cp.shard(dout, None, args.layout).to(device), causal, None)
            gathered = cp.unshard(out, None, args.layout)
            rec = {"S": S, "causal": causal, "P": world, "tp_ms": tp * 1e3, "heads": args.heads, "kv_heads": hkv,
                   "head_dim": args.head_dim, "batch": args.batch, "dtype": args.dtype, "layout": args.layout,
                   "comm": args.comm}
            if rank == 0 and ref is not None:
                diff = (gathered.float() - ref.float()).abs().max().item()
                eff = t1 / (world * tp)
                rec.update(t1_ms=t1 * 1e3, efficiency=eff, max_abs_diff_vs_single=diff)
                rows.append([S, int(causal), world, f"{t1 * 1e3:.2f}", f"{tp * 1e3:.2f}", f"{tp / t1:.3f}",
                             f"{100 * eff:.1f}%", f"{diff:.2e}"])
            elif rank == 0:
                rows.append([S, int(causal), world, "-", f"{tp * 1e3:.2f}", "-", "-", "-"])
            records.append(rec)
            del shards, out, gathered
    if rank == 0:
        print_table(f"ring attention forward+backward, {args.dtype}, {args.heads}/{hkv} heads, hd {args.head_dim}, "
                    f"batch {args.batch}, layout {args.layout}, comm {args.comm}, {device.type}",
                    ["S", "causal", "P", "T1 ms", "TP ms", "TP/T1", "efficiency", "max|ring-single|"], rows)
        write_json("context_parallel", {"environment": environment(device.type), "world_size": world,
                                        "backend": backend, "results": records})
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
