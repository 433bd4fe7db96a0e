# The README's commands. Each target first runs the idempotent set-up (seconds when up to date).
#   make demo   - the main job: Mask R-CNN + Pola-PVT-T on a generated COCO-style dataset (CPU ok)
#   make test   - the whole test suite
#   make lint   - ruff (pyflakes, pycodestyle, isort rules; ruff.toml)
#   make test-portable - the golden and ops tests again on the generic CPU kernels with one thread
#   make test-compat - the backbones' and ops' tests again with the GPU machines' torch, Triton and Python
#   make -k bench-gpu - the GPU tests and tables of docs/benchmarks.md, on one CUDA GPU, in the current environment
#   make bench-gpu-quick-compile, make bench-gpu-quick-train, make bench-gpu-quick - the GPU targets' rows only,
#                   for a short turn (make bench-gpu-turn: the last two in one order of steps, resumable, their output
#                   kept in GPU_LOG_DIR as it comes)
#   make docs-check - the params / GMACs figures of the docs counted again (tools/docs_figures.py) and compared
#   make check-kernels - every Triton kernel compiled for sm_80, sm_90, sm_100, sm_86, sm_89 and sm_120 (no GPU
#                   needed): shared memory, registers, spills; fails on a kernel that does not compile or fit
# Use an existing environment (e.g. your CUDA torch build) instead of .venv:
#   make test PY=/path/to/env/bin/python SETUP_ARGS="--python /path/to/env/bin/python"
PY ?= .venv/bin/python
SETUP_ARGS ?=

.PHONY: setup demo demo-seg demo-cls test test-portable test-compat lint bench bench-gpu test-gpu bench-gpu-warm \
	bench-gpu-ops bench-gpu-train bench-gpu-quick-compile bench-gpu-quick bench-gpu-quick-train bench-gpu-turn docs-check \
	docs-figures check-kernels

setup:
	python3 tools/setup_env.py $(SETUP_ARGS)

demo: setup
	$(PY) tools/demo_detection.py

demo-seg: setup
	$(PY) tools/demo_segmentation.py

demo-cls: setup
	$(PY) tools/demo_classification.py

# The suite runs in TEST_JOBS worker processes (pytest-xdist), one test file per worker at a time, so a
# file's module fixtures are made once; TEST_JOBS=0 runs it in this process.
TEST_JOBS ?= 2
test: setup
	$(PY) -m pytest -n $(TEST_JOBS) --dist loadfile tests

# Results must not depend on the CPU: the golden comparisons hold within their stated tolerances
# with other CPU kernels (no AVX2/AVX-512 code paths) and one thread as well.
PORTABLE_TESTS = tests/ops tests/models tests/checkpoint
test-portable: setup
	ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1 $(PY) -m pytest -q -p no:cacheprovider -n $(TEST_JOBS) --dist loadfile \
		$(PORTABLE_TESTS)

# The backbones, their ops and the timm entries once more with the GPU machines' older torch, Triton and Python
# (requirements/compat.txt), in a second environment (COMPAT_VENV, made and kept up to date by uv from .venv):
# compiled graphs, autograd Functions, the profiler and Triton's interpreter change between torch releases. That
# environment has no mmcv, mmdet or mmseg: the tests that need them (marked downstream) are left out.
COMPAT_VENV ?= .venv-compat
# a Python 3.12 as on those machines where one runs (on PATH, or one of pyenv's), else python3
COMPAT_PYTHON ?= $(or $(firstword $(foreach p,python3.12 $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12),\
	$(shell $(p) -c 'import sys; print(sys.executable)' 2>/dev/null))),python3)
# the tests run there: the portable ones, the Triton kernels compiled by that Triton for those GPUs (no GPU needed),
# and the benchmark command's rows that need no mmdet (what a GPU turn runs first)
COMPAT_TESTS = $(PORTABLE_TESTS) tests/tools/test_check_triton_kernels.py tests/tools/test_benchmark.py
test-compat: setup
	$(dir $(PY))uv venv -q --allow-existing -p $(COMPAT_PYTHON) $(COMPAT_VENV)
	$(dir $(PY))uv pip install -q --python $(COMPAT_VENV)/bin/python -r requirements/compat.txt
	$(dir $(PY))uv pip install -q --python $(COMPAT_VENV)/bin/python --no-deps -e .
	$(COMPAT_VENV)/bin/python -m pytest -q -p no:cacheprovider -n $(TEST_JOBS) --dist loadfile -m 'not downstream' \
		$(COMPAT_TESTS)

