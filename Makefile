# The README's commands. Each target first runs the idempotent set-up (seconds when up to date).
#   make demo   - the main job: Mask R-CNN + Pola-PVT-T on a generated COCO-style dataset (CPU ok)
#   make test   - the whole test suite
# Use an existing environment (e.g. your CUDA torch build) instead of .venv:
#   make test PY=/path/to/env/bin/python SETUP_ARGS="--python /path/to/env/bin/python"
PY ?= .venv/bin/python
SETUP_ARGS ?=

.PHONY: setup demo demo-seg demo-cls test bench

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

bench: setup
	$(PY) tools/benchmark.py attention
	$(PY) tools/benchmark.py backbone
	$(PY) tools/benchmark.py scaling
	$(PY) tools/benchmark.py amp
