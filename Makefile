# Developer entry points.  `make test` is what CI runs (.ci/run).
#   make venv   create .venv and install the package editable with its dev extras
#   make test   run the test suite (without the tests marked slow)
#   make test-all  run every test, slow ones included
#   make demo   run the demo (python -m tvm_rtask.demo)
#   make lint   ruff check
# The install is redone only when pyproject.toml, CMakeLists.txt or src/ change (stamp file).

PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.tvm-rtask-installed
INSTALL_DEPS := pyproject.toml CMakeLists.txt $(wildcard src/*)

.PHONY: venv test test-all demo lint clean

venv: $(STAMP)

$(VPY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(INSTALL_DEPS) | $(VPY)
	$(VPY) -m pip install -e ".[dev]"
	touch $@

# One pytest-xdist worker per core, at most PYTEST_WORKERS_MAX (each worker holds its own TVM
# builds in memory); tests that share a costly module fixture carry an xdist_group mark.
PYTEST_WORKERS_MAX ?= 8
PYTEST_PARALLEL := -n auto --maxprocesses $(PYTEST_WORKERS_MAX) --dist loadgroup

test: venv
	$(VPY) -m pytest -q -m "not slow" $(PYTEST_PARALLEL)

test-all: venv
	$(VPY) -m pytest -q $(PYTEST_PARALLEL)

demo: venv
	$(VPY) -m tvm_rtask.demo

lint: venv
	$(VPY) -m ruff check .

clean:
	rm -rf build dist $(STAMP)

# The GPU kit (docs/gpu.md), `python -m bench <command>` run from this directory: on the GPU
# machine after `source .gpu/b/setup.sh` (no .venv there: python3), here a dry run.
# `make gpu-check`: the gpu-marked tests, resumable (ARGS="--tests ... --deadline 200").
GPU_PY ?= $(if $(wildcard $(VPY)),$(VPY),python3)

.PHONY: gpu-check
gpu-check:
	$(GPU_PY) -m bench gpu-check $(ARGS)

# One GPU window (issue 26, docs/gpu.md): `make gpu-pack` here (no GPU needed) makes .gpu/a and
# .gpu/b; on the GPU machine `source .gpu/b/setup.sh && make gpu-window`. Without a GPU,
# `make gpu-window ARGS="--out DIR"` is the dry run (GPU ABSENT).
.PHONY: gpu-pack gpu-window
gpu-pack:
	$(GPU_PY) -m bench gpu-pack $(ARGS)

gpu-window:
	$(GPU_PY) -m bench gpu-window $(ARGS)