lint: setup
	$(PY) -m ruff check .

# Every params / GMACs figure of docs/model_zoo.md and docs/models.md, counted again by tools/get_flops.py
# (one forward pass per model and size: about an hour on 2 CPU cores) and compared with the docs: each must be
# the count rounded as printed. docs-figures rewrites the ones that differ. Some rows only: ONLY="pvt-t swin-t".
docs-check: setup
	$(PY) tools/docs_figures.py $(if $(ONLY),--only $(ONLY))

docs-figures: setup
	$(PY) tools/docs_figures.py --write $(if $(ONLY),--only $(ONLY))

check-kernels: setup
	$(PY) tools/check_triton_kernels.py --jobs 4

# the configs whose optimizer steps docs/benchmarks.md compares (mmengine's default constructor vs mmpola's, foreach vs fused)
OPTIM_CONFIGS = configs/detection/mask-rcnn_pola-swin-t_fpn_ms-crop-3x_coco.py \
	mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py configs/segmentation/upernet_pola-swin-t_8xb2-160k_ade20k-512x512.py \
	configs/classification/pola-swin-t_8xb128_in1k.py configs/detection/retinanet_pola-pvt-t_fpn_1x_coco.py
# the detectors whose training step docs/benchmarks.md counts (memory), each followed by its mmdet counterpart
MEMORY_PAIRS = configs/detection/retinanet_pola-pvt-t_fpn_1x_coco.py mmdet::pvt/retinanet_pvt-t_fpn_1x_coco.py \
	configs/detection/mask-rcnn_pola-swin-t_fpn_ms-crop-3x_coco.py mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py
bench: setup
	$(PY) tools/benchmark.py attention
	$(PY) tools/benchmark.py backbone
	$(PY) tools/benchmark.py scaling
	$(PY) tools/benchmark.py amp
	$(PY) tools/benchmark.py host --compare-recompute --also-with MMPOLA_DEPTHWISE_CONV=torch \
		--also-with MMPOLA_RECOMPUTE=elementwise
	$(PY) tools/benchmark.py host --compare-recompute --amp bfloat16
	$(PY) tools/benchmark.py optim $(OPTIM_CONFIGS)
	$(PY) tools/benchmark.py memory $(MEMORY_PAIRS) --pairs --batch-size 2 --img-scale 1333 800 \
		--also-with MMPOLA_RECOMPUTE=elementwise --also-with MMPOLA_RECOMPUTE=triton

# One CUDA GPU, in the environment at hand (no set-up):
#   make -k bench-gpu PY=python3
# = test-gpu (the ops' tests and the models' Triton paths against the library's: Triton kernels compiled and run
# on the GPU; needs pytest and pytest-xdist), bench-gpu-warm (the kernels of the timed rows compiled in parallel),
# bench-gpu-ops (ops, layers and backbones: torch, timm and mmengine only)
# and bench-gpu-train (detectors: needs mmdet and mmcv built with CUDA ops). -k: every part runs even when
# one fails. The parts that need no mmcv can run while mmcv builds:
# make -k test-gpu bench-gpu-warm bench-gpu-ops PY=python3, then make bench-gpu-train PY=python3.
# Where the GPU targets write their logs, and the training runs' profiles
GPU_LOG_DIR ?= work_dirs
GPU_PROFILE_DIR ?= work_dirs/benchmark_profile
GPU_CASES = pvt-s1@800x1344 swin-s1@800x1344 pvt-s2@800x1344 swin-s2@800x1344
GPU_BACKBONES = pola-pvt-t softmax-pvt-t pola-swin-t softmax-swin-t timm-swin-t softmax-pvtv2-b2 timm-pvt-v2-b2 \
	flatten-pvt-t inline-pvt-t flatten-swin-t inline-swin-t polaformer++-b2 polaformer++-b4
