# Sourced by tools/dist_train.sh, dist_test.sh, slurm_train.sh and slurm_test.sh (not a command of its own): the
# interpreter they run a tool with and the two ways they start its processes.
#
# PYTHON selects the interpreter (default: the repository's .venv if present, else python).

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -z "$PYTHON" ]; then
    if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python; fi
fi
# the repository first; with PYTHONPATH unset the empty entry after it keeps the working directory importable (as in
# mmdet's scripts: a project's own modules for its custom_imports)
export PYTHONPATH="$ROOT":$PYTHONPATH

# usage_unless MIN USAGE ARGS...: exit 2 with the usage line when ARGS are fewer than MIN.
usage_unless() {
    local min=$1 usage=$2
    shift 2
    if [ $# -lt "$min" ]; then
        echo "usage: $usage" >&2
        exit 2
    fi
}

# torchrun_tool TOOL GPUS ARGS... -- OPTIONS...: tools/TOOL ARGS --launcher pytorch OPTIONS in GPUS processes on
# this machine through torchrun. Several machines: NNODES, NODE_RANK, MASTER_ADDR, PORT (default 29500). One
# machine: the processes meet on a free port (torchrun --standalone), so that runs side by side on one machine
# do not collide; PORT or MASTER_ADDR set a fixed address instead. Checked once first, before torchrun starts the
# processes (each would stop with the same error, then torchrun would add its failure report): CUDA is usable
# and shows GPUS GPUs; --device cpu among OPTIONS skips that.
torchrun_tool() {
    local tool=$1 gpus=$2 args=() rendezvous
    shift 2
    while [ "$1" != -- ]; do args+=("$1"); shift; done
    shift
    "$PYTHON" "$ROOT/tools/_mmpola_tools.py" "$gpus" "$@" || exit
    if [ "${NNODES:-1}" = 1 ] && [ -z "$PORT" ] && [ -z "$MASTER_ADDR" ]; then
        rendezvous=(--standalone --local-addr=127.0.0.1)  # the processes connect over loopback: no name lookup
    else
        rendezvous=(--nnodes="${NNODES:-1}" --node_rank="${NODE_RANK:-0}" --master_addr="${MASTER_ADDR:-127.0.0.1}"
                    --master_port="${PORT:-29500}")
    fi
    exec "$PYTHON" -m torch.distributed.run "${rendezvous[@]}" --nproc_per_node="$gpus" \
        "$ROOT/tools/$tool" "${args[@]}" --launcher pytorch "$@"
}

# srun_tool TOOL PARTITION JOB_NAME ARGS...: tools/TOOL ARGS in GPUS slurm tasks (default 8), one per GPU,
# GPUS_PER_NODE of them per node (default GPUS, at most 8), each with CPUS_PER_TASK CPUs (default 5); SRUN_ARGS
# are passed to srun. ARGS end with the tool's --launcher=slurm. The tasks meet on the job's first node at
# MASTER_PORT: by default a port drawn for this launch from 20000-31999 (below Linux's ephemeral ports), so that
# two jobs whose first node is the same machine do not both take torch's default 29500.
srun_tool() {
    local tool=$1 partition=$2 job_name=$3
    shift 3
    local gpus=${GPUS:-8}
    local per_node=${GPUS_PER_NODE:-$(( gpus < 8 ? gpus : 8 ))}
    export MASTER_PORT=${MASTER_PORT:-$(( 20000 + RANDOM % 12000 ))}
    set -x
    # shellcheck disable=SC2086  # SRUN_ARGS: options of srun, split as words
    exec srun -p "$partition" \
        --job-name="$job_name" \
        --gres=gpu:"$per_node" \
        --ntasks="$gpus" \
        --ntasks-per-node="$per_node" \
        --cpus-per-task="${CPUS_PER_TASK:-5}" \
        --kill-on-bad-exit=1 \
        ${SRUN_ARGS} \
        "$PYTHON" -u "$ROOT/tools/$tool" "$@"
}
