"""Timing, ceilings and result files shared by the benchmarks (docs/performance.md):
CUDA-event medians after warm-up, the device-to-device copy ceiling measured in
the same run, a table on stdout, JSON and PNG plots under a results folder."""

import contextlib
import json
import os
import platform
import statistics
import subprocess
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# The dtypes the benchmarks take by name: torch's names, or the short forms.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def dtype_list(text):
    """argparse type of a --dtypes option: comma-separated names (torch's or
    fp32/bf16/fp16) to torch's names; an unknown one is argparse's error."""
    import argparse
    names = [DTYPE_ALIASES.get(name.strip(), name.strip()) for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in DTYPES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected comma-separated dtypes among {', '.join([*DTYPES, *DTYPE_ALIASES])}")
    return names


def results_dir():
    path = os.environ.get("TORCH_OSS_RESULTS", os.path.join(ROOT, "results"))
    os.makedirs(path, exist_ok=True)
    return path


def git_commit():
    """The tree's commit (+dirty); TORCH_OSS_COMMIT overrides it, for copies of a
    working tree whose git metadata is not the tree's own (the device machine's)."""
    if os.environ.get("TORCH_OSS_COMMIT"):
        return os.environ["TORCH_OSS_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "") if out.returncode == 0 else "unknown"
    except OSError:
        return "unknown"


def environment(device):
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "commit": git_commit(), "device": device,
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, sms=props.multi_processor_count,
                    l2_mb=getattr(props, "L2_cache_size", 0) / 2**20)
    else:
        info.update(cpu=platform.processor() or platform.machine(), threads=torch.get_num_threads())
    return info


def bench(fn, device, warmup_ms=25, rep_ms=100):
    """Median time of fn() in milliseconds."""
    return statistics.median(call_times_ms(fn, device, warmup_ms, rep_ms))


def bench_stats(fn, device, warmup_ms=25, rep_ms=100):
    """(median, trimmed mean) of fn()'s time in ms. The trimmed mean is the mean of
    the middle 80 % of the calls: CUDA events resolve ~0.5 us, so a median lands
    on one of those steps, and after an L2 flush single calls can fall into a
    fast and a slow group; the mean of many calls does neither."""
    ts = call_times_ms(fn, device, warmup_ms, rep_ms)
    return statistics.median(ts), trimmed_mean(ts)


def trimmed_mean(ts):
    """The mean of the middle 80 % of ts."""
    ts = sorted(ts)
    cut = len(ts) // 10
    mid = ts[cut:len(ts) - cut] or ts
    return sum(mid) / len(mid)


def time_rounds(fns, rounds, device, contexts=None, **timing):
    """{name: (median ms, [median of each round], trimmed-mean ms, [trimmed mean of
    each round])}: every round times every implementation once
    (bench_stats, with `timing`'s warmup_ms / rep_ms where given), in alternating
    order, so a drift of the GPU's clocks or of the memory system falls on all of
    them alike; each statistic is then the median over the rounds. contexts: name ->
    a context-manager factory entered around that implementation's timing (an SDPA
    backend, say)."""
    times = {name: ([], []) for name in fns}
    order = list(fns)
    for rnd in range(rounds):
        for name in (order if rnd % 2 == 0 else order[::-1]):
            with (contexts or {}).get(name, contextlib.nullcontext)():
                med, trimmed = bench_stats(fns[name], device, **timing)
            times[name][0].append(med)
            times[name][1].append(trimmed)
    return {name: (statistics.median(m), m, statistics.median(t), t) for name, (m, t) in times.items()}


def call_times_ms(fn, device, warmup_ms=25, rep_ms=100):
    """The time of each timed call of fn() in ms, after warm-up: on CUDA
    triton.testing.do_bench's (the L2 flushed before each call) or CUDA events."""
    if device == "cuda":
        try:
            import triton.testing

            return list(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="all"))
        except ImportError:
            return cuda_event_times_ms(fn, None, warmup_ms, rep_ms)
    fn()
    times = []
    deadline = time.perf_counter() + rep_ms / 1000
    while len(times) < 3 or (time.perf_counter() < deadline and len(times) < 50):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return times


def cuda_event_times_ms(fn, flush, warmup_ms=25, rep_ms=100):
    """The time of each timed call of fn() in ms: CUDA events around the call
    alone, after warm-up, with flush() (or nothing, for None) enqueued before
    each call, as do_bench does with its 256 MB write."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    start.record()
    for _ in range(5):
        fn()
    end.record()
    torch.cuda.synchronize()
    once = max(start.elapsed_time(end) / 5, 1e-3)
    for _ in range(max(1, int(warmup_ms / once))):
        fn()
    n = max(20, int(rep_ms / once))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for i in range(n):
        if flush is not None:
            flush()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return [a.elapsed_time(b) for a, b in zip(starts, ends)]


def kernel_breakdown_us(fn, calls=10):
    """The GPU's own time of each kernel that fn() launches, in us per call
    (a kernel's launches in one call summed, averaged over `calls` calls after
    one warm-up call), from torch.profiler's CUPTI records: {kernel name cut
    at its template arguments or parameters: us}."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            name = e.name.replace("void ", "").split("<")[0].split("(")[0].strip()[:60]
            out[name] = out.get(name, 0.0) + e.device_time / calls
    return out


def copy_bandwidth_gbs(device, nbytes=None):
    """Device-to-device copy ceiling in GB/s, counting bytes read + written."""
    nbytes = nbytes or (2**30 if device == "cuda" else 2**28)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    src.random_()
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src), device)
    del src, dst
    return 2 * nbytes / (ms * 1e-3) / 1e9


def print_table(title, header, rows):
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(header)] if rows else \
        [len(h) for h in header]
    print(f"\n{title}")
    print("  ".join(str(h).rjust(w) for h, w in zip(header, widths)))
    for r in rows:
        print("  ".join(str(c).rjust(w) for c, w in zip(r, widths)))


def write_json(name, payload):
    path = os.path.join(results_dir(), f"{name}.json")
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)
    print(f"wrote {path}")
    return path


def plot_lines(name, panels, xlabel, ylabel, logx=True, title=""):
    """panels: {panel title: {line label: [(x, y), ...]}} -> one PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return None
    n = len(panels)
    fig, axes = plt.subplots(1, n, figsize=(5.5 * n, 4.2), squeeze=False)
    for ax, (panel, lines) in zip(axes[0], panels.items()):
        for label, points in lines.items():
            points = [p for p in points if p[1] is not None]
            if points:
                xs, ys = zip(*sorted(points))
                ax.plot(xs, ys, marker="o", label=label)
        if logx:
            ax.set_xscale("log", base=2)
        ax.set_title(panel)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path = os.path.join(results_dir(), f"{name}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")
    return path