# mmpola's optimizer step (merged parameter groups, AdamW's fused implementation: docs/recipes.md), for mmdet's
# configs in the training comparison: their rows with the step of mmpola's configs
MMPOLA_OPTIM_STEP = optim_wrapper.constructor=mmpola.MergedGroupsOptimWrapperConstructor \
	optim_wrapper.optimizer.fused=True
POLA_SWIN_MASK_RCNN = configs/detection/mask-rcnn_pola-swin-t_fpn_ms-crop-3x_coco.py
SWIN_MASK_RCNN = mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py
GPU_TRAIN = configs/detection/retinanet_pola-pvt-t_fpn_1x_coco.py mmdet::pvt/retinanet_pvt-t_fpn_1x_coco.py \
	$(POLA_SWIN_MASK_RCNN) $(SWIN_MASK_RCNN)
# Where the Triton kernels run: compiled (and tuned) at their first use in each process
GPU_TRITON_BACKBONES = pola-pvt-t pola-swin-t flatten-pvt-t inline-pvt-t flatten-swin-t inline-swin-t polaformer++-b2 \
	polaformer++-b4
bench-gpu: test-gpu bench-gpu-warm bench-gpu-ops bench-gpu-train

# Triton compiles a kernel's configs one after another at its first use (a few dozen per op, head dim and
# dtype); bench-gpu-warm makes the kernels of bench-gpu-ops' Triton rows once, one process per case and
# model at the same time, so that the timed runs find them in Triton's disk cache. Prints nothing.
bench-gpu-warm:
	@for case in $(GPU_CASES); do \
		$(PY) tools/benchmark.py attention --device cuda --cases $$case --impls triton --repeat 1 --no-memory \
			--no-error >/dev/null 2>&1 & \
	done; \
	$(PY) tools/benchmark.py attention --device cuda --cases pvt-s1@800x1344 --dtype bfloat16 --impls triton \
		--repeat 1 --no-memory --no-error >/dev/null 2>&1 & \
	$(PY) tools/benchmark.py attention --device cuda --kinds pacs --cases polapp-b4-s1@800x1344 --dtype bfloat16 \
		--impls triton --repeat 1 --no-memory --no-error >/dev/null 2>&1 & \
	for model in $(GPU_TRITON_BACKBONES); do \
		$(PY) tools/benchmark.py backbone --device cuda --models $$model --sizes 800x1344 --batch 2 --backward \
			--amp bfloat16 --repeat 1 --no-memory >/dev/null 2>&1 & \
	done; \
	for model in pola-pvt-t pola-swin-t; do \
		$(PY) tools/benchmark.py backbone --device cuda --models $$model --sizes 800x1344 --batch 2 --backward \
			--amp float16 --repeat 1 --no-memory >/dev/null 2>&1 & \
	done; \
	$(PY) tools/benchmark.py layers --device cuda --cases pvt-s1@800x1344 swin-s1@800x1344 --impls triton \
		--repeat 1 --new-shapes 0 --no-memory >/dev/null 2>&1 & \
	wait

# The kernels' tests run their default configs there (tests/conftest.py), in GPU_TEST_JOBS processes
# (pytest-xdist; 0: one process): each compiles its own kernels, in parallel. GPU_MODEL_TESTS: whole models
# with every Triton path, what 'auto' runs on a GPU, against the library's path on the same GPU.
GPU_TEST_JOBS ?= 4
GPU_MODEL_TESTS = tests/models/test_triton_paths.py
GPU_SDPA_TESTS = tests/ops/test_sdpa.py
test-gpu:
	$(PY) -m pytest -q -p no:cacheprovider $(if $(filter 0,$(GPU_TEST_JOBS)),,-n $(GPU_TEST_JOBS) --dist loadfile) \
		tests/ops $(GPU_MODEL_TESTS)

