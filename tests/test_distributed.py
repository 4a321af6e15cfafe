"""torch_oss.distributed (context parallelism): on the CPU with gloo, and on
GPUs with NCCL (one GPU per rank).

Each test spawns one process group (2 or 4 processes, torch.multiprocessing
with the "spawn" start method, file:// rendezvous in tmp_path) that runs a
batch of cases. The inputs are drawn here, in the test process, and handed to
the workers; each worker shards them, runs ring_attention (or the all-gather
variant) forward and backward on its shard, and rank 0 writes the unsharded
outputs, lse and gradients back. They are then judged here by the tolerance
rule against the same unsharded computation in float64 (ref64), with
single-process torch_oss.attention on the full sequence in the test dtype as
the peer.
"""

import datetime
import os
import sys
import traceback

import pytest
import torch
import torch.multiprocessing as mp

from _util import ATTENTION_ATOL, assert_tolerance, attention_reference, awkward_randn

import torch_oss

# ---------------------------------------------------------------------------
# Worker side
# ---------------------------------------------------------------------------


def _init(rank, world, init_file, backend="gloo"):
    import torch.distributed as dist

    torch.set_num_threads(1)
    kw = {}
    if backend == "nccl":
        torch.cuda.set_device(rank)
        kw["device_id"] = torch.device("cuda", rank)
    # a timeout, so that a hang in the ring fails the test instead of stalling it
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60), **kw)


def _finish(rank, result_file, payload):
    """Rank 0 saves the results; every rank then leaves the group together
    and exits at once. Skipping the interpreter's teardown: on the 2-core CI
    machine about one run in ten of the two-rank model test aborted there
    ("terminate called without an active exception", a thread destroyed
    while joinable) after its results were saved and the group destroyed,
    which failed the test for nothing it checks."""
    import torch.distributed as dist

    if rank == 0:
        torch.save(payload, result_file)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _report_error(rank, result_file):
    """Leaves the traceback where the spawning test reads it."""
    with open(f"{result_file}.rank{rank}.err", "w") as f:
        f.write(traceback.format_exc())


def _run_case(case, group, device="cpu"):
    import torch_oss.distributed as cp

    import torch.distributed as dist

    layout, comm = case["layout"], case["comm"]
    q, k, v, dout = (cp.shard(case[n].to(device), group, layout) for n in ("q", "k", "v", "dout"))
    q.requires_grad_(True)
    k.requires_grad_(True)
    v.requires_grad_(True)
    sinks = None if case["sinks"] is None else case["sinks"].to(device).requires_grad_(True)
    out, lse = cp.ring_attention(q, k, v, group=group, is_causal=case["causal"], scale=case["scale"],
                                 layout=layout, return_lse=True, enable_gqa=case["gqa"], comm=comm,
                                 window_size=case["window"], softcap=case["softcap"], sinks=sinks)
    out.backward(dout)
    res = {n: cp.unshard(t, group, layout).cpu() for n, t in
           (("out", out), ("lse", lse), ("dq", q.grad), ("dk", k.grad), ("dv", v.grad))}
    if sinks is not None:  # each rank's share of the replicated sinks' gradient, summed over the group
        dist.all_reduce(sinks.grad, group=group)
        res["dsinks"] = sinks.grad.cpu()
    res["out_dtype"] = out.dtype
    res["lse_dtype"] = lse.dtype
    return res


def _expect_error(fn, exc_type):
    try:
        fn()
    except exc_type as exc:
        return str(exc)
    except Exception as exc:  # the wrong kind of error: reported with its type
        return f"WRONG {type(exc).__name__}: {exc}"
    return "NO ERROR"


