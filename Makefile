# torch_oss: two commands for a new user.
#   make bench   install what is missing (torch included), build, run the comparison benchmark
#                (on the GPU if one is visible, else on the CPU)
#   make test    install what is missing, build, run the whole test suite
PYTHON ?= python3
PIP := $(PYTHON) -m pip

.PHONY: deps build test bench gpu-check clean

deps:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install torch
	$(PIP) install -q -r requirements-dev.txt

build: deps
	$(PIP) install --no-build-isolation --no-deps -e .
	@$(PYTHON) -c "import torch_oss; print('torch_oss build:', torch_oss.build_info())"

test: build
	$(PYTHON) -m pytest tests -q

bench: build
	$(PYTHON) bench/run.py

# On a GPU machine with torch preinstalled and no network (see scripts/gpu_check.sh).
gpu-check:
	bash scripts/gpu_check.sh

clean:
	rm -rf build *.egg-info torch_oss/_C*.so csrc/cuda/attention/generated results