bench-gpu-ops:
	$(PY) tools/benchmark.py attention --device cuda --cases $(GPU_CASES)
	$(PY) tools/benchmark.py attention --device cuda --cases pvt-s1@800x1344 --dtype bfloat16
	$(PY) tools/benchmark.py attention --device cuda --kinds pacs --cases polapp-b4-s1@800x1344 --dtype bfloat16
	$(PY) tools/benchmark.py layers --device cuda --cases $(GPU_CASES)
	$(PY) tools/benchmark.py backbone --device cuda --models $(GPU_BACKBONES) --sizes 800x1344 --batch 2 \
		--backward --amp bfloat16 --repeat 10
	$(PY) tools/benchmark.py backbone --device cuda --models pola-pvt-t pola-swin-t --sizes 800x1344 --batch 2 \
		--backward --amp bfloat16 --repeat 10 --attn-impl fast
	$(PY) tools/benchmark.py backbone --device cuda --models pola-pvt-t softmax-pvt-t pola-swin-t softmax-swin-t \
		--sizes 800x1344 --batch 2 --backward --amp bfloat16 --repeat 10 --recompute-impl triton
	$(PY) tools/benchmark.py backbone --device cuda --models pola-pvt-t pola-swin-t --sizes 800x1344 --batch 2 \
		--backward --amp bfloat16 --repeat 10 --recompute-impl elementwise
	$(PY) tools/benchmark.py backbone --device cuda --models pola-pvt-t softmax-pvt-t pola-swin-t softmax-swin-t \
		--sizes 800x1344 --batch 2 --backward --amp float16 --repeat 10 --new-sizes 5
	$(PY) tools/benchmark.py backbone --device cuda --models pola-pvt-t pola-swin-t softmax-pvtv2-b2 \
		--sizes 800x1344 --batch 2 --backward --amp float16 --repeat 10 --new-sizes 5 --dwconv-impl torch
	$(PY) tools/benchmark.py backbone --device cuda --models $(SDPA_BACKBONES) --sizes 800x1344 --batch 2 --backward \
		--amp float16 --repeat 10 --new-sizes 5 --sdpa-impl torch
	$(PY) tools/benchmark.py backbone --device cuda --models pola-pvt-t softmax-pvt-t --sizes 800x1333 1600x2666 \
		--amp float16 --repeat 10

bench-gpu-train:
	$(PY) tools/benchmark.py train $(GPU_TRAIN) --device cuda --amp --batch-size 2 --iters 50 --warmup 20 \
		--profile $(GPU_PROFILE_DIR)
	$(PY) tools/benchmark.py train $(SDPA_TRAIN) --device cuda --amp --batch-size 2 --iters 50 --warmup 20 \
		--also-with MMPOLA_SDPA=torch
	$(PY) tools/benchmark.py train $(filter configs/%,$(GPU_TRAIN)) --device cuda --amp --batch-size 2 --iters 50 \
		--warmup 20 --also-with MMPOLA_RECOMPUTE=elementwise --also-with MMPOLA_RECOMPUTE=triton \
		--also-with MMPOLA_DEPTHWISE_CONV=torch
	$(PY) tools/benchmark.py train $(filter mmdet::%,$(GPU_TRAIN)) --device cuda --amp --batch-size 2 --iters 50 \
		--warmup 20 --cfg-options $(MMPOLA_OPTIM_STEP)