def _error_cases(rank, world):
    import torch.distributed as dist

    import torch_oss.distributed as cp

    x = torch.randn(1, 2, 8, 4)
    msgs = {
        "layout": _expect_error(lambda: cp.ring_attention(x, x, x, layout="striped"), ValueError),
        "comm": _expect_error(lambda: cp.ring_attention(x, x, x, comm="tree"), ValueError),
        "dims": _expect_error(lambda: cp.ring_attention(x[0], x[0], x[0]), ValueError),
        "dtype": _expect_error(lambda: cp.ring_attention(x, x.double(), x), TypeError),
        "gqa": _expect_error(lambda: cp.ring_attention(x, x[:, :1], x[:, :1]), ValueError),
        "odd_zigzag": _expect_error(lambda: cp.ring_attention(x[:, :, :7], x[:, :, :7], x[:, :, :7]), ValueError),
        "shard_len": _expect_error(lambda: cp.shard(torch.randn(1, 2, 6, 4), layout="zigzag"), ValueError),
        "softcap": _expect_error(lambda: cp.ring_attention(x, x, x, softcap=-1.0), ValueError),
        "sinks": _expect_error(lambda: cp.ring_attention(x, x, x, sinks=torch.zeros(3)), ValueError),
        "window": _expect_error(lambda: cp.ring_attention(x, x, x, window_size=(-2, 0)), ValueError),
    }
    # shard lengths that differ across ranks: every rank must raise (not hang)
    L = 8 if rank == 0 else 10
    y = torch.randn(1, 2, L, 4)
    msgs["uneven"] = _expect_error(lambda: cp.ring_attention(y, y, y), ValueError)
    dist.barrier()
    return msgs


def _worker(rank, world, init_file, cases_file, result_file):
    try:
        _init(rank, world, init_file)
        import torch.distributed as dist

        import torch_oss.distributed as cp

        spec = torch.load(cases_file)
        results = {"cases": [], "errors": None, "subgroup": [], "roundtrip": {}, "positions": {}}
        for case in spec["cases"]:
            results["cases"].append(_run_case(case, None))
        # groups that are not the world: singletons (plain attention) and, with
        # 4 ranks, pairs of ranks {0, 2} and {1, 3} (global ranks != group ranks)
        singles = [dist.new_group([r]) for r in range(world)]
        for case in spec["single"]:
            results["subgroup"].append(_run_case(case, singles[rank]))
        if world == 4:
            pairs = [dist.new_group([0, 2]), dist.new_group([1, 3])]
            for case in spec["pair"]:
                results.setdefault("pair", []).append(_run_case(case, pairs[rank % 2]))
        full = spec["roundtrip"]
        for layout in cp.LAYOUTS:
            for dim in (2, 0, -1):
                s = cp.shard(full, None, layout, dim)
                results["roundtrip"][(layout, dim)] = (s, cp.unshard(s, None, layout, dim))
            results["positions"][layout] = cp.unshard(cp.position_ids(spec["seq_len"], None, layout), None, layout,
                                                      dim=0)
            results["positions"][(layout, rank)] = cp.position_ids(spec["seq_len"], None, layout)
        results["errors"] = _error_cases(rank, world)
        # every rank's own pieces for the rank-dependent checks
        gathered = [None] * world
        dist.all_gather_object(gathered, {"roundtrip": results["roundtrip"], "positions": results["positions"],
                                          "errors": results["errors"]})
        results["per_rank"] = gathered
        _finish(rank, result_file, results)
    except Exception:
        _report_error(rank, result_file)
        raise


def _nccl_worker(rank, world, init_file, cases_file, result_file):
    """The cases alone, on GPU `rank` over NCCL."""
    try:
        _init(rank, world, init_file, "nccl")
        spec = torch.load(cases_file)
        results = {"cases": [_run_case(case, None, f"cuda:{rank}") for case in spec["cases"]]}
        _finish(rank, result_file, results)
    except Exception:
        _report_error(rank, result_file)
        raise


def _spawn(world, tmp_path, spec, worker=_worker):
    cases_file = tmp_path / "cases.pt"
    result_file = tmp_path / "result.pt"
    torch.save(spec, cases_file)
    try:
        mp.start_processes(worker, args=(world, str(tmp_path / "rdzv"), str(cases_file), str(result_file)),
                           nprocs=world, start_method="spawn", join=True)
    except Exception:
        errs = [p.read_text() for p in sorted(tmp_path.glob("result.pt.rank*.err"))]
        pytest.fail("worker failed:\n" + "\n".join(errs))
    return torch.load(result_file, weights_only=False)


