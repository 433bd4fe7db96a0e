#!/usr/bin/env bash
# Train with several processes per machine, on one or several machines (torchrun).
#
#   tools/dist_train.sh CONFIG GPUS [tools/train.py options ...]
#
# One machine: the processes meet on a free port (PORT sets a fixed one), so runs side by side do not collide.
# Several machines: run on each, with the same MASTER_ADDR/PORT and its own NODE_RANK:
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 PORT=29500 tools/dist_train.sh CONFIG 8
# Without usable CUDA, or with fewer GPUs than GPUS, it stops with the cause before torchrun starts; with
# --device cpu, GPUS CPU processes train over gloo. PYTHON selects the interpreter (default: the
# repository's .venv if present, else python).
source "$(dirname "$(readlink -f "$0")")/_launch.sh" || exit 2
usage_unless 2 "$0 CONFIG GPUS [tools/train.py options ...]" "$@"
torchrun_tool train.py "$2" "$1" -- "${@:3}"