# A short turn on a GPU (about ten minutes on a fresh machine, mmcv building with CUDA ops for about five of them):
# while mmcv builds, make bench-gpu-quick-compile PY=python3 (no mmcv needed, nothing timed: the compiler's processes
# slow the host side of every step, which at batch 2 takes about as long as these backbones' steps); after it, make
# bench-gpu-turn PY=python3 (below: the detectors' and the backbones' steps, those that decide the targets first, as
# time allows; a second call on the same machine goes on where the first stopped). The compile stage, in parallel: the
# kernels of the two Pola backbones in bf16 and in fp16 (the detectors' --amp; only the compiled kernels are kept for
# the timed runs, which tune them again: the compile stage's processes share the GPU), in fp16 also with every
# recomputing layer's kernels (those of the training rows' MMPOLA_RECOMPUTE variants), and the models' Triton paths
# checked against the library's (GPU_MODEL_TESTS, needs pytest; the log in GPU_LOG_DIR/gpu_model_tests.log), with the
# softmax kinds' attention backends (GPU_SDPA_TESTS).
GPU_TARGET_BACKBONES = pola-pvt-t softmax-pvt-t pola-swin-t softmax-swin-t timm-swin-t softmax-pvtv2-b2 timm-pvt-v2-b2
# backbones with softmax stages whose mask needs no gradient in training (PVTv2's spatial reduction, CSWin's stripes,
# PolaFormer++'s RoPE softmax): what torch sends to cuDNN's attention first on compute capability 9.0 / 10.0
SDPA_BACKBONES = softmax-pvtv2-b2 flatten-cswin-t polaformer++-b2
# the compile stage's tests run in GPU_COMPILE_TEST_JOBS processes (pytest-xdist, each test to the next free one; 0:
# one process) and stop after GPU_TESTS_TIMEOUT seconds (what they had checked stays in their log), so that the timed
# steps keep their share of a short turn
GPU_COMPILE_TEST_JOBS ?= 3
GPU_TESTS_TIMEOUT ?= 360
bench-gpu-quick-compile:
	@mkdir -p $(GPU_LOG_DIR); echo "== compile stage ($$(date -u +%T))"; \
	timeout $(GPU_TESTS_TIMEOUT) $(PY) -m pytest -q -p no:cacheprovider \
		$(if $(filter 0,$(GPU_COMPILE_TEST_JOBS)),,-n $(GPU_COMPILE_TEST_JOBS) --dist load) \
		$(GPU_MODEL_TESTS) $(GPU_SDPA_TESTS) >$(GPU_LOG_DIR)/gpu_model_tests.log 2>&1 & \
	tests=$$!; \
	for model in pola-pvt-t pola-swin-t; do \
		$(PY) tools/benchmark.py backbone --device cuda --models $$model --sizes 800x1344 --batch 2 --backward \
			--amp bfloat16 --repeat 1 --no-memory >/dev/null 2>&1 & \
		$(PY) tools/benchmark.py backbone --device cuda --models $$model --sizes 800x1344 --batch 2 --backward \
			--amp float16 --repeat 1 --no-memory >/dev/null 2>&1 & \
		$(PY) tools/benchmark.py backbone --device cuda --models $$model --sizes 800x1344 --batch 2 --backward \
			--amp float16 --repeat 1 --no-memory --recompute-impl triton >/dev/null 2>&1 & \
	done; \
	$(PY) tools/benchmark.py attention --device cuda --cases pvt-s1@800x1344 --impls triton --repeat 1 --no-memory \
		--no-error >/dev/null 2>&1 & \
	wait $$tests; rc=$$?; wait; \
	tail -n 12 $(GPU_LOG_DIR)/gpu_model_tests.log; echo "== compile stage done ($$(date -u +%T))"; \
	[ $$rc -ne 124 ] || echo "the GPU tests stopped after $(GPU_TESTS_TIMEOUT) s (above: what they checked)"; \
	[ $$rc -eq 0 ] || [ $$rc -eq 124 ] || echo "the GPU tests failed (above): checks of this GPU's paths"

# The timed rows of a short turn as steps, each one or more benchmark commands (every command of a step runs, whether
# the one before it failed or not). make bench-gpu-quick-train runs the detectors' steps, make bench-gpu-quick the
# backbones' and ops'; make bench-gpu-turn runs them all in the order of GPU_TURN_STEPS (below), each once. A command
# that fails is noted (ON_FAIL, at the end of each) in GPU_FAILED with its step, exit status and time, and the next
# one runs; after the last, the three targets list the failed ones and fail.
define newline


endef
GPU_FAILED = $(GPU_LOG_DIR)/gpu-failed-commands
ON_FAIL = || echo "step $(or $(step),$*): exit $$? at $$(date -u +%T)" >> $(GPU_FAILED)
GPU_FAILED_REPORT = if [ -s $(GPU_FAILED) ]; then echo "== $$(wc -l < $(GPU_FAILED)) command(s) failed (their errors \
	above):"; cat $(GPU_FAILED); fi

# The detectors: the four of the targets (and a profile of one more iteration of each, in GPU_PROFILE_DIR).
define GPU_STEP_train-targets
$(PY) tools/benchmark.py train $(GPU_TRAIN) --device cuda --amp --batch-size 2 --iters 30 --warmup 20 \
	--profile $(GPU_PROFILE_DIR) $(ON_FAIL)
