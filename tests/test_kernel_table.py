"""The CUDA attention kernels' dispatch table, as the generator writes it
(csrc/cuda/attention/generate_attention_kernels.py; no compiler needed).

Each compiled head dim runs, per kernel family, the smallest kernel compiled
for a head dim that covers it (the rest of the head is zero padding): the
Hopper forward and backward of the build's head dims, the decode and variant
kernels of their own fixed lists. A reduced build (TORCH_OSS_HEAD_DIMS) must
route a head dim to a kernel that build has, and every launcher the table
names must be defined in a generated file."""

import importlib.util
import pathlib
import re

import pytest

GENERATOR = pathlib.Path(__file__).resolve().parents[1] / "csrc" / "cuda" / "attention" / "generate_attention_kernels.py"

ROW = re.compile(r"\{(\d+), (OSS_\w+), \{(\w+), (\w+)\}, \{(\w+), (\w+)\}, (\d+), (\w+), (\d+), "
                 r"\{(\w+), (\w+)\}, \{(\w+), (\w+)\}, (\d+)\}")
TAGS = {"OSS_FLOAT16": "fp16", "OSS_BFLOAT16": "bf16"}


def load_generator():
    spec = importlib.util.spec_from_file_location("generate_attention_kernels", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def smallest_covering(dims, hd):
    return min((d for d in dims if d >= hd), default=None)


def table(gen, dims, sm90, tmp_path):
    paths = gen.generate(dims, str(tmp_path), sm90=sm90)
    dispatch = (tmp_path / "attention_dispatch.cu").read_text()
    rows = [m.groups() for m in ROW.finditer(dispatch)]
    defined = set()
    for p in paths:
        defined.update(re.findall(r'extern "C" oss_status (\w+)\(const oss_attn_args \*a', pathlib.Path(p).read_text()))
    return dispatch, rows, defined


BUILDS = [
    None,  # the default head dims
    [80, 128],  # 80 without 96: the Hopper kernels of 128
    [96],
    [160, 256],  # 160 without 192: the Hopper forward of 256
    [32, 64],
]


@pytest.mark.parametrize("sm90", [True, False], ids=["sm90", "no_sm90"])
@pytest.mark.parametrize("dims", BUILDS, ids=lambda d: "default" if d is None else ",".join(map(str, d)))
def test_each_head_dim_runs_the_smallest_compiled_kernel_that_covers_it(dims, sm90, tmp_path):
    gen = load_generator()
    dims = sorted(gen.DEFAULT_HEAD_DIMS if dims is None else dims)
    dispatch, rows, defined = table(gen, dims, sm90, tmp_path)
    assert len(rows) == 2 * len(dims), f"expected a row per head dim and dtype, found {len(rows)}"
    hopper_fwd = [d for d in dims if d in gen.SM90_FORWARD_HEAD_DIMS] if sm90 else []
    hopper_bwd = [d for d in dims if d in gen.SM90_BACKWARD_HEAD_DIMS] if sm90 else []
    assert f'hopper_head_dims_list(void) {{ return "{",".join(map(str, hopper_fwd))}"; }}' in dispatch
    for (hd, enum, fwd, fwd90, bwd, bwd90, bwd90_dim, dec, dec_dim, fvar, fvar90, bvar, bvar90, var_dim) in rows:
        hd, tag = int(hd), TAGS[enum]
        assert fwd == f"oss_attn_fwd_mma_hd{hd}_{tag}" and bwd == f"oss_attn_bwd_mma_hd{hd}_{tag}"
        want = smallest_covering(hopper_fwd, hd)
        assert fwd90 == (f"oss_attn_fwd_sm90_hd{want}_{tag}" if want else "NULL"), f"hd {hd} Hopper forward"
        want = smallest_covering(hopper_bwd, hd)
        assert bwd90 == (f"oss_attn_bwd_sm90_hd{want}_{tag}" if want else "NULL"), f"hd {hd} Hopper backward"
        assert int(bwd90_dim) == (want or 0)
        want = smallest_covering(gen.DECODE_HEAD_DIMS, hd)
        assert (dec, int(dec_dim)) == (f"oss_attn_dec_mma_hd{want}_{tag}", want), f"hd {hd} decode"
        want = smallest_covering(gen.VARIANT_HEAD_DIMS, hd)
        assert int(var_dim) == want and fvar == f"oss_attn_fwd_var_hd{want}_{tag}", f"hd {hd} variants"
        assert bvar == f"oss_attn_bwd_var_hd{want}_{tag}"
        hop = sm90 and want in gen.SM90_FORWARD_HEAD_DIMS
        assert fvar90 == (f"oss_attn_fwd_var_sm90_hd{want}_{tag}" if hop else "NULL"), f"hd {hd} Hopper variants"
        hop = sm90 and want in gen.SM90_BACKWARD_HEAD_DIMS
        assert bvar90 == (f"oss_attn_bwd_var_sm90_hd{want}_{tag}" if hop else "NULL")
        named = [n for n in (fwd, fwd90, bwd, bwd90, dec, fvar, fvar90, bvar, bvar90) if n != "NULL"]
        missing = [n for n in named if n not in defined]
        assert not missing, f"hd {hd}: the table names launchers no generated file defines: {missing}"