# ---------------------------------------------------------------------------
# Cases and their single-process judgement
# ---------------------------------------------------------------------------


def _case(world, dtype, layout, causal, hq=2, hkv=2, local=16, d=16, dv=None, comm="ring", scale=None, softcap=0.0,
          sinks=False, window=(-1, -1)):
    S = local * world
    dv = d if dv is None else dv
    q = awkward_randn((1, hq, S, d), dtype, "cpu", scale=2.0, outliers=False)
    k = awkward_randn((1, hkv, S, d), dtype, "cpu", scale=2.0, outliers=False)
    v = awkward_randn((1, hkv, S, dv), dtype, "cpu", scale=2.0, outliers=False)
    dout = awkward_randn((1, hq, S, dv), dtype, "cpu", scale=2.0, outliers=False)
    # sinks: float32 values (the kernels hold sinks in float32) in the inputs' dtype
    s = (torch.randn(hq) * 2).to(dtype).float().to(dtype) if sinks else None
    return dict(q=q, k=k, v=v, dout=dout, layout=layout, causal=causal, gqa=hq != hkv, comm=comm, scale=scale,
                softcap=softcap, sinks=s, window=window,
                name=f"P={world} {comm} {layout} {'causal' if causal else 'full'} {dtype} Hq={hq} Hkv={hkv} "
                     f"L={local} D={d} Dv={dv} scale={scale} window={window} softcap={softcap} sinks={sinks}")


def _judge(case, got, device="cpu"):
    """The unsharded result `got` against float64, with single-device
    torch_oss.attention on `device` as the peer."""
    name = case["name"]
    dtype = case["q"].dtype
    assert got["out_dtype"] == dtype, f"{name}: out dtype {got['out_dtype']}"
    assert got["lse_dtype"] == (torch.float64 if dtype == torch.float64 else torch.float32), name
    leaves64 = [case[n].detach().to(torch.float64, copy=True).requires_grad_(True) for n in ("q", "k", "v")]
    sinks = case["sinks"]
    s64 = None if sinks is None else sinks.detach().double().requires_grad_(True)
    if case["softcap"] or sinks is not None or case["window"] != (-1, -1):
        from test_variants import variant_reference

        out64, lse64 = variant_reference(*leaves64, is_causal=case["causal"], scale=case["scale"],
                                         window_size=case["window"], softcap=case["softcap"], sinks=s64)
    else:
        out64, lse64 = attention_reference(*leaves64, is_causal=case["causal"], scale=case["scale"],
                                           enable_gqa=case["gqa"])
    out64.backward(case["dout"].double())
    leaves = [case[n].detach().to(device, copy=True).requires_grad_(True) for n in ("q", "k", "v")]
    s_peer = None if sinks is None else sinks.detach().to(device).requires_grad_(True)
    peer, peer_lse = torch_oss.attention_with_lse(*leaves, is_causal=case["causal"], scale=case["scale"],
                                                  enable_gqa=case["gqa"], window_size=case["window"],
                                                  softcap=case["softcap"], sinks=s_peer)
    peer.backward(case["dout"].to(device))
    atol = ATTENTION_ATOL[dtype]
    assert_tolerance(f"{name} out", got["out"], out64, peer, atol)
    assert_tolerance(f"{name} lse", got["lse"], lse64, peer_lse, ATTENTION_ATOL[torch.float32]
                     if dtype in (torch.float16, torch.bfloat16) else atol)
    # 16-bit gradients are sums of several kernel calls' rounded partials (the
    # ring's blocks, the all-gather variant's chunks), rounded once more
    half = dtype in (torch.float16, torch.bfloat16)
    for n, ref, p in zip(("dq", "dk", "dv"), leaves64, leaves):
        assert_tolerance(f"{name} {n}", got[n], ref.grad, p.grad, atol, per_element_eps=half)
    if sinks is not None:
        # a sum over the ranks' rows in the accumulation dtype, cast to the sinks' dtype
        assert got["dsinks"].dtype == sinks.dtype, f"{name}: dsinks dtype {got['dsinks'].dtype}"
        assert_tolerance(f"{name} dsinks", got["dsinks"], s64.grad, s_peer.grad.cpu(), atol, per_element_eps=True)


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------