endef
# Pola-Swin-T's Mask R-CNN, whose multi-scale crops give nearly every iteration new image sizes, and right after it in
# the same process with the depthwise convolutions on the library's convolution (--also-with: side by side), with
# the MLPs' second linear layers recomputing their input (MMPOLA_RECOMPUTE=elementwise) and with every linear layer
# that can (MMPOLA_RECOMPUTE=triton: the least memory and the lowest device bound, for host time); then it and mmdet's
# Swin-T Mask R-CNN in a process whose CUDA caching allocator grows its segments in place of new ones
# (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, read when CUDA starts): the time that new sizes spend in
# cudaMalloc, beside the allocator events the first command counts.
define GPU_STEP_train-pola-swin
$(PY) tools/benchmark.py train $(POLA_SWIN_MASK_RCNN) --device cuda --amp --batch-size 2 --iters 20 --warmup 10 \
	--also-with MMPOLA_DEPTHWISE_CONV=torch --also-with MMPOLA_RECOMPUTE=elementwise --also-with MMPOLA_RECOMPUTE=triton \
	$(ON_FAIL)
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True $(PY) tools/benchmark.py train $(POLA_SWIN_MASK_RCNN) \
	$(SWIN_MASK_RCNN) --device cuda --amp --batch-size 2 --iters 20 --warmup 10 $(ON_FAIL)
endef
# RetinaNet Pola-PVT-T, then with those and with every linear layer that recomputes its input
# (MMPOLA_RECOMPUTE=triton; the default runs the library's).
define GPU_STEP_train-recompute
$(PY) tools/benchmark.py train $(firstword $(GPU_TRAIN)) --device cuda --amp --batch-size 2 --iters 30 \
	--warmup 20 --also-with MMPOLA_RECOMPUTE=elementwise --also-with MMPOLA_RECOMPUTE=triton $(ON_FAIL)
endef
# The mmdet detectors with mmpola's optimizer step.
define GPU_STEP_train-optimizer
$(PY) tools/benchmark.py train $(filter mmdet::%,$(GPU_TRAIN)) --device cuda --amp --batch-size 2 --iters 30 \
	--warmup 20 --cfg-options $(MMPOLA_OPTIM_STEP) $(ON_FAIL)
endef
# Pola-Swin-T's Mask R-CNN with the attention's fast path.
define GPU_STEP_train-fast
$(PY) tools/benchmark.py train $(POLA_SWIN_MASK_RCNN) --device cuda --amp --batch-size 2 --iters 20 --warmup 10 \
	--attn-impl fast $(ON_FAIL)
endef
# A detector whose softmax stages (PolaFormer++'s RoPE softmax, no learned mask) torch would send to cuDNN's attention
# on compute capability 9.0 / 10.0 (a graph built per new size), then with torch's choice.
SDPA_TRAIN = configs/detection/mask-rcnn_polapp-b2_fpn_ms-crop-3x_coco.py
define GPU_STEP_train-sdpa
$(PY) tools/benchmark.py train $(SDPA_TRAIN) --device cuda --amp --batch-size 2 --iters 20 --warmup 10 \
	--also-with MMPOLA_SDPA=torch $(ON_FAIL)
endef

# The backbones of the target rows, bf16 fwd+bwd, and a profile of one more step of each (in GPU_PROFILE_DIR); then
# Pola-Swin-T's and the softmax Swin-T's training step in fp16 (the detectors' --amp) at three sizes not seen before
# beside the fixed size: whether the backbone holds the time that Pola-Swin-T's Mask R-CNN spends at new image sizes.
define GPU_STEP_backbones
$(PY) tools/benchmark.py backbone --device cuda --models $(GPU_TARGET_BACKBONES) --sizes 800x1344 --batch 2 \
	--backward --amp bfloat16 --repeat 10 --profile $(GPU_PROFILE_DIR) $(ON_FAIL)
$(PY) tools/benchmark.py backbone --device cuda --models pola-swin-t softmax-swin-t --sizes 800x1344 --batch 2 \
	--backward --amp float16 --repeat 5 --new-sizes 3 --no-memory $(ON_FAIL)
