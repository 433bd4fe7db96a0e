"""tools/check_triton_kernels.py compiles the ops' Triton kernels for a GPU without one, with the launch
options the ops' own launch code picks for that GPU (recorded by mmpola.ops.triton_support.dry_run)."""
import math

import pytest
import torch

from mmpola.ops import OPS
from mmpola.ops.triton_support import KernelTarget, dry_run
from tests.fixtures.ops import H100
from tests.fixtures.paths import PYTHON
from tests.fixtures.runs import run_tool


def _record(op_name, target, dtype=torch.bfloat16, head_dim=64, hw=(5, 7)):
    op = OPS[op_name]
    tensors, options = op.example_inputs(1, 2, hw, head_dim, torch.Generator().manual_seed(0))
    tensors = [(t.to(dtype) if i < 3 else t).requires_grad_() for i, t in enumerate(tensors)]
    with dry_run(target) as launches:
        out = op.impls['triton'](*tensors, *options)
        out.backward(torch.zeros_like(out))
    return out, launches


@pytest.mark.parametrize('op_name', ['pola', 'flatten', 'inline', 'pacs'])
def test_a_dry_run_records_the_launches_for_the_named_gpu(op_name):
    out, launches = _record(op_name, H100)
    assert out.dtype == torch.bfloat16 and launches, op_name
    # forward and backward kernels, each launched with its grid, tensors and compile-time options
    names = {launch.kernel.fn.__name__ if hasattr(launch.kernel, 'configs') else launch.kernel.__name__
             for launch in launches}
    assert len(names) >= 4, names
    assert all(any(isinstance(a, torch.Tensor) for a in launch.args) for launch in launches)
    # the GPU's multiprocessors set the chunking of 1600 tokens: 132 SMs ask for more chunks than 1 SM
    _, many = _record(op_name, H100, hw=(40, 40))
    _, few = _record(op_name, KernelTarget(True, (9, 0), 1), hw=(40, 40))
    assert sum(_programs(launch) for launch in many) > sum(_programs(launch) for launch in few)


def _programs(launch):
    grid = launch.grid
    if callable(grid):  # a grid of token blocks of a tuned kernel: that of its first config
        grid = grid({**launch.kwargs, **launch.kernel.configs[0].all_kwargs()})
    return math.prod(grid)


def test_tuned_kernels_are_recorded_with_every_config_and_grids_of_chunks_that_do_not_depend_on_them():
    from triton.runtime.autotuner import Autotuner
    _, launches = _record('pacs', H100)
    tuned = [launch for launch in launches if isinstance(launch.kernel, Autotuner)]
    assert tuned and all(len(launch.kernel.configs) == 8 for launch in tuned)
    # the token reductions' grids (their partial sums: the forward's key pass, the two parts of the queries'
    # backward) are fixed tuples; only grids of token blocks vary
    chunked = [launch for launch in tuned if not callable(launch.grid)]
    assert len(chunked) == 3 and all(isinstance(launch.grid, tuple) for launch in chunked)


def test_the_tool_compiles_a_kernel_for_sm_90(tmp_path):
    log = run_tool([PYTHON, 'tools/check_triton_kernels.py', '--ops', 'flatten', '--targets', 'sm_90', '--head-dims',
                    '16', '--dtypes', 'bfloat16', '--kernels', '_token_stats_kernel'],
                   env=dict(TRITON_CACHE_DIR=str(tmp_path), TRITON_INTERPRET='0'))
    rows = [line for line in log.splitlines() if line.startswith('| flatten | _token_stats_kernel | sm_90')]
    assert rows and all(row.rstrip(' |').endswith('ok') for row in rows), log
    shared_kib = float(rows[0].split('|')[7])
    assert 0 < shared_kib < 227, rows[0]
    assert '0 failed' in log


def test_untuned_compiles_the_default_configs_and_counts_their_spills(tmp_path):
    """``--untuned`` compiles only what runs without tuning (deterministic mode, MMPOLA_TRITON_AUTOTUNE=0):
    each tunable kernel's default config, marked. Pola's key kernels at head dim 32 (Pola-Swin's heads) take
    16-token blocks on a GPU, which keep their tiles in registers."""
    log = run_tool([PYTHON, 'tools/check_triton_kernels.py', '--untuned', '--ops', 'pola', '--targets', 'sm_90',
                    '--head-dims', '32', '--dtypes', 'bfloat16', '--kernels', '_pola_fwd_keys', '_pola_bwd_keys'],
                   env=dict(TRITON_CACHE_DIR=str(tmp_path), TRITON_INTERPRET='0'))
    rows = [line.split('|') for line in log.splitlines() if line.startswith('| pola |')]
    assert {row[2].strip() for row in rows} == {'_pola_fwd_keys', '_pola_bwd_keys'}, log
    assert all(row[6].strip().endswith('(default)') for row in rows), log
    bwd = next(row for row in rows if row[2].strip() == '_pola_bwd_keys')
    assert 'BLOCK_N=16' in bwd[6] and bwd[9].strip() == '0', log
    assert '0 of the 2 configs that run without tuning spill registers' in log, log


