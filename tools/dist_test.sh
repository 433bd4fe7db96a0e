#!/usr/bin/env bash
# Test a checkpoint with several processes per machine, on one or several machines (torchrun).
#
#   tools/dist_test.sh CONFIG CHECKPOINT GPUS [tools/test.py options ...]
#
# One machine: a free port, as for tools/dist_train.sh; several machines: NNODES, NODE_RANK, MASTER_ADDR, PORT.
# Without usable CUDA, or with fewer GPUs than GPUS, it stops with the cause before torchrun starts; with
# --device cpu, GPUS CPU processes test over gloo. PYTHON selects the interpreter.
source "$(dirname "$(readlink -f "$0")")/_launch.sh" || exit 2
usage_unless 3 "$0 CONFIG CHECKPOINT GPUS [tools/test.py options ...]" "$@"
torchrun_tool test.py "$3" "$1" "$2" -- "${@:4}"
