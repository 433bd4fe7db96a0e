#!/usr/bin/env bash
# Train with several processes per machine, on one or several machines (torchrun).
#
#   tools/dist_train.sh CONFIG GPUS [tools/train.py options ...]
#
# Several machines: run on each, with the same MASTER_ADDR/PORT and its own NODE_RANK:
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 PORT=29500 tools/dist_train.sh CONFIG 8
# Without usable CUDA, or with fewer GPUs than GPUS, it stops with the cause before torchrun starts; with
# --device cpu, GPUS CPU processes train over gloo. PYTHON selects the interpreter (default: the
# repository's .venv if present, else python).
set -e
if [ $# -lt 2 ]; then
    echo "usage: $0 CONFIG GPUS [tools/train.py options ...]" >&2
    exit 2
fi
CONFIG=$1
GPUS=$2
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
    'from mmpola.runtime.cli import check_launch_main; check_launch_main()' "$GPUS" "${@:3}"

PYTHONPATH="$ROOT":$PYTHONPATH \
exec "$PYTHON" -m torch.distributed.run \
    --nnodes="$NNODES" \
    --node_rank="$NODE_RANK" \
    --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$GPUS" \
    --master_port="$PORT" \
    "$ROOT/tools/train.py" "$CONFIG" --launcher pytorch "${@:3}"
