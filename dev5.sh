export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 PYTHONUNBUFFERED=1 TORCH_OSS_HEAD_DIMS=64
python3 setup.py -q build_ext --inplace > /tmp/b.log 2>&1 || tail -20 /tmp/b.log
python3 -m pytest -q -rs -p no:cacheprovider "tests/test_cross_entropy.py::test_linear_cross_entropy_peak_memory_cuda" "tests/test_dropout.py::test_cuda_graph_replays_draw_new_masks" 2>&1 | tail -4