def _seeded_cases(seed, builders):
    torch.manual_seed(seed)
    return [b() for b in builders]


def _rank_positions(layout, n, rank, world):
    """The sequence positions rank `rank` holds of n: one contiguous chunk, or
    zigzag's chunks rank and 2 * world - 1 - rank of 2 * world."""
    if layout == "contiguous":
        return torch.arange(rank * n // world, (rank + 1) * n // world)
    c = n // (2 * world)
    return torch.cat([torch.arange(rank * c, (rank + 1) * c),
                      torch.arange((2 * world - 1 - rank) * c, (2 * world - rank) * c)])


def _check_common(world, spec, res):
    for case, got in zip(spec["cases"], res["cases"]):
        _judge(case, got)
    for case, got in zip(spec["single"], res["subgroup"]):
        _judge(case, got)
    full = spec["roundtrip"]
    for r, mine in enumerate(res["per_rank"]):
        for (layout, dim), (s, back) in mine["roundtrip"].items():
            assert torch.equal(back, full), f"unshard(shard(x)) != x for {layout}, dim {dim}, rank {r}"
            d = dim % full.dim()
            idx = _rank_positions(layout, full.shape[d], r, world)
            assert torch.equal(s, full.index_select(d, idx)), f"shard of rank {r} ({layout}, dim {dim})"
        for layout in ("zigzag", "contiguous"):
            idx = _rank_positions(layout, spec["seq_len"], r, world)
            assert torch.equal(mine["positions"][(layout, r)], idx), f"position_ids of rank {r} ({layout})"
        for layout in ("zigzag", "contiguous"):
            assert torch.equal(mine["positions"][layout], torch.arange(spec["seq_len"]))
        errs = mine["errors"]
        for key, needle in (("layout", "layout="), ("comm", "comm="), ("dims", "4-D"), ("dtype", "k.dtype"),
                            ("gqa", "enable_gqa"), ("odd_zigzag", "even"), ("shard_len", "divisible"),
                            ("uneven", "differs across ranks"), ("softcap", "softcap="), ("sinks", "sinks must"),
                            ("window", "window_size=")):
            assert needle in errs[key], f"rank {r}, error case {key!r}: {errs[key]!r}"


def test_two_ranks(tmp_path):
    W = 2
    f32, bf16 = torch.float32, torch.bfloat16
    builders = [
        lambda: _case(W, f32, "zigzag", True),
        lambda: _case(W, f32, "zigzag", False, hq=3, hkv=1, d=16, dv=24),
        lambda: _case(W, f32, "contiguous", True, hq=4, hkv=2, local=17 * 2, scale=0.3),
        lambda: _case(W, f32, "contiguous", False, hq=4, hkv=2),
        lambda: _case(W, bf16, "zigzag", True, hq=4, hkv=2, local=24, d=32),
        lambda: _case(W, bf16, "contiguous", True, local=24),
        lambda: _case(W, f32, "zigzag", True, hq=4, hkv=2, comm="allgather"),
        lambda: _case(W, bf16, "contiguous", True, hq=4, hkv=1, comm="allgather"),
        lambda: _case(W, f32, "zigzag", False, hq=3, hkv=3, comm="allgather"),
        lambda: _case(W, torch.float64, "zigzag", True, hq=2, hkv=1),
        lambda: _case(W, f32, "zigzag", True, hq=4, hkv=2, softcap=3.0, sinks=True),
        lambda: _case(W, f32, "contiguous", False, sinks=True),
        lambda: _case(W, bf16, "zigzag", True, hq=4, hkv=2, local=24, d=32, softcap=5.0, sinks=True),
        lambda: _case(W, f32, "zigzag", True, hq=4, hkv=2, comm="allgather", softcap=3.0, sinks=True),
        lambda: _case(W, torch.float64, "contiguous", True, hq=2, hkv=1, softcap=2.0),
        # sliding windows on the global positions: narrower than a zigzag chunk
        # (8 rows here), across chunks, two-sided, one-sided right, the diagonal alone
        lambda: _case(W, f32, "zigzag", True, hq=4, hkv=2, window=(5, -1)),
        lambda: _case(W, f32, "zigzag", True, window=(13, 0)),
        lambda: _case(W, f32, "contiguous", False, hq=3, hkv=1, window=(7, 3)),
        lambda: _case(W, f32, "zigzag", False, window=(-1, 5)),
        lambda: _case(W, torch.float64, "contiguous", True, window=(0, 0)),
        lambda: _case(W, bf16, "zigzag", True, hq=4, hkv=2, local=24, d=32, window=(9, 0), softcap=5.0, sinks=True),
        lambda: _case(W, f32, "zigzag", True, hq=4, hkv=2, comm="allgather", window=(6, 0)),
        lambda: _case(W, f32, "zigzag", False, comm="allgather", window=(4, 11), sinks=True),
    ]
    spec = {"cases": _seeded_cases(0, builders),
            # a group of one rank: plain attention over the local sequence
            "single": _seeded_cases(1, [lambda: _case(1, f32, "zigzag", True, hq=4, hkv=2),
                                        lambda: _case(1, f32, "contiguous", False, comm="allgather")]),
            "roundtrip": torch.randn(4 * W, 3, 4 * W, 4 * W), "seq_len": 6 * W}
    res = _spawn(W, tmp_path, spec)
    _check_common(W, spec, res)


def test_four_ranks(tmp_path):
    W = 4
    f32, bf16 = torch.float32, torch.bfloat16
    builders = [
        lambda: _case(W, f32, "zigzag", True, hq=4, hkv=2),
        lambda: _case(W, f32, "contiguous", True, hq=3, hkv=1, dv=24),
        lambda: _case(W, bf16, "zigzag", True, local=24),
        lambda: _case(W, f32, "zigzag", False),
        lambda: _case(W, f32, "zigzag", True, hq=4, hkv=2, comm="allgather"),
        lambda: _case(W, f32, "contiguous", True, comm="allgather"),
        lambda: _case(W, f32, "zigzag", True, hq=4, hkv=2, softcap=4.0, sinks=True),
        lambda: _case(W, f32, "zigzag", True, hq=4, hkv=2, window=(11, 0)),
        lambda: _case(W, f32, "contiguous", False, window=(20, 2)),
    ]
    spec = {"cases": _seeded_cases(2, builders),
            "single": [],
            "pair": _seeded_cases(3, [lambda: _case(2, f32, "zigzag", True, hq=4, hkv=2)]),
            "roundtrip": torch.randn(2 * W, 3, 2 * W, 4 * W), "seq_len": 6 * W}
    res = _spawn(W, tmp_path, spec)
    _check_common(W, spec, res)
    # groups {0, 2} and {1, 3}: rank 0 reports group {0, 2}'s result
    _judge(spec["pair"][0], res["pair"][0])


def _nccl_cases(world):
    f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16
    return [
        lambda: _case(world, bf16, "zigzag", True, hq=8, hkv=2, local=256, d=128),
        lambda: _case(world, bf16, "zigzag", False, hq=4, hkv=4, local=192, d=64),
        lambda: _case(world, f16, "contiguous", True, hq=4, hkv=2, local=130, d=64),
        lambda: _case(world, f16, "contiguous", False, hq=2, hkv=1, local=64, d=128, scale=0.2),
        lambda: _case(world, bf16, "zigzag", True, hq=4, hkv=1, local=128, d=128, comm="allgather"),
        lambda: _case(world, f32, "zigzag", True, hq=4, hkv=2, local=64, d=32),
        lambda: _case(world, bf16, "zigzag", True, hq=2, hkv=2, local=96, d=256),
        lambda: _case(world, bf16, "zigzag", True, hq=4, hkv=2, local=128, d=64, softcap=20.0, sinks=True),
        lambda: _case(world, bf16, "zigzag", True, hq=4, hkv=2, local=256, d=64, window=(100, 0)),
        lambda: _case(world, f32, "contiguous", False, hq=2, hkv=2, local=64, d=32, window=(40, 9)),
    ]


@pytest.mark.cuda
@pytest.mark.parametrize("world", [1, 2])
def test_nccl_ranks_on_gpus(tmp_path, world):
    """The ring over NCCL, one GPU per rank (CUDA streams, P2P and the GPU
    kernels), judged with single-GPU torch_oss.attention as the peer; one rank
    (plain attention through the module) on any GPU machine."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} CUDA GPU(s)")
    spec = {"cases": _seeded_cases(5 + world, _nccl_cases(world))}
    res = _spawn(world, tmp_path, spec, _nccl_worker)
    for case, got in zip(spec["cases"], res["cases"]):
        _judge(case, got, "cuda")


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_window_plan_covers_each_visible_pair_once(layout, world):
    """The ring's block plan under a window: over all source ranks, the pairs
    the blocks compute (each block's own causal rule or shifted window) are
    exactly this rank's visible pairs of the global sequence, each once."""
    from torch_oss.distributed import _plan

    torch.manual_seed(world)
    L = 12  # local rows: zigzag chunks of 6
    n = L * world
    windows = [(0, 0), (1, -1), (5, 0), (6, 6), (-1, 3), (7, 2), (13, 0), (2, 20), (-1, 0), (n, n)]
    for left, right in windows:
        for causal in (False, True):
            r_eff = 0 if causal else right
            for rank in range(world):
                pos = _rank_positions(layout, n, rank, world).tolist()
                want = {(pos[i], j) for i in range(L) for j in range(n)
                        if (left < 0 or pos[i] - j <= left) and (r_eff < 0 or j - pos[i] <= r_eff)}
                got = []
                for src in range(world):
                    kpos = _rank_positions(layout, n, src, world).tolist()
                    for qs, ql, ks, kl, blk_causal, win in _plan(layout, causal, rank, src, L, world, (left, right)):
                        assert 0 <= qs and qs + ql <= L and 0 <= ks and ks + kl <= L and ql > 0 and kl > 0
                        for i in range(ql):
                            for j in range(kl):
                                d = i - j
                                if blk_causal and j > i:
                                    continue
                                if win is not None and ((win[0] >= 0 and d > win[0]) or (win[1] >= 0 and -d > win[1])):
                                    continue
                                got.append((pos[qs + i], kpos[ks + j]))
                case = f"{layout} P={world} rank {rank} window ({left}, {right}) causal={causal}"
                assert len(got) == len(set(got)), f"{case}: a pair computed twice"
                assert set(got) == want, f"{case}: missing {sorted(want - set(got))[:5]}, extra {sorted(set(got) - want)[:5]}"


def test_uninitialised_group():
    import torch.distributed as dist

    import torch_oss.distributed as cp

    if dist.is_initialized():
        pytest.skip("a default process group exists in this process")
    x = torch.randn(1, 2, 8, 4)
    with pytest.raises(RuntimeError, match="group.*not initialised"):
        cp.ring_attention(x, x, x)
    with pytest.raises(RuntimeError, match="not initialised"):
        cp.shard(x)
    with pytest.raises(ValueError, match="layout="):
        cp.position_ids(8, layout="ring")


def test_import_is_lazy():
    import subprocess
    import sys

    code = "import sys, torch_oss; assert 'torch_oss.distributed' not in sys.modules; torch_oss.distributed.shard"
    env = dict(os.environ)
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


# ---------------------------------------------------------------------------
# Hugging Face: tiny Llama and Mistral models with attn_implementation="oss" under
# ring_attention_context
# ---------------------------------------------------------------------------


def _hf_classes(family):
    import transformers

    name = {"llama": "Llama", "mistral": "Mistral", "gemma2": "Gemma2"}[family]
    return getattr(transformers, f"{name}Config"), getattr(transformers, f"{name}ForCausalLM")


def _hf_model(cfg_kwargs, state, dtype, family="llama"):
    config_cls, model_cls = _hf_classes(family)
    model = model_cls(config_cls(**cfg_kwargs)).to(dtype)
    model.load_state_dict({k: v.to(dtype) for k, v in state.items()})
    model.eval()  # no dropout; gradients still flow
    model.set_attn_implementation("oss")
    return model


def _hf_worker(rank, world, init_file, spec_file, result_file):
    try:
        _init(rank, world, init_file)
        import torch.distributed as dist

        import torch_oss.distributed as cp

        spec = torch.load(spec_file)
        torch_oss.register_transformers()
        model = _hf_model(spec["config"], spec["state"], torch.float32, spec["family"])
        S = spec["ids"].shape[1]
        with cp.ring_attention_context(None, "zigzag"):
            ids = cp.shard(spec["ids"], None, "zigzag", dim=1)
            logits = model(ids, position_ids=cp.position_ids(S, None, "zigzag")[None], use_cache=False).logits
            (logits * cp.shard(spec["weight"], None, "zigzag", dim=1)).sum().backward()
        grads = {}
        for name, p in model.named_parameters():
            if name in spec["grad_names"]:
                dist.all_reduce(p.grad)  # each rank holds its tokens' share of the gradient
                grads[name] = p.grad
        logits_full = cp.unshard(logits.detach(), None, "zigzag", dim=1)
        _finish(rank, result_file, {"logits": logits_full, "grads": grads})
    except Exception:
        _report_error(rank, result_file)
        raise


@pytest.mark.parametrize("family", ["llama", "mistral", "gemma2"])
def test_transformers_two_ranks(tmp_path, family):
    """A tiny model under ring_attention_context on two ranks against the
    whole sequence in one process: Mistral with a sliding window of 16 tokens
    over 64 (the ring applies it on the global positions), Gemma 2 with logit
    softcapping and sliding layers mixed with full ones."""
    pytest.importorskip("transformers")
    config_cls, model_cls = _hf_classes(family)

    torch_oss.register_transformers()
    cfg = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=256)
    if family == "mistral":
        cfg["sliding_window"] = 16
    elif family == "gemma2":
        cfg.update(head_dim=16, sliding_window=12, attn_logit_softcapping=2.0)
    torch.manual_seed(4)
    state = model_cls(config_cls(**cfg)).state_dict()
    S = 64
    ids = torch.randint(0, 128, (1, S))
    weight = torch.randn(1, S, 128)
    grad_names = ["model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight",
                  "model.layers.1.self_attn.v_proj.weight", "model.embed_tokens.weight"]
    spec_file, result_file = tmp_path / "spec.pt", tmp_path / "result.pt"
    torch.save({"config": cfg, "state": state, "ids": ids, "weight": weight, "grad_names": grad_names,
                "family": family}, spec_file)
    try:
        mp.start_processes(_hf_worker, args=(2, str(tmp_path / "rdzv"), str(spec_file), str(result_file)), nprocs=2,
                           start_method="spawn", join=True)
    except Exception:
        pytest.fail("worker failed:\n" + "\n".join(p.read_text() for p in sorted(tmp_path.glob("*.err"))))
    got = torch.load(result_file)

    def run(dtype):
        model = _hf_model(cfg, state, dtype, family)
        logits = model(ids).logits
        (logits * weight.to(dtype)).sum().backward()
        params = dict(model.named_parameters())
        return logits.detach(), {n: params[n].grad for n in grad_names}

    ref_logits, ref_grads = run(torch.float64)
    peer_logits, peer_grads = run(torch.float32)
    assert_tolerance(f"{family} logits", got["logits"], ref_logits, peer_logits, None)
    for n in grad_names:
        assert_tolerance(f"{family} {n} grad", got["grads"][n], ref_grads[n], peer_grads[n], None)
