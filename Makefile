# Everyday tasks. Every target sets up what it needs from the hash-locked requirements.lock.
PYTHON ?= $(shell tools/python312.sh)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.lock-sha256

.PHONY: env demo test test-source lint format wheel repro repro-aarch64 lock nix-wheels run-benchmarks clean

# The environment: exactly the hashes in requirements.lock (rebuilt when the lock changes).
env: $(STAMP)
$(STAMP): requirements.lock
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --require-hashes --no-deps \
		-r requirements.lock
	sha256sum requirements.lock > $(STAMP)

# The main job: an EP=2 forward + backward (on one GPU, both ranks share it), checked against a
# float64 dense formulation, through the built wheel (installed into .venv) so that a GPU gets its
# compiled kernels.
demo: wheel
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-index \
		--force-reinstall dist/mok-*.whl
	$(PY) -P tools/demo.py

# Build the wheel, install it into a fresh environment and run the whole suite against it.
test: wheel
	tools/test_wheel.sh

# Quick loop while editing: the suite against the source tree.
test-source: env
	PYTHONPATH=. $(VENV)/bin/pytest -q tests

wheel: env
	$(PY) -m build --wheel --no-isolation --outdir dist .

repro: env
	$(PY) tools/repro_check.py

# The aarch64 wheel (Grace hosts), cross-built here with the same nvcc and the pinned cross g++
# (Debian: g++-12-aarch64-linux-gnu), linking the aarch64 CUDA runtime the lock pins; two clean
# builds must match and auditwheel must accept the tag; the modules' libraries must resolve under
# qemu-aarch64 (Debian: qemu-user). Adds to dist/ and dist/SHA256SUMS.
CROSS_CUDA_AARCH64 := $(abspath build/cross-cuda-aarch64)
repro-aarch64: env
	$(PY) tools/cross_cuda.py aarch64 $(CROSS_CUDA_AARCH64)
	MOK_TARGET_CPU=aarch64 MOK_CUDA_TARGET_ROOT=$(CROSS_CUDA_AARCH64) $(PY) tools/repro_check.py
	tools/qemu_check.sh dist/mok-*_aarch64.whl

lint: env
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	tools/check_build_files.sh

format: env
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# One universal lock: every platform's wheel hashes (x86_64 and aarch64 hosts alike), read by pip,
# uv and Bazel's pip.parse. The header uv writes is the command below, which is how Renovate's
# pip-compile manager re-runs it (no --no-header, options with `=`, no --python-platform).
lock: env
	$(PY) -m uv pip compile --quiet --universal --python-version=3.12 --generate-hashes \
		--output-file=requirements.lock requirements.in
	$(PY) tools/nix_wheels.py

# nix/wheels.nix, the flake's copy of the lock (URL + the lock's hash of each wheel, per system):
# regenerate after every `make lock` (tests/cpu/test_nix_flake.py fails until it agrees).
nix-wheels: env
	$(PY) tools/nix_wheels.py

# The benchmark on this machine: GPUS=N ranks through torchrun (CPU: the --smoke mode). Its rows
# are appended to RESULTS (git ignores benchmarks/local/); on a GPU,
# RESULTS=benchmarks/results.jsonl appends them to the committed table. The chart of the newest
# run goes to benchmarks/local/chart.png.
GPUS ?= 1
RESULTS ?= benchmarks/local/results.jsonl
run-benchmarks: env
	PYTHONPATH=. $(VENV)/bin/torchrun --standalone --nproc-per-node=$(GPUS) -m mok.bench.run \
		--out $(RESULTS) $(if $(shell nvidia-smi -L 2>/dev/null),,--smoke)
	PYTHONPATH=. $(PY) -m mok.bench.chart $(RESULTS) --out benchmarks/local/chart.png

clean:
	rm -rf build dist $(VENV) .venv-test
