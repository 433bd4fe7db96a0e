#!/usr/bin/env bash
# Test a checkpoint on a slurm cluster (one task per GPU, srun).
#
#   [GPUS=8] tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT [test.py options ...]
#
# GPUS (default 8) tasks, GPUS_PER_NODE per node (default GPUS, at most 8); CPUS_PER_TASK (default 5) and
# SRUN_ARGS are passed to srun. PYTHON selects the interpreter.
source "$(dirname "$(readlink -f "$0")")/_launch.sh" || exit 2
usage_unless 4 "$0 PARTITION JOB_NAME CONFIG CHECKPOINT [tools/test.py options ...]" "$@"
srun_tool test.py "$1" "$2" "$3" "$4" --launcher=slurm "${@:5}"