endef
# Pola-PVT-T, the softmax PVT-T and Pola-Swin-T with the recomputing linear layers, the Pola backbones with those of
# the MLPs only (elementwise: the attention's kernels multiply by the gates).
define GPU_STEP_backbones-recompute
$(PY) tools/benchmark.py backbone --device cuda --models pola-pvt-t softmax-pvt-t pola-swin-t --sizes 800x1344 \
	--batch 2 --backward --amp bfloat16 --repeat 10 --recompute-impl triton $(ON_FAIL)
$(PY) tools/benchmark.py backbone --device cuda --models pola-pvt-t pola-swin-t --sizes 800x1344 --batch 2 \
	--backward --amp bfloat16 --repeat 10 --recompute-impl elementwise $(ON_FAIL)
endef
# The backbones' steps at 64x96, where the device has almost nothing to do, so that the time is the host's on that
# machine with the real launches (host, before them, records the Triton launches in a dry run instead of making them
# and times them apart down Triton's launch path to a driver that launches nothing: the rest of the difference is the
# launcher's and the driver's share of the launches; the profiles of one more step of each give the host's time by
# operator and by CUDA call, launches included).
define GPU_STEP_host
$(PY) tools/benchmark.py host --amp bfloat16 --models pola-pvt-t softmax-pvt-t pola-swin-t --compare-recompute $(ON_FAIL)
$(PY) tools/benchmark.py backbone --device cuda --models pola-pvt-t softmax-pvt-t pola-swin-t softmax-swin-t \
	--sizes 64x96 --batch 2 --backward --amp bfloat16 --repeat 20 --no-memory --profile $(GPU_PROFILE_DIR) $(ON_FAIL)
$(PY) tools/benchmark.py backbone --device cuda --models pola-pvt-t softmax-pvt-t pola-swin-t --sizes 64x96 \
	--batch 2 --backward --amp bfloat16 --repeat 20 --no-memory --recompute-impl triton $(ON_FAIL)
endef
# The forward at 800x1333 and 1600x2666, then the same for the inference forward at batch 1 as GPU_STEP_host (host
# --forward, and the backbones' forward at 64x96): the side of the 1600x2666 comparison that the host decides.
define GPU_STEP_forward
$(PY) tools/benchmark.py backbone --device cuda --models pola-pvt-t softmax-pvt-t --sizes 800x1333 1600x2666 \
	--amp float16 --repeat 10 $(ON_FAIL)
$(PY) tools/benchmark.py host --forward --models pola-pvt-t softmax-pvt-t pvt-t pola-swin-t swin-t $(ON_FAIL)
$(PY) tools/benchmark.py backbone --device cuda --models pola-pvt-t softmax-pvt-t pvt-t pola-swin-t swin-t \
	--sizes 64x96 --amp float16 --repeat 20 --no-memory $(ON_FAIL)
endef
# Backbones whose softmax stages torch would send to cuDNN's attention on compute capability 9.0 / 10.0 (which builds
# a graph per new size) at new input sizes (a detector's every iteration), with cuDNN's attention left out ('auto') and
# with torch's choice (--sdpa-impl torch): in training those without a learned mask (SDPA_BACKBONES), and Pola-Swin-T's
# forward (evaluation: its windows' mask needs no gradient there).
define GPU_STEP_new-sizes
$(PY) tools/benchmark.py backbone --device cuda --models $(SDPA_BACKBONES) --sizes 800x1344 --batch 2 --backward \
	--amp float16 --repeat 5 --new-sizes 3 --no-memory $(ON_FAIL)
$(PY) tools/benchmark.py backbone --device cuda --models $(SDPA_BACKBONES) --sizes 800x1344 --batch 2 --backward \
	--amp float16 --repeat 5 --new-sizes 3 --no-memory --sdpa-impl torch $(ON_FAIL)
$(PY) tools/benchmark.py backbone --device cuda --models pola-swin-t --sizes 800x1344 --amp float16 --repeat 5 \
	--new-sizes 3 --no-memory $(ON_FAIL)
$(PY) tools/benchmark.py backbone --device cuda --models pola-swin-t --sizes 800x1344 --amp float16 --repeat 5 \
	--new-sizes 3 --no-memory --sdpa-impl torch $(ON_FAIL)
