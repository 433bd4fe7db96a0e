# The README's commands. Each target first runs the idempotent set-up (seconds when up to date).
#   make demo   - the main job: Mask R-CNN + Pola-PVT-T on a generated COCO-style dataset (CPU ok)
#   make test   - the whole test suite
#   make lint   - ruff (pyflakes, pycodestyle, isort rules; ruff.toml)
#   make test-portable - the golden and ops tests again on the generic CPU kernels with one thread
# Use an existing environment (e.g. your CUDA torch build) instead of .venv:
#   make test PY=/path/to/env/bin/python SETUP_ARGS="--python /path/to/env/bin/python"
PY ?= .venv/bin/python
SETUP_ARGS ?=

.PHONY: setup demo demo-seg demo-cls test test-portable lint bench

setup:
	python3 tools/setup_env.py $(SETUP_ARGS)

demo: setup
	$(PY) tools/demo_detection.py

demo-seg: setup
	$(PY) tools/demo_segmentation.py

demo-cls: setup
	$(PY) tools/demo_classification.py

test: setup
	$(PY) -m pytest tests

# Results must not depend on the CPU: the golden comparisons hold within their stated tolerances
# with other CPU kernels (no AVX2/AVX-512 code paths) and one thread as well.
PORTABLE_TESTS = tests/ops tests/models tests/checkpoint
test-portable: setup
	ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1 $(PY) -m pytest -q -p no:cacheprovider $(PORTABLE_TESTS)

lint: setup
	$(PY) -m ruff check .

bench: setup
	$(PY) tools/benchmark.py attention
	$(PY) tools/benchmark.py backbone
	$(PY) tools/benchmark.py scaling
	$(PY) tools/benchmark.py amp
