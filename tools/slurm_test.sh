#!/usr/bin/env bash
# Test a checkpoint on a slurm cluster (one task per GPU, srun).
#
#   [GPUS=8] tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT [test.py options ...]
#
# GPUS (default 8) tasks, GPUS_PER_NODE (default 8) per node; CPUS_PER_TASK (default 5) and
# SRUN_ARGS are passed to srun. PYTHON selects the interpreter.
set -x
if [ $# -lt 4 ]; then
    echo "usage: $0 PARTITION JOB_NAME CONFIG CHECKPOINT [tools/test.py options ...]" >&2
    exit 2
fi
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
CHECKPOINT=$4
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
SRUN_ARGS=${SRUN_ARGS:-""}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
if [ -z "$PYTHON" ]; then
    if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python; fi
fi

PYTHONPATH="$ROOT":$PYTHONPATH \
srun -p "${PARTITION}" \
    --job-name="${JOB_NAME}" \
    --gres=gpu:"${GPUS_PER_NODE}" \
    --ntasks="${GPUS}" \
    --ntasks-per-node="${GPUS_PER_NODE}" \
    --cpus-per-task="${CPUS_PER_TASK}" \
    --kill-on-bad-exit=1 \
    ${SRUN_ARGS} \
    "$PYTHON" -u "$ROOT/tools/test.py" "${CONFIG}" "${CHECKPOINT}" --launcher="slurm" "${@:5}"
