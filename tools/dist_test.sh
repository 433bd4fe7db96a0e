#!/usr/bin/env bash
# Test a checkpoint with several processes per machine, on one or several machines (torchrun).
#
#   tools/dist_test.sh CONFIG CHECKPOINT GPUS [tools/test.py options ...]
#
# Several machines: NNODES, NODE_RANK, MASTER_ADDR, PORT as for tools/dist_train.sh.
# Without usable CUDA, or with fewer GPUs than GPUS, it stops with the cause before torchrun starts; with
# --device cpu, GPUS CPU processes test over gloo. PYTHON selects the interpreter.
set -e
if [ $# -lt 3 ]; then
    echo "usage: $0 CONFIG CHECKPOINT GPUS [tools/test.py options ...]" >&2
    exit 2
fi
CONFIG=$1
CHECKPOINT=$2
GPUS=$3
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
if [ -z "$PYTHON" ]; then
    if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python; fi
fi

# Checked once here, before torchrun starts GPUS processes (each would stop with the same error, then
# torchrun would add its failure report): CUDA is usable and shows GPUS GPUs. --device cpu skips it.
PYTHONPATH="$ROOT":$PYTHONPATH "$PYTHON" -c \
    'from mmpola.runtime.cli import check_launch_main; check_launch_main()' "$GPUS" "${@:4}"

PYTHONPATH="$ROOT":$PYTHONPATH \
exec "$PYTHON" -m torch.distributed.run \
    --nnodes="$NNODES" \
    --node_rank="$NODE_RANK" \
    --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$GPUS" \
    --master_port="$PORT" \
    "$ROOT/tools/test.py" "$CONFIG" "$CHECKPOINT" --launcher pytorch "${@:4}"
