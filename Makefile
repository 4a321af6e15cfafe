# torch_oss: two commands for a new user.
#   make bench   install what is missing (torch included), build, run the comparison benchmark
#                (on the GPU if one is visible, else on the CPU)
#   make test    install what is missing, build, run the whole test suite
#
# The build is incremental: `python3 setup.py build_ext --inplace` keeps its objects
# under build/ and rebuilds the extension only when a source, a header, setup.py or a
# build knob changed (then ninja recompiles only what the change touches), so a
# second `make` on an unchanged tree starts its work within seconds. The package is
# made importable once, by an editable install that builds nothing.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
# Prints what the build compiled; fails unless `import torch_oss` finds this tree.
export BUILD_INFO := import os, sys, torch_oss; \
  assert os.path.dirname(os.path.abspath(torch_oss.__file__)) == sys.argv[1], torch_oss.__file__; \
  print("torch_oss build:", torch_oss.build_info())

.PHONY: deps build test bench gpu-check clean

deps:
	@$(PYTHON) -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)" || $(PIP) install torch
	$(PIP) install -q -r requirements-dev.txt

# The import check runs outside the tree, so it sees what an installed torch_oss resolves to.
build: deps
	$(PYTHON) setup.py -q build_ext --inplace
	@(cd / && $(PYTHON) -c "$$BUILD_INFO" "$(CURDIR)/torch_oss" 2>/dev/null) \
		|| { TORCH_OSS_NO_EXTENSION=1 $(PIP) install -q --no-build-isolation --no-deps -e . \
		     && $(PYTHON) -c "$$BUILD_INFO" "$(CURDIR)/torch_oss"; }

test: build
	$(PYTHON) -m pytest tests -q

bench: build
	$(PYTHON) bench/run.py

# On a GPU machine with torch preinstalled and no network (see docs/testing.md).
gpu-check:
	bash scripts/gpu_check.sh

clean:
	rm -rf build *.egg-info torch_oss/_C*.so csrc/cuda/attention/generated results