def test_the_pola_query_backward_compiles_for_the_blackwell_gpus_in_the_form_each_takes(tmp_path):
    """sm_100 (B200) and sm_120 (RTX 50xx) are targets of the tool. At Pola-PVT's head dim 64 the query backward
    runs its two weight-gradient products as one on sm_120, whose tensor-core products are one warp's each as on
    sm_8x (``KernelTarget.warp_products``): its default config there spills a few bytes (8 with Triton 3.7), where
    with the two square products it spilled about 2 KB per thread; sm_100 keeps the two."""
    log = run_tool([PYTHON, 'tools/check_triton_kernels.py', '--untuned', '--ops', 'pola', '--targets', 'sm_100',
                    'sm_120', '--head-dims', '64', '--dtypes', 'bfloat16', '--kernels', '_pola_bwd_queries'],
                   env=dict(TRITON_CACHE_DIR=str(tmp_path), TRITON_INTERPRET='0'))
    rows = {row[3].strip(): row for row in (line.split('|') for line in log.splitlines())
            if row[1:3] == [' pola ', ' _pola_bwd_queries ']}
    assert set(rows) == {'sm_100', 'sm_120'}, log
    assert 'JOIN=True' in rows['sm_120'][6] and 'JOIN' not in rows['sm_100'][6], log  # a False flag is not shown
    assert int(rows['sm_120'][9]) <= 64 and rows['sm_120'][10].strip().startswith('ok'), log
    assert ' 0 failed' in log, log


def test_every_kernel_passes_tritons_front_end_for_sm_80_and_sm_90(tmp_path):
    """What the interpreter lets pass and a GPU's compiler refuses (a value whose type changes inside a loop,
    a compile-time branch of one target) fails here: every kernel of every op, through Triton's front end,
    with the launch options the ops pick on an A100 and an H100 (the branches by head dim and dtype)."""
    from mmpola.ops import OPS
    log = run_tool([PYTHON, 'tools/check_triton_kernels.py', '--front-end', '--targets', 'sm_80', 'sm_90',
                    '--dtypes', 'bfloat16', 'float32', '--head-dims', '32', '64'],
                   env=dict(TRITON_CACHE_DIR=str(tmp_path), TRITON_INTERPRET='0'))
    rows = [line.split('|') for line in log.splitlines() if line.startswith('| ') and 'parsed' in line]
    ops = {row[1].strip() for row in rows}
    assert ops == {name for name, op in OPS.items() if 'triton' in op.impls} | {'depthwise', 'recompute'}, log[-2000:]
    # the Pola query backward's two forms of dL/dW (JOIN) both parsed
    assert {'JOIN=True' in row[6] for row in rows if row[2].strip() == '_pola_bwd_queries'} == {True, False}
    assert ' 0 failed' in log and 'FAILED' not in log, log[-3000:]


def test_the_tool_says_which_inputs_an_op_turns_down_on_a_99_kib_gpu(tmp_path):
    """On sm_86 / sm_89 the ops decline float32 at head dim 64 (their kernels do not fit 99 KiB) before
    any launch: one row saying so, nothing compiled, nothing failed."""
    log = run_tool([PYTHON, 'tools/check_triton_kernels.py', '--ops', 'pola', '--targets', 'sm_86', 'sm_89',
                    '--head-dims', '64', '--dtypes', 'float32'],
                   env=dict(TRITON_CACHE_DIR=str(tmp_path), TRITON_INTERPRET='0'))
    for target in ('sm_86', 'sm_89'):
        assert (f"| pola | - | {target} | float32 | 64 | - | - | - | - | not run: attn_impl='triton' (pola_attention) "
                'cannot run here: this GPU gives a block 99 KiB of shared memory') in log, log
    assert '0 kernels compiled for sm_86, sm_89' in log and '0 failed; 2 (op, dtype, head dim) not run' in log


# A GPU that gives a block no shared memory at all: no config of any launch fits it (in a subprocess: the
# kernels must be compiled, not interpreted, which is decided when Triton is imported)
NO_SHARED_MEMORY = """
import sys
sys.argv = ['check_triton_kernels.py']
sys.path.insert(0, 'tools')
import check_triton_kernels as tool
tool.GPUS['tiny'] = tool.GPU('tiny', 86, 32, 0, 8)
for row in tool.check_item(('tiny', 'flatten', 'float32', 16, ('_token_stats_kernel', '_key_reduce_kernel'), False,
                            False)):
    print('ROW', row['kernel'], row['failed'], row['status'])
"""


# InLine's key backward on a 99 KiB GPU whose default config is made not to fit: the first tuned config that
# fits runs instead, and --untuned compiles it after the default
FALLBACK = """
import sys
sys.argv = ['check_triton_kernels.py']
sys.path.insert(0, 'tools')
import check_triton_kernels as tool
import mmpola.ops.inline_triton as inline
inline._GPU_DEFAULTS[64] = dict(BLOCK=256, num_warps=4)  # 152 KiB in float16
for row in tool.check_item(('sm_86', 'inline', 'float16', 64, ('_inline_bwd_key_kernel',), False, True)):
    print('ROW', row['untuned'], row['over'], row['failed'], row['config'], '|', row['status'])
"""