endef
# The attention ops at PVT's first stage; the Pola backbones with the attention's fast path.
define GPU_STEP_ops
$(PY) tools/benchmark.py attention --device cuda --cases pvt-s1@800x1344 $(ON_FAIL)
$(PY) tools/benchmark.py backbone --device cuda --models pola-pvt-t pola-swin-t --sizes 800x1344 --batch 2 \
	--backward --amp bfloat16 --repeat 10 --attn-impl fast $(ON_FAIL)
endef

GPU_TRAIN_STEPS = train-targets train-pola-swin train-recompute train-optimizer train-fast train-sdpa
GPU_BACKBONE_STEPS = backbones new-sizes backbones-recompute ops host forward
# A turn's order: what decides the targets first (the detectors' time, memory and profiles; the backbones' time), then
# what explains them, then the rest.
GPU_TURN_STEPS = train-targets backbones train-pola-swin train-recompute backbones-recompute host train-optimizer \
	forward new-sizes ops train-fast train-sdpa
bench-gpu-quick-train:
	@mkdir -p $(GPU_LOG_DIR); rm -f $(GPU_FAILED)
	$(foreach step,$(GPU_TRAIN_STEPS),$(GPU_STEP_$(step))$(newline))
	@$(GPU_FAILED_REPORT); [ ! -s $(GPU_FAILED) ]

bench-gpu-quick:
	@mkdir -p $(GPU_LOG_DIR); rm -f $(GPU_FAILED)
	$(foreach step,$(GPU_BACKBONE_STEPS),$(GPU_STEP_$(step))$(newline))
	@$(GPU_FAILED_REPORT); [ ! -s $(GPU_FAILED) ]

# make bench-gpu-turn PY=python3 GPU_LOG_DIR=DIR: the timed part of a short turn, after mmcv's build, as one command.
# Every step of GPU_TURN_STEPS runs once: each leaves a mark in GPU_TURN_DONE when it has run, and the command run again
# (on the same machine, e.g. after a turn cut short by its time limit) goes on with the steps not yet marked (rm -r
# GPU_TURN_DONE starts over). The output is appended to DIR/bench-gpu-turn.log as it comes (Python's unbuffered), and
# after each step the training runs' profiles are packed into two files in DIR, so that a machine that hands back only
# a few files gives back all of them: profiles.tar.gz (the summaries and each iteration's time and size) and
# traces.tar.gz (the chrome traces). Triton keeps each tuning's choice on disk (TRITON_CACHE_AUTOTUNING=1): the first
# process that tunes a kernel for a key times its configs, the later ones read its choice (no timing in each
# process's warm-up; the compile stage, whose processes share the GPU, caches none); TRITON_PRINT_AUTOTUNING=1 logs
# each tuning and its time.
GPU_TURN_DONE ?= work_dirs/gpu_turn_done
bench-gpu-turn:
	@mkdir -p $(GPU_LOG_DIR) $(GPU_TURN_DONE); rm -f $(GPU_FAILED)
	(PYTHONUNBUFFERED=1 TRITON_CACHE_AUTOTUNING=1 TRITON_PRINT_AUTOTUNING=1 $(MAKE) --no-print-directory \
		$(addprefix $(GPU_TURN_DONE)/,$(GPU_TURN_STEPS)) PY=$(PY) GPU_LOG_DIR=$(GPU_LOG_DIR) \
		GPU_PROFILE_DIR=$(GPU_PROFILE_DIR); $(GPU_FAILED_REPORT)) 2>&1 | tee -a $(GPU_LOG_DIR)/bench-gpu-turn.log
	@[ ! -s $(GPU_FAILED) ]

$(GPU_TURN_DONE)/%:
	@echo "== step $* ($$(date -u +%T))"
	$(GPU_STEP_$*)
	-@if [ -d $(GPU_PROFILE_DIR) ]; then \
		tar czf $(GPU_LOG_DIR)/profiles.tar.gz -C $(GPU_PROFILE_DIR) --exclude='*_trace.json' . && \
		(cd $(GPU_PROFILE_DIR) && find . -name '*_trace.json' | tar czf $(abspath $(GPU_LOG_DIR))/traces.tar.gz -T -); \
	fi
	@touch $@