def test_untuned_compiles_what_runs_where_the_default_does_not_fit(tmp_path):
    log = run_tool([PYTHON, '-c', FALLBACK], env=dict(TRITON_CACHE_DIR=str(tmp_path), TRITON_INTERPRET='0'))
    rows = [line.split(' ', 4)[1:] for line in log.splitlines() if line.startswith('ROW ')]
    assert [row[:3] for row in rows] == [['default', 'True', 'False'], ['fallback', 'False', 'False']], log
    assert 'BLOCK=256' in rows[0][3] and 'the first tuned config that fits runs instead' in rows[0][3], log
    assert 'BLOCK=32' in rows[1][3], log


def test_a_launch_none_of_whose_configs_fits_fails(tmp_path):
    log = run_tool([PYTHON, '-c', NO_SHARED_MEMORY], env=dict(TRITON_CACHE_DIR=str(tmp_path), TRITON_INTERPRET='0'))
    rows = [line.split(' ', 3)[1:] for line in log.splitlines() if line.startswith('ROW ')]
    assert rows and {kernel for kernel, _, _ in rows} == {'_token_stats_kernel', '_key_reduce_kernel'}, log
    assert all(failed == 'True' and status.startswith('FAILED: ') and 'KiB of shared memory > 0 KiB' in status
               for _, failed, status in rows), log


# A backbone's forward and backward at detector input sizes (multiples of 32, as mmdet pads them), recorded
# for an H100 with the depthwise convolutions on their Triton kernels; prints, per size, the compilations
# (kernel configs x Triton's specialisation attributes) not needed at an earlier size, and the most
# attribute sets of one kernel config
SIZES_SCRIPT = """
import contextlib
import sys
sys.path.insert(0, 'tools')
import torch
import check_triton_kernels as tool
from benchmark import all_backbones
from benchmark_host import build_narrowed
from mmpola.ops.triton_support import dry_run
gpu = tool.GPUS['sm_90']
for name in sys.argv[1:]:
    arch, _, amp = name.partition('@')  # NAME@float16: under autocast, as a detector's --amp trains
    model = build_narrowed(*all_backbones()[arch])  # Triton attention, train mode, 16 channels per head
    autocast = torch.autocast('cpu', getattr(torch, amp)) if amp else contextlib.nullcontext()
    seen = {}
    sizes = [(256, 384), (288, 416), (320, 352), (352, 480), (224, 352)]
    if amp:  # the CPU computes in half slowly: smaller maps, their token counts as varied
        sizes = [(128, 192), (160, 224), (96, 288), (192, 160), (224, 96)]
    for height, width in sizes:
        with dry_run(gpu.kernel_target()) as launches, autocast:
            outs = model(torch.randn(2, 3, height, width))
            sum(out.float().mean() for out in outs).backward()
        found = tool.specialisations(launches, gpu)
        new = sum(len(attrs - seen.get(key, set())) for key, attrs in found.items())
        for key, attrs in found.items():
            seen.setdefault(key, set()).update(attrs)
        print(name, 'SIZE', height, width, 'new', new)
    print(name, 'KERNELS', sorted({key[0] for key in seen}))
    print(name, 'MOST', max(len(attrs) for attrs in seen.values()))
"""

def test_new_detector_input_sizes_compile_no_new_kernel_variants_after_the_first_few(tmp_path):
    """A detector's batches change the input size at every iteration; Triton compiles a kernel config again
    for each new combination of its arguments' divisibility by 16. The attention and depthwise kernels
    take that only from token counts (their strides are multiples of the channels): at most two variants
    of a config, all met in the first sizes, never a compilation per iteration. The backbones are the host
    benchmark's narrowed layouts (the same layers, kernels and token counts, 16 channels per head, so that the
    library's operators around the recorded launches cost little on the CPU), all in one process; Pola-Swin-T also
    under float16 autocast, where the kernels read and write half tensors and casts join the launches."""
    models = ['pola-pvt-t', 'pola-swin-t', 'flatten-pvt-t', 'pola-swin-t@float16']
    log = run_tool([PYTHON, '-c', SIZES_SCRIPT, *models],
                   env=dict(TRITON_CACHE_DIR=str(tmp_path), TRITON_INTERPRET='0', MMPOLA_DEPTHWISE_CONV='triton',
                            MMPOLA_NO_COMPILE='1'))
    for model in models:
        lines = [line.split(' ', 1)[1] for line in log.splitlines() if line.startswith(f'{model} ')]
        new = [int(line.split()[-1]) for line in lines if line.startswith('SIZE ')]
        kernels = next(line for line in lines if line.startswith('KERNELS '))
        assert len(new) == 5 and new[0] > 0 and new[2:] == [0, 0, 0], (model, log[-3000:])
        assert '_dw_conv_kernel' in kernels, (model, kernels)
        most = next(line for line in lines if line.startswith('MOST '))
        assert int(most.split()[1]) <= 2, (model, log[-3000:])
