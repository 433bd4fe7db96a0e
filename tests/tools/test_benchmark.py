"""tools/benchmark.py takes its cases from the package's registries and tables: a registered
implementation, op or preset appears without editing the tool (no timing is asserted)."""
import inspect
import os
import re
import sys

import pytest
import torch

from mmpola.models.backbones import PRESETS
from mmpola.ops import IMPLEMENTATION_VARIABLES, OPS, pola_attention_reference, register_attention_impl
from tests.fixtures.ops import kernels_compiled, op_tables_restored
from tests.fixtures.paths import PYTHON
from tests.fixtures.runs import run_tool
from tests.fixtures.tools import load_tool, table_rows

BENCH = load_tool('benchmark')


@pytest.fixture(autouse=True)
def _implementation_variables_restored():
    """The tool's kernel options (--dwconv-impl, --recompute-impl, --sdpa-impl) set mmpola's implementation
    variables for the whole run, in os.environ: each test's are undone after it, so that no test runs with another's."""
    saved = {variable: os.environ.get(variable) for variable in IMPLEMENTATION_VARIABLES}
    yield
    for variable, value in saved.items():
        if value is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = value


def test_backbone_cases_are_every_preset_at_every_size():
    cases = BENCH.all_backbones()
    assert {type_name for type_name, _ in cases.values()} >= {p.name for p in PRESETS}
    assert cases['pola-pvt-t'] == ('PolaPVT', dict(arch='tiny'))
    assert cases['flatten-swin-b'] == ('FLattenSwin', dict(arch='base'))
    assert cases['polaformer++-b5'] == ('PolaPP', dict(arch='b5'))
    assert set(BENCH.DEFAULT_BACKBONES) <= set(cases) and 'pola-swin-b-384' in BENCH.pola_backbones()
    assert cases['inline-cswin-b-384'] == ('InLineCSWin', dict(arch='base_384'))
    assert cases['flatten-pvtv2-b0'] == ('FLattenPVTv2', dict(arch='b0'))
    # every other kind on every architecture, at its first size
    assert cases['pola-cswin-t'] == ('CSWinBackbone', dict(arch='tiny', attn=dict(type='pola')))
    assert cases['softmax-deit-t'] == ('ViTBackbone', dict(arch='tiny', attn_type='S'))
    assert 'flatten-cswin-t' in cases and not any(name.startswith('pacs-') for name in cases)


def test_attention_cases_follow_the_op_registry():
    assert set(BENCH.attention_ops()) == set(OPS)
    assert BENCH.attention_impls('pola') == ['auto', 'fast', 'reference', 'triton', 'fast+compile']
    with op_tables_restored('pola'):
        register_attention_impl('pola', 'bench_extra', pola_attention_reference)
        assert 'bench_extra' in BENCH.attention_impls('pola') and 'bench_extra' not in BENCH.attention_impls('pacs')
        args = BENCH.parse_args(['attention', '--impls', 'bench_extra', '--kinds', 'pola'])
        assert args.impls == ['bench_extra']
    assert 'bench_extra' not in BENCH.attention_impls('pola')
    # `make bench` runs the default cases; PolaFormer++-B4's first stage (PaCS's widest heads) is asked for by name
    assert 'polapp-b4-s1@800x1344' not in BENCH.parse_args(['attention']).cases
    assert BENCH.parse_args(['attention', '--cases', 'polapp-b4-s1@800x1344']).cases == ['polapp-b4-s1@800x1344']


def test_every_op_runs_through_the_generic_case():
    """One forward + backward of each op on its example inputs, as the benchmark times them."""
    for kind in OPS:
        leaves, options, grad_out = BENCH.attention_inputs('pvt-s1@224', torch.device('cpu'), 0, kind)
        with BENCH.core_impl(kind, 'fast') as impl:
            forward, forward_backward, clear = BENCH.attention_passes(leaves, options, grad_out, impl, kind)
            forward_backward()
        assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in leaves), kind


def test_operator_count_sees_forward_backward_kernels_and_host_reads():
    linear = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    total, kernels, syncs = BENCH.count_dispatched_ops(lambda: linear(x).view(-1).sum().item())
    assert syncs == 1 and kernels < total  # .item() reads the device; view() launches nothing
    out = linear(x).sum()
    assert BENCH.count_dispatched_ops(out.backward)[1] >= 2  # the backward's kernels are counted too
    # reshape of a non-contiguous tensor: one copy kernel (clone), its _unsafe_view launches nothing
    t = torch.randn(3, 4).t()
    assert BENCH.count_dispatched_ops(lambda: t.reshape(-1))[1] == 1


def test_runnable_implementations_skip_those_for_another_device_with_the_reason(monkeypatch):
    kernels_compiled(monkeypatch)
    impls, skipped = BENCH.runnable_impls('pola', ['reference', 'fast', 'triton'], torch.device('cpu'), torch.float32)
    assert impls == ['reference', 'fast']
    assert len(skipped) == 1 and skipped[0].startswith('pola triton: the Triton kernels run on CUDA tensors')


def test_layers_times_the_value_conv_in_both_layouts_and_implementations(capsys, monkeypatch):
    conv, v = BENCH.value_conv_inputs('pvt-s1@224', torch.device('cpu'), torch.float32, 'channels_last', 0)
    _, dense = BENCH.value_conv_inputs('pvt-s1@224', torch.device('cpu'), torch.float32, 'contiguous', 0)
    assert v.shape == (2, 64, 56, 56) and v.is_contiguous(memory_format=torch.channels_last)
    assert dense.is_contiguous() and torch.equal(v, dense)
    assert conv.groups == 64 and conv.kernel_size == (5, 5)
    _, heads = BENCH.value_conv_inputs('swin-s1@224', torch.device('cpu'), torch.float32, 'projection', 0)
    assert heads.shape == (2, 3, 32, 56, 56) and heads._base.shape == (2, 56 * 56, 4, 3, 32)
    assert BENCH.conv_maps(heads) == (6, 32, 56, 56)
    # a small case: the Triton rows run through the interpreter here
    monkeypatch.setitem(BENCH.ATTENTION_CASES, 'tiny', (1, 1, (9, 11), 32))
    common = ['layers', '--cases', 'tiny', '--dtypes', 'float32', '--repeat', '1', '--no-memory']
    BENCH.main(common + ['--new-shapes', '2'])
    rows = [line.split('|') for line in capsys.readouterr().out.splitlines() if line.startswith('| dwconv 5x5 |')]
    assert [(row[5].strip(), row[6].strip()) for row in rows] == list(BENCH.LAYER_VARIANTS)
    assert all(float(row[-2]) > 0 for row in rows)  # the new shapes' column
    kernels_compiled(monkeypatch)  # where the kernels cannot run: their rows are left out, with why
    BENCH.main(common + ['--new-shapes', '0'])
    out = capsys.readouterr().out
    assert [line.split('|')[5].strip() for line in out.splitlines() if line.startswith('| dwconv 5x5 |')] == \
        ['torch', 'torch', 'torch']
    assert 'skipped triton: the Triton kernels run on CUDA tensors' in out


def test_layers_times_the_spatial_reduction_of_pvt_cases_in_both_layouts(capsys, monkeypatch):
    conv, x = BENCH.sr_conv_inputs('pvt-s1@224', torch.device('cpu'), torch.float32, 'channels_last', 0)
    _, dense = BENCH.sr_conv_inputs('pvt-s1@224', torch.device('cpu'), torch.float32, 'contiguous', 0)
    assert x.shape == (2, 64, 56, 56) and x.is_contiguous(memory_format=torch.channels_last)
    assert dense.is_contiguous() and torch.equal(x, dense)
    assert conv.kernel_size == (8, 8) and conv.stride == (8, 8)  # PVT stage 1
    monkeypatch.setitem(BENCH.ATTENTION_CASES, 'pvt-s2@tiny', (1, 2, (16, 24), 16))
    BENCH.main(['layers', '--cases', 'pvt-s2@tiny', '--dtypes', 'float32', '--repeat', '1', '--no-memory',
                '--impls', 'torch', '--new-shapes', '2'])
    rows = [line.split('|') for line in capsys.readouterr().out.splitlines() if line.startswith('| sr conv 4x4/4 |')]
    assert [(row[5].strip(), row[6].strip()) for row in rows] == list(BENCH.SR_VARIANTS)
    assert all(row[3].strip() == '1,32,16,24' and float(row[-2]) > 0 for row in rows)


def test_new_shapes_differ_from_the_timed_one_and_each_other():
    shapes = BENCH.new_shapes(2, 200, 336, 5)
    assert len(set(shapes)) == 5 and (2, 200, 336) not in shapes and all(s[0] == 2 for s in shapes)
    assert BENCH.new_shapes(12, 7, 7, 3) == [(13, 7, 7), (14, 7, 7), (15, 7, 7)]  # windows: their number changes
    assert all(h % 32 == 0 and w % 32 == 0 for _, h, w in BENCH.new_shapes(1, 800, 1344, 5, step=32))


def test_kernel_options(monkeypatch):
    args = BENCH.parse_args(['backbone', '--dwconv-impl', 'triton', '--new-sizes', '3', '--recompute-impl', 'torch'])
    assert args.dwconv_impl == 'triton' and args.new_sizes == 3 and args.recompute_impl == 'torch'
    assert BENCH.parse_args(['train', 'x.py', '--dwconv-impl', 'torch']).dwconv_impl == 'torch'
    assert BENCH.parse_args(['train', 'x.py', '--recompute-impl', 'triton']).recompute_impl == 'triton'
    assert BENCH.parse_args(['ops']).dwconv_impl is None and BENCH.parse_args(['ops']).recompute_impl is None
    assert BENCH.parse_args(['train', 'x.py', '--sdpa-impl', 'torch']).sdpa_impl == 'torch'
    assert BENCH.parse_args(['backbone']).sdpa_impl is None
    # each option sets the variable the models read (for the whole run); restored after the test
    monkeypatch.setenv('MMPOLA_SDPA', 'auto')
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    with pytest.raises(SystemExit, match='--device cuda'):
        BENCH.main(['backbone', '--device', 'cuda', '--models', 'pvt-t', '--sdpa-impl', 'torch', '--malloc', 'default'])
    assert os.environ['MMPOLA_SDPA'] == 'torch'


def test_an_implementation_that_turns_a_case_down_is_left_out_with_its_reason(capsys):
    """What an implementation checks only on the call (the Triton kernels' head dim against a GPU's shared
    memory) leaves its row out of that case, with the reason; the other rows are timed; no implementation
    left: no rows, no error."""
    from mmpola.ops.dispatch import AttnImplUnavailable

    def declining(q, *args, **kwargs):
        raise AttnImplUnavailable('heads of 64 channels do not fit this GPU')

    with op_tables_restored('pola'):
        register_attention_impl('pola', 'declining', declining)
        BENCH.main(['attention', '--kinds', 'pola', '--cases', 'pvt-s1@224', '--impls', 'fast', 'declining',
                    '--repeat', '1', '--no-memory', '--no-error'])
        out = capsys.readouterr().out
        assert [row.split('|')[5].strip() for row in out.splitlines() if row.startswith('| pola |')] == ['fast']
        assert 'skipped pola declining at pvt-s1@224: heads of 64 channels do not fit this GPU' in out
        BENCH.main(['attention', '--kinds', 'pola', '--cases', 'pvt-s1@224', '--impls', 'declining', '--repeat', '1',
                    '--no-memory', '--no-error'])
        assert 'skipped pola declining at pvt-s1@224' in capsys.readouterr().out


def test_operator_count_of_the_triton_path_counts_the_launches_apart(capsys, monkeypatch):
    """On the CPU, --attn-impl triton runs the launch code as on an H100 and counts its kernels apart
    (recorded, not run: no interpreter operators in the count); the depthwise convs here on the library
    convolution and the recomputing linear layers on the library's (their Triton kernels: the next tests)."""
    monkeypatch.setenv('MMPOLA_DEPTHWISE_CONV', 'auto')  # restored after the test
    monkeypatch.setenv('MMPOLA_RECOMPUTE', 'auto')
    BENCH.main(['ops', '--models', 'pola-pvt-t', '--size', '64x96', '--attn-impl', 'triton', '--dwconv-impl', 'torch',
                '--recompute-impl', 'torch'])
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith('| pola-pvt-t |'))
    cells = [cell.strip() for cell in row.strip('|').split('|')]
    assert cells[4].endswith('(+16 Triton)') and cells[6].endswith('(+16 Triton)'), row  # 8 layers, 2 + 2 each
    BENCH.main(['ops', '--models', 'pola-pvt-t', '--size', '64x96'])
    fast = next(line for line in capsys.readouterr().out.splitlines() if line.startswith('| pola-pvt-t |'))
    assert int(cells[4].split()[0]) < int(fast.split('|')[5])  # the fast path's feature maps are gone


def test_operator_count_reports_the_bytes_saved_for_backward_with_and_without_autocast(capsys):
    """'saved MiB': the distinct storages a training forward saves for its backward; under bf16 autocast the
    activations are half as wide, and the operator counts stay those of a forward without saved-tensor hooks."""
    BENCH.main(['ops', '--models', 'pola-pvt-t', '--size', '64x96', '--attn-impl', 'triton', '--dwconv-impl', 'torch'])
    fp32 = next(line for line in capsys.readouterr().out.splitlines() if line.startswith('| pola-pvt-t |'))
    BENCH.main(['ops', '--models', 'pola-pvt-t', '--size', '64x96', '--attn-impl', 'triton', '--dwconv-impl', 'torch',
                '--amp', 'bfloat16'])
    out = capsys.readouterr().out
    bf16 = next(line for line in out.splitlines() if line.startswith('| pola-pvt-t |'))
    saved = [float(row.strip(' |').split('|')[-1]) for row in (fp32, bf16)]
    assert 0 < saved[1] < 0.75 * saved[0], (fp32, bf16)
    assert 'Autocast: bfloat16' in out


@pytest.mark.parametrize('dwconv_impl', ['auto', 'triton'])
def test_operator_count_with_the_triton_depthwise_conv(capsys, monkeypatch, dwconv_impl):
    """As on a GPU by default ('auto'), or asked for, the value term's conv runs through its Triton kernels:
    one more launch per layer forward (the conv, which also adds the attention's output to the term where it
    writes it and multiplies the sum by the gate), two backward (input and weight gradients); against the library
    convolution the forward runs, per layer, no library convolution, no addition and no multiplication by the gate,
    and in the 6 layers of several heads no copy of the values as B * h maps."""
    monkeypatch.setenv('MMPOLA_DEPTHWISE_CONV', 'auto')  # restored after the test
    monkeypatch.setenv('MMPOLA_RECOMPUTE', 'auto')
    rows = {}
    for impl in (dwconv_impl, 'torch'):
        BENCH.main(['ops', '--models', 'pola-pvt-t', '--size', '64x96', '--attn-impl', 'triton', '--dwconv-impl',
                    impl, '--recompute-impl', 'torch'])
        out = capsys.readouterr().out
        row = next(line for line in out.splitlines() if line.startswith('| pola-pvt-t |'))
        rows[impl] = [cell.strip() for cell in row.strip('|').split('|')]
        if impl == dwconv_impl:
            assert f"mmpola's depthwise convolutions: {dwconv_impl} (MMPOLA_DEPTHWISE_CONV" in out
    cells = rows[dwconv_impl]
    assert cells[4].endswith('(+24 Triton)') and cells[6].endswith('(+32 Triton)'), cells
    assert int(cells[4].split()[0]) == int(rows['torch'][4].split()[0]) - 8 * 3 - 6, rows


def test_operator_count_with_the_recomputing_linear_layers(capsys, monkeypatch):
    """With MMPOLA_RECOMPUTE=triton (on a GPU): in each of Pola-PVT-T's 8 blocks the MLP's GELU gradient is one Triton
    launch in place of autograd's kernel (and its forward one in place of the library's GELU: it adds fc1's
    bias, and sums its gradient), the gate's two products' gradients one in place of two, and each of
    the two LayerNorms one launch in place of the library's LayerNorm forward and one in place of its
    backward (plus the sum of its partial sums); the attention's two projections of the normalised tokens are
    one product on both paths (their weights and biases concatenated in the forward), whose operands' gradients
    one launch gathers, with the values' two; the MLP's LayerNorm's kernel adds the attention's output
    (times its drop-path factor) to the residual stream, and in the backward adds the residual stream's two
    gradients and writes the attention's. The forward saves neither the GELU's output, nor the
    gated product, nor the normalised rows (here float32, one tensor for both projections): 2 blocks x batch
    2 x the float32 tokens of (16x24, 8x12, 4x6, 2x3) x (MLP hidden 512, 1024, 1280, 2048 + three times the
    channels 64, 128, 320, 512)."""
    monkeypatch.setenv('MMPOLA_DEPTHWISE_CONV', 'auto')  # restored after the test
    monkeypatch.setenv('MMPOLA_RECOMPUTE', 'auto')
    monkeypatch.delenv('MMPOLA_SDPA', raising=False)
    cells = {}
    for impl in ('torch', 'triton'):
        BENCH.main(['ops', '--models', 'pola-pvt-t', '--size', '64x96', '--attn-impl', 'triton', '--dwconv-impl',
                    'torch', '--recompute-impl', impl])
        out = capsys.readouterr().out
        row = next(line for line in out.splitlines() if line.startswith('| pola-pvt-t |'))
        cells[impl] = [cell.strip() for cell in row.strip('|').split('|')]
    assert "linear layers of the MLPs and gates, and after LayerNorms: triton (MMPOLA_RECOMPUTE" in out
    assert "the softmax kinds' scaled_dot_product_attention: auto (MMPOLA_SDPA; 'auto': on CUDA torch's backends " \
        "without cuDNN's attention" in out
    # forward, per block: two LayerNorms fewer, and the GELU a launch of its kernel (which adds fc1's bias: a
    # matrix product without it in place of fc1's, as many); the attention's output added to the residual stream
    # by the MLP's LayerNorm's kernel, with its drop-path factor (7 blocks of a nonzero rate): 8 additions and 7
    # multiplications fewer; the MLP's output added by the next block's first LayerNorm's kernel (a pair of blocks
    # per stage; 3 of a nonzero rate): 4 additions and 3 multiplications fewer; each stage's patch embedding's
    # LayerNorm and the addition of its positional encoding one launch (4 norms and 4 additions fewer)
    assert cells['torch'][4].endswith('(+16 Triton)') and cells['triton'][4].endswith('(+44 Triton)'), cells
    assert int(cells['triton'][4].split()[0]) == int(cells['torch'][4].split()[0]) - 16 - 8 - 8 - 7 - 4 - 3 - 8, \
        cells
    # backward, per block: the GELU's gradient, two LayerNorm backwards and the gate's two products fewer; two
    # sums more (of the norms' partial sums); the sum of the residual stream's two gradients before the MLP and the
    # drop-path factor's product fewer (the LayerNorm's kernel writes both gradients); the stack of the
    # projections' operand gradients and the sum of the values' two gradients: a launch of the operands' kernel
    # (two kernels fewer); between the blocks of a stage, as before the MLP: 4 + 3 fewer; the sum of the two
    # gradients of a stage's first block's input (its norm's and the rest of the block's) added by that norm's
    # kernel: 4 fewer; the patch embeddings' LayerNorm backwards a launch each and the sum of its partial sums (as
    # many kernels)
    assert cells['torch'][6].endswith('(+16 Triton)') and cells['triton'][6].endswith('(+60 Triton)'), cells
    assert int(cells['triton'][6].split()[0]) == (int(cells['torch'][6].split()[0]) - 8 - 16 - 16 + 16 - 8 - 7
                                                  - 16 - 4 - 3 - 4), cells
    tokens = (16 * 24, 8 * 12, 4 * 6, 2 * 3)
    widths = (512 + 3 * 64, 1024 + 3 * 128, 1280 + 3 * 320, 2048 + 3 * 512)
    not_kept = 2 * 2 * sum(n * w for n, w in zip(tokens, widths)) * 4 / 2 ** 20
    assert float(cells['torch'][-1]) - float(cells['triton'][-1]) == pytest.approx(not_kept, abs=0.1), cells



def test_operator_count_of_inference(capsys, monkeypatch):
    """--inference counts one eval-mode forward without autograd: with MMPOLA_RECOMPUTE=triton (on a GPU), each of
    Pola-PVT-T's 16 LayerNorms before linear layers is one Triton launch in place of the library's LayerNorm (and under
    autocast the cast of its float32 rows: 16 casts; the attention's two projections are one product on both paths,
    with their weights and biases concatenated, cast and kept), the attention's output added to the residual
    stream by the MLP's LayerNorm's kernel (8 additions fewer) and the MLP's by the next block's first LayerNorm's
    kernel, in each stage's pair of blocks (4 fewer); a stage's last MLP's output added by one kernel that also
    writes the bfloat16 copy the next stage's convolution reads and the sum in the layout of the stage's output map
    (stages 1-3: 3 launches in place of 3 additions, 3 casts and 3 copies to the maps); each stage's patch
    embedding's LayerNorm and the addition of its positional encoding one launch (4 norms and 4 additions fewer, and
    the 4 casts of the convolution's half output to float32 that the library's LayerNorm takes under a GPU's
    autocast); no backward columns."""
    monkeypatch.setenv('MMPOLA_DEPTHWISE_CONV', 'auto')  # restored after the test
    monkeypatch.setenv('MMPOLA_RECOMPUTE', 'auto')
    monkeypatch.delenv('MMPOLA_SDPA', raising=False)
    cells = {}
    for impl in ('torch', 'triton'):
        BENCH.main(['ops', '--models', 'pola-pvt-t', '--size', '64x96', '--attn-impl', 'triton', '--dwconv-impl',
                    'torch', '--recompute-impl', impl, '--amp', 'bfloat16', '--inference'])
        out = capsys.readouterr().out
        row = next(line for line in out.splitlines() if line.startswith('| pola-pvt-t |'))
        cells[impl] = [cell.strip() for cell in row.strip('|').split('|')]
    assert 'in eval mode without autograd' in out
    assert cells['triton'][5:8] == ['-', '-', '0'] and cells['triton'][-1] == '-', cells
    assert cells['torch'][4].endswith('(+16 Triton)') and cells['triton'][4].endswith('(+39 Triton)'), cells
    assert int(cells['triton'][4].split()[0]) == int(cells['torch'][4].split()[0]) - 16 - 16 - 8 - 4 - 9 - 8 - 4, cells



ROOF = load_tool('benchmark_roofline')


def test_roofline_bound_of_a_product_and_of_an_elementwise_kernel():
    """A kernel's bound is the larger of its FLOPs at the peak rate of its dtype and its bytes at the bandwidth:
    a bf16 product of square 1024 matrices is bound by its arithmetic, an addition by its bytes (an expanded
    operand counts its distinct elements once)."""
    peaks = ROOF.GPUS['h200']
    estimate = ROOF.Roofline(peaks)
    a, b = torch.randn(1024, 1024, dtype=torch.bfloat16), torch.randn(1024, 1024, dtype=torch.bfloat16)
    row = torch.randn(512)
    x = torch.randn(512, 512)
    BENCH.count_dispatched_ops(lambda: (a @ b, x + row.expand(512, 512)), estimate)
    kernels, flops, nbytes, seconds = estimate.rows['mm']
    assert (kernels, flops, nbytes) == (1, 2 * 1024**3, 3 * 1024 * 1024 * 2)
    assert seconds == pytest.approx(2 * 1024**3 / peaks.half_flops) and seconds > nbytes / peaks.bandwidth
    kernels, flops, nbytes, seconds = estimate.rows['add']
    assert (kernels, flops, nbytes) == (1, 0, (2 * 512 * 512 + 512) * 4)
    assert seconds == pytest.approx(nbytes / peaks.bandwidth)
    assert estimate.totals() == (2, 2 * 1024**3, 3 * 1024 * 1024 * 2 + nbytes, pytest.approx(
        2 * 1024**3 / peaks.half_flops + nbytes / peaks.bandwidth))
    assert [kind for kind, *_ in estimate.top(2)] == ['mm', 'add']
    # float32 products run at the float32 rate
    fp32 = ROOF.Roofline(peaks)
    BENCH.count_dispatched_ops(lambda: x @ x, fp32)
    assert fp32.rows['mm'][3] == pytest.approx(2 * 512**3 / peaks.float_flops)


def test_roofline_by_source_names_the_models_line_in_the_forward_and_the_autograd_node_in_the_backward():
    """With ``by_source`` each operator's kind names where it comes from: the line of the models' code that
    dispatched it in the forward (not torch's modules nor the tools' frames), the autograd node that ran it in the
    backward (autograd's stack of a projection's operands: ``UnbindBackward0``)."""
    from mmpola.models import layers
    norm, linear = torch.nn.LayerNorm(8), torch.nn.Linear(8, 24)
    x = torch.randn(2, 5, 8, requires_grad=True)
    forward, backward = (ROOF.Roofline(ROOF.GPUS['h100'], by_source=True) for _ in range(2))
    outs = []
    BENCH.count_dispatched_ops(lambda: outs.append(layers.norm_linear(norm, linear, x, chunk=8)), forward)
    loss = sum(t.sum() for t in outs[0])
    BENCH.count_dispatched_ops(loss.backward, backward)
    sources = {kind.split(' @ ')[0]: kind.split(' @ ')[1] for kind in forward.rows}
    assert sources['native_layer_norm'].startswith('layers.py:') and sources['addmm'].startswith('layers.py:')
    assert sources['native_layer_norm'] != sources['addmm'], sources
    assert {'stack @ UnbindBackward0', 'mm @ AddmmBackward0', 'native_layer_norm_backward @ NativeLayerNormBackward0'
            } <= set(backward.rows), dict(backward.rows)
    plain = ROOF.Roofline(ROOF.GPUS['h100'])
    BENCH.count_dispatched_ops(lambda: layers.norm_linear(norm, linear, x, chunk=8), plain)
    assert set(plain.rows) == {kind.split(' @ ')[0] for kind in forward.rows}


def test_roofline_by_source_names_the_line_that_made_a_backward_node_where_anomaly_mode_recorded_it():
    """Under autograd's anomaly mode (which ``ops --by-source`` turns on for the forward, its NaN checks off) a
    backward operator's source also names the line of the models' code that made its node; the counts are those
    of a count without it."""
    from mmpola.models import layers
    norm, linear = torch.nn.LayerNorm(8), torch.nn.Linear(8, 24)
    x = torch.randn(2, 5, 8, requires_grad=True)
    rows = []
    for anomaly in (True, False):
        for tensor in (x, *norm.parameters(), *linear.parameters()):
            tensor.grad = None  # no accumulation in the second backward
        forward, backward = (ROOF.Roofline(ROOF.GPUS['h100'], by_source=True) for _ in range(2))
        outs = []
        with torch.autograd.set_detect_anomaly(anomaly, check_nan=False):
            BENCH.count_dispatched_ops(lambda: outs.append(layers.norm_linear(norm, linear, x, chunk=8)), forward)
        BENCH.count_dispatched_ops(sum(t.sum() for t in outs[0]).backward, backward)
        rows.append(dict(backward.rows))
    stack = [kind for kind in rows[0] if kind.startswith('stack @ UnbindBackward0 layers.py:')]
    assert len(stack) == 1, rows[0]
    line = int(stack[0].rsplit(':', 1)[1])
    assert 'unbind' in inspect.getsource(layers).splitlines()[line - 1], stack
    totals = [[sum(row[i] for row in counted.values()) for i in range(3)] for counted in rows]
    assert totals[0] == totals[1], totals  # kernels, FLOPs and bytes
    assert {kind.rsplit(' ', 1)[0] if ' layers.py:' in kind else kind for kind in rows[0]} == set(rows[1])


def test_roofline_counts_fused_attention_grouped_convolutions_and_triton_launches():
    """The CPU's fused attention has no entry in torch's flop counter: its two products are counted forward (4 B
    H N M d FLOPs) and its backward with the recomputed scores (10 B H N M d), as the counter counts CUDA's;
    a Triton launch counts the bytes of its tensor arguments."""
    from mmpola.ops.triton_support import Launch
    B, H, N, M, d = 2, 3, 64, 32, 16
    q = torch.randn(B, H, N, d, requires_grad=True)
    k, v = torch.randn(B, H, M, d, requires_grad=True), torch.randn(B, H, M, d, requires_grad=True)
    forward, backward = ROOF.Roofline(ROOF.GPUS['h100']), ROOF.Roofline(ROOF.GPUS['h100'])
    out = []
    BENCH.count_dispatched_ops(lambda: out.append(torch.nn.functional.scaled_dot_product_attention(q, k, v)), forward)
    BENCH.count_dispatched_ops(out[0].sum().backward, backward)
    assert sum(row[1] for row in forward.rows.values()) == 4 * B * H * N * M * d, dict(forward.rows)
    assert sum(row[1] for row in backward.rows.values()) == 10 * B * H * N * M * d, dict(backward.rows)

    # a depthwise convolution's backward: its forward's products once per gradient (torch's counter counts its
    # weight gradient's channels times over)
    conv = torch.nn.Conv2d(8, 8, 5, padding=2, groups=8)
    x = torch.randn(2, 8, 16, 16, requires_grad=True)
    conv_fwd, conv_bwd = ROOF.Roofline(ROOF.GPUS['h100']), ROOF.Roofline(ROOF.GPUS['h100'])
    BENCH.count_dispatched_ops(lambda: out.append(conv(x)), conv_fwd)
    BENCH.count_dispatched_ops(out[1].sum().backward, conv_bwd)
    assert conv_fwd.rows['convolution'][1] == 2 * 2 * 8 * 16 * 16 * 25
    assert conv_bwd.rows['convolution_backward'][1] == 2 * conv_fwd.rows['convolution'][1]

    def kernel():  # stands for a triton.jit function
        pass

    launches = ROOF.Roofline(ROOF.GPUS['a100'])
    launches.add_launches([Launch(kernel, (1, ), (q.detach(), k.detach(), 3, 0.5), {}, None)])
    assert launches.rows['triton:kernel'][:3] == [1, 0, (B * H * N * d + B * H * M * d) * 4]
    # a tensor passed twice (the pointer of an absent bias) counts once
    launches.add_launches([Launch(kernel, (1, ), (q.detach(), k.detach(), k.detach(), 3), {}, None)])
    assert launches.rows['triton:kernel'][:3] == [2, 0, 2 * (B * H * N * d + B * H * M * d) * 4]


def test_operator_count_with_the_roofline_bound(capsys, monkeypatch):
    """--roofline GPU adds each pass's GFLOP, GB and bound, and --top N the kinds of kernel with the largest
    bounds, the Triton kernels of the dry run among them; only on the CPU, where the dry run records them."""
    monkeypatch.setenv('MMPOLA_DEPTHWISE_CONV', 'auto')  # restored after the test
    monkeypatch.setenv('MMPOLA_RECOMPUTE', 'auto')
    BENCH.main(['ops', '--models', 'pola-pvt-t', '--size', '64x96', '--attn-impl', 'triton', '--amp', 'bfloat16',
                '--roofline', 'h200', '--top', '30'])
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith('| model | input |'))
    row = next(line for line in out.splitlines() if line.startswith('| pola-pvt-t |'))
    assert header.strip(' |').split(' | ')[-6:] == ['fwd GFLOP', 'fwd GB', 'fwd bound ms', 'bwd GFLOP', 'bwd GB',
                                                     'bwd bound ms']
    cells = [float(cell) for cell in row.strip(' |').split('|')[-6:]]
    assert all(cell > 0 for cell in cells) and cells[3] > cells[0], row  # the backward has twice the products
    assert 'Roofline bound on NVIDIA H200 SXM' in out
    top = [line.split('|')[2:4] for line in out.splitlines() if line.startswith('| pola-pvt-t | ')][1:]
    assert {label.strip() for label, _ in top} == {'fwd', 'bwd'}
    kinds = {kind.strip() for _, kind in top}
    assert {'addmm', 'mm', 'triton:_pola_fwd_keys', 'triton:_dw_conv_kernel'} <= kinds, kinds
    args = BENCH.parse_args(['ops', '--roofline', 'h100'])
    with pytest.raises(SystemExit, match='--roofline is an estimate made on the CPU'):
        BENCH.bench_ops(args, torch.device('cuda'))


@pytest.mark.downstream
def test_backbone_rows_come_as_each_finishes_and_in_the_table(capsys):
    """Each backbone's time is printed as soon as it is measured (a run stopped before the table keeps it),
    then the table: fwd+bwd ms, the FLOP count, the scaling against the first size."""
    BENCH.main(['backbone', '--models', 'pola-pvt-t', 'pvt-t', '--sizes', '64x96', '96x128', '--repeat', '1',
                '--no-memory', '--backward'])
    out = capsys.readouterr().out
    lines = out.splitlines()
    progress = [line for line in lines if re.match(r'(pola-pvt-t|pvt-t) (64x96|96x128): [0-9.]+ ms fwd\+bwd$', line)]
    assert len(progress) == 4, out
    rows = [line for line in lines if line.startswith(('| pola-pvt-t |', '| pvt-t |'))]
    assert [row.split('|')[1:3] for row in rows] == [[' pola-pvt-t ', ' 64x96 '], [' pola-pvt-t ', ' 96x128 '],
                                                     [' pvt-t ', ' 64x96 '], [' pvt-t ', ' 96x128 ']]
    for row, line in zip(rows, progress):
        cells = [cell.strip() for cell in row.strip('|').split('|')]
        assert float(cells[3]) > 0 and cells[4] == line.split(': ')[1].split()[0]
    assert 'fwd+bwd: train mode' in out


def test_backbone_profile_writes_one_more_pass_of_each_row_as_train_does(tmp_path, capsys, monkeypatch):
    """`backbone --profile DIR` profiles one more pass after each row's timed ones: the chrome trace and the summary
    (Markdown, printed after the row's line, and JSON) with the forward and the backward as its parts; a profile
    that cannot run is one line, and the timed row stands."""
    import json
    BENCH.main(['backbone', '--models', 'pola-pvt-t', '--sizes', '64x96', '--batch', '2', '--repeat', '1',
                '--no-memory', '--backward', '--profile', str(tmp_path)])
    out = capsys.readouterr().out
    stem = 'pola-pvt-t_64x96_b2_fwd_bwd_float32'
    assert sorted(os.listdir(tmp_path)) == [f'{stem}_profile.json', f'{stem}_profile.md', f'{stem}_trace.json']
    summary = json.loads((tmp_path / f'{stem}_profile.json').read_text())
    assert {label: part['calls'] for label, part in summary['parts'].items()} == {'forward': 1, 'backward': 1}
    assert summary['aten_ops'] > 100 and summary['parts']['backward']['cpu_ms'] > 0
    text = (tmp_path / f'{stem}_profile.md').read_text()
    assert text.startswith('## Profile of one backbone pass (fwd+bwd): pola-pvt-t, cpu, autocast off, batch 2, '
                           'input 64x96')
    assert text in out and out.index('pola-pvt-t 64x96: ') < out.index(text) < out.index('| model | input |')
    assert '| rest (setting the gradients to None, the loss) |' in text
    assert json.loads((tmp_path / f'{stem}_trace.json').read_text())['traceEvents']

    def refused(self, parts, ranges=()):
        raise RuntimeError('Profiler is already enabled on this thread')

    # the module benchmark.py imports it from
    monkeypatch.setattr(sys.modules['benchmark_train'].IterationProfiler, 'start', refused)
    BENCH.main(['backbone', '--models', 'pola-pvt-t', '--sizes', '64x96', '--repeat', '1', '--no-memory',
                '--profile', str(tmp_path / 'refused')])
    out = capsys.readouterr().out
    assert ('pola-pvt-t, cpu, autocast off, batch 1, input 64x96: no profile (RuntimeError: Profiler is already '
            'enabled on this thread)') in out
    assert table_rows(out, 'pola-pvt-t') and not (tmp_path / 'refused').exists()


def test_backbone_table_on_a_gpu_has_the_hosts_time_of_each_pass(capsys):
    """On a GPU each pass is timed twice: with the device synchronised, and until it returned (the host's own
    time: close to the first where the host sets the pace); the table has a column for the second there."""
    times = []
    seconds, host = BENCH.time_pass(lambda: times.append(torch.randn(64, 64) @ torch.randn(64, 64)),
                                    torch.device('cpu'))
    assert 0 < host <= seconds and len(times) == 1
    args = BENCH.parse_args(['backbone', '--backward'])
    row = dict(model='pola-pvt-t', size='64x96', params=12.4e6, gmacs=0.3, ms=20.0, host_ms=18.5, runs=3,
               ms_per_mpx=1.0, scaling=1.0, gflops=30.0, memory={}, fresh=None)
    for host in (False, True):
        BENCH.print_backbone_table(args, [row], 100.0, host)
        lines = capsys.readouterr().out.splitlines()
        header = next(line for line in lines if line.startswith('| model |')).strip(' |').split(' | ')
        cells = next(line for line in lines if line.startswith('| pola-pvt-t |')).strip(' |').split(' | ')
        assert len(header) == len(cells) and ('host ms' in header) == host and ('18.5' in cells) == host, lines
        if host:
            assert cells[header.index('host ms')] == '18.5' and cells[header.index('fwd+bwd ms')] == '20.0'



@pytest.mark.parametrize('ours,theirs', [('softmax-pvtv2-b2', 'timm-pvt-v2-b2'), ('softmax-swin-t', 'timm-swin-t')])
def test_timm_references_drop_paths_as_mmpolas_layout_of_the_network(ours, theirs):
    """The timm reference of a softmax layout runs stochastic depth in the same blocks (first block none,
    the last at mmpola's preset's rate or timm's): the same work in a training step."""
    def drop_paths(name):
        model = BENCH.build_named_backbone(name)
        return [float(m.drop_prob) for m in model.modules() if type(m).__name__ == 'DropPath']

    mine, reference = drop_paths(ours), drop_paths(theirs)
    assert mine and reference and max(mine) > 0 and max(reference) > 0
    if ours == 'softmax-pvtv2-b2':
        assert max(reference) == pytest.approx(max(mine))


def _makefile_benchmark_commands(*targets):
    """The argument lists of every ``tools/benchmark.py`` command that ``make`` runs for ``targets`` (as
    ``make -n`` prints them; a shell loop's variable takes each of its values)."""
    import os.path as osp
    import shlex

    from tests.fixtures.paths import REPO
    # without what a step's command does when it fails (ON_FAIL: `|| echo ... >> file`)
    text = re.sub(r' \|\| echo "step [^\n]*', '', _make('-n', *targets, 'PY=python3').replace('\\\n', ' '))
    loop = re.compile(r'for (\w+) in ([^;]+); do(.*?)done')
    commands = []
    for line in text.splitlines():
        # each shell loop becomes its body once per value
        line = loop.sub(lambda m: ';'.join(m.group(3).replace(f'${m.group(1)}', v) for v in m.group(2).split()),
                        line)
        for segment in re.split(r'&&|;|&', re.sub(r'\d?>&?\S+', '', line)):
            argv = shlex.split(segment)
            if 'tools/benchmark.py' in argv:
                commands.append(argv[argv.index('tools/benchmark.py') + 1:])
    assert all(osp.isfile(osp.join(REPO, a)) for argv in commands for a in argv if a.startswith('configs/'))
    return commands


def _make(*args, check=True):
    """The output of ``make ARGS`` in the repository (it must succeed where ``check``; else (output, exit status))."""
    import subprocess

    from tests.fixtures.paths import REPO
    done = subprocess.run(['make', '--no-print-directory', *args], cwd=REPO, check=check, capture_output=True,
                          text=True)
    return done.stdout if check else (done.stdout, done.returncode)


def test_the_gpu_turn_runs_every_step_once_in_its_order_and_keeps_what_it_measured(tmp_path):
    """`make bench-gpu-turn GPU_LOG_DIR=DIR` runs the steps of bench-gpu-quick-train and bench-gpu-quick (every
    command of each) in the turn's order, with Python's output unbuffered, a failed command followed by the next,
    the output appended to DIR's log as it comes and the profiles packed into two files in DIR after each step; the
    failed commands listed at the end (their step, exit status and time), and the turn fails; run again, it goes on
    with the steps that have not run (a turn cut short by its time limit). Triton's tunings are kept on disk for the
    later processes."""
    import tarfile

    # a stand-in for Python: prints its arguments, writes a profile where asked, fails for `host`
    python = tmp_path / 'python'
    python.write_text('#!/bin/sh\necho "ran unbuffered=$PYTHONUNBUFFERED tuning=$TRITON_CACHE_AUTOTUNING '
                      'alloc=${PYTORCH_CUDA_ALLOC_CONF:-default} $*"\n'
                      'case "$*" in *--profile*) d=${*##*--profile }; mkdir -p "$d"; echo t > "$d/r_trace.json"; '
                      'echo p > "$d/r_profile.md";; esac\ncase "$*" in *" host "*) exit 3;; esac\n')
    python.chmod(0o755)
    logs, profiles, done = tmp_path / 'out', tmp_path / 'profiles', tmp_path / 'done'
    variables = [f'PY={python}', f'GPU_LOG_DIR={logs}', f'GPU_PROFILE_DIR={profiles}', f'GPU_TURN_DONE={done}']
    steps = _make('-s', '--eval=print-turn: ; @echo $(GPU_TURN_STEPS)', 'print-turn').split()
    sets = [_make('-s', f'--eval=print-set: ; @echo $({name})', 'print-set').split()
            for name in ('GPU_TRAIN_STEPS', 'GPU_BACKBONE_STEPS')]
    assert sorted(steps) == sorted(sets[0] + sets[1]) and len(set(steps)) == len(steps)
    assert steps[0] == 'train-targets'
    _, status = _make('bench-gpu-turn', *variables, check=False)
    log = (logs / 'bench-gpu-turn.log').read_text()
    assert re.findall(r'^== step (\S+)', log, re.M) == steps
    # the two failed host commands, listed after the last step (in the log too), and the turn's exit status
    assert status != 0
    assert re.findall(r'^step (\S+): exit (\d+) at \d\d:\d\d:\d\d$', log.split('== 2 command(s) failed')[1], re.M) == [
        ('host', '3'), ('forward', '3')]
    ran = [line.split(' ', 4)[4] for line in log.splitlines() if line.startswith('ran ')]
    # Python unbuffered, Triton's tunings kept on disk
    assert all(line.startswith('ran unbuffered=1 tuning=1 ') for line in log.splitlines() if line.startswith('ran '))
    # every command of the two sets, once, the failed host commands' followers too; a command's own environment
    # (the caching allocator's settings of one training command) reaches it
    commands = [re.sub(r'^(\w+=\S+ )*', '', line.split(' || echo "step ')[0])
                for target in ('bench-gpu-quick-train', 'bench-gpu-quick')
                for line in _make('-n', target, *variables).splitlines()]
    expected = [line.replace(f'{python} ', '', 1) for line in commands if line.startswith(str(python))]
    assert sorted(ran) == sorted(expected) and len(ran) == 23
    allocators = [line for line in log.splitlines() if line.startswith('ran ') and 'alloc=default' not in line]
    assert len(allocators) == 1, allocators
    assert 'alloc=expandable_segments:True tools/benchmark.py train ' in allocators[0]
    assert sum(' host ' in f' {command} ' for command in ran) == 2
    with tarfile.open(logs / 'profiles.tar.gz') as archive:
        assert [os.path.basename(name) for name in archive.getnames() if name != '.'] == ['r_profile.md']
    with tarfile.open(logs / 'traces.tar.gz') as archive:
        assert [os.path.basename(name) for name in archive.getnames()] == ['r_trace.json']
    # run again: only the steps without their mark
    for step in ('backbones', 'train-sdpa'):
        (done / step).unlink()
    (logs / 'bench-gpu-turn.log').unlink()
    assert _make('bench-gpu-turn', *variables, check=False)[1] == 0  # those two ran, and nothing failed
    assert not (logs / 'gpu-failed-commands').exists() or not (logs / 'gpu-failed-commands').read_text()
    assert re.findall(r'^== step (\S+)', (logs / 'bench-gpu-turn.log').read_text(), re.M) == ['backbones',
                                                                                            'train-sdpa']
    # bench-gpu-quick (outside a turn) likewise runs every command, lists the failed ones and fails
    out, status = _make('bench-gpu-quick', *variables, check=False)
    quick = [line for line in _make('-n', 'bench-gpu-quick', *variables).splitlines() if line.startswith(str(python))]
    assert status != 0 and len(re.findall('^ran ', out, re.M)) == len(quick) > 10
    assert re.findall(r'^step (\S+): exit 3 at ', out, re.M) == ['host', 'forward']


def test_every_benchmark_command_of_the_makefile_parses():
    """The GPU targets run only where a GPU is: their benchmark commands take the tool's own cases, models and
    options (argparse exits on any other)."""
    commands = _makefile_benchmark_commands('bench', 'bench-gpu', 'bench-gpu-quick-compile', 'bench-gpu-quick',
                                            'bench-gpu-quick-train')
    assert {argv[0] for argv in commands} == {'attention', 'backbone', 'scaling', 'amp', 'layers', 'train', 'host',
                                              'optim', 'memory'}
    # the warm-up loops: one command per model (and per case)
    warm = [argv[argv.index('--models') + 1] for argv in commands
            if argv[0] == 'backbone' and '--repeat' in argv and argv[argv.index('--repeat') + 1] == '1']
    assert {'pola-pvt-t', 'pola-swin-t', 'polaformer++-b4'} <= set(warm) and '$model' not in warm
    for argv in commands:
        args = BENCH.parse_args(argv)
        assert getattr(args, 'device', 'cpu') in ('cpu', 'cuda'), argv


HOST = load_tool('benchmark_host')
# the backbones the tools build from mmdet (their rows need it: the tests that run them are marked downstream)
MMDET_BACKBONES = {name for name, (type_name, _) in BENCH.all_backbones().items() if type_name.startswith('mmdet.')}


@pytest.mark.parametrize('amp', [None, 'bfloat16'])
@pytest.mark.parametrize('name', [pytest.param(name, marks=pytest.mark.downstream) if name in MMDET_BACKBONES else name
                                  for name in HOST.HOST_BACKBONES])
def test_host_layouts_dispatch_what_the_full_backbones_do(name, amp, monkeypatch):
    """`host` narrows each backbone to 16 channels per head: the same operators (kinds and counts) and Triton
    launches as the full backbone in a training step, at the same size, in float32 and under autocast."""
    from torch.utils._python_dispatch import TorchDispatchMode
    monkeypatch.setenv('MMPOLA_DEPTHWISE_CONV', 'auto')
    monkeypatch.setenv('MMPOLA_RECOMPUTE', 'auto')

    class Names(TorchDispatchMode):

        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.__name__)
            return func(*args, **(kwargs or {}))

    narrow = HOST.build_narrowed(*BENCH.all_backbones()[name])
    full = BENCH.build_named_backbone(name, 'triton')
    full.train()
    assert sum(p.numel() for p in narrow.parameters()) < sum(p.numel() for p in full.parameters()) / 3
    counts = []
    for model in (full, narrow):
        step = BENCH.backbone_pass(model, torch.randn(1, 3, 64, 96), backward=True, amp=amp)
        with BENCH.h100_dry_run() as launches:
            step()
            del launches[:]
            with Names() as names:
                step()
        counts.append((sorted(names.names), [getattr(launch.kernel, 'fn', launch.kernel) for launch in launches]))
    assert counts[0][0] == counts[1][0]
    assert [getattr(k, '__name__', k) for k in counts[0][1]] == [getattr(k, '__name__', k) for k in counts[1][1]]
    if name.startswith(('pvt', 'swin', 'timm')):  # mmdet's and timm's launch no Triton kernel
        assert not counts[1][1]
    elif not name.startswith('softmax'):  # mmpola's linear attentions launch theirs
        assert counts[1][1]


def test_a_training_pass_sets_the_gradients_to_none_without_walking_the_modules(monkeypatch):
    """Each pass starts from no gradients (two passes give one pass's), cleared over the parameters' list as an
    optimizer wrapper clears them, not by ``model.zero_grad``'s traversal of the modules (which would count in
    the host's time and Python calls)."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Conv2d(4, 4, 3))
    step = BENCH.backbone_pass(model, torch.randn(1, 3, 16, 16), backward=True)
    params = list(model.parameters())
    monkeypatch.setattr(model, 'zero_grad', lambda *args, **kwargs: pytest.fail('model.zero_grad called'))
    monkeypatch.setattr(model, 'named_modules', lambda *args, **kwargs: pytest.fail('modules walked'))
    step()
    once = [p.grad.clone() for p in params]
    step()
    for grad, param in zip(once, params):
        torch.testing.assert_close(param.grad, grad)


@pytest.mark.downstream
def test_host_times_the_narrowed_steps_with_their_counts(capsys, monkeypatch):
    """One row per backbone: times, Python calls, operators and (mmpola's) Triton launches of a training step, the
    rows timed in turn; --also-with adds mmpola's backbones with a variable set (--compare-recompute: the
    recomputing linear layers, more launches; the library's depthwise convolutions, fewer), the environment's
    choice restored after; every step runs with denormals flushed to zero (the dry
    run's uninitialised outputs), torch's default restored after; on a GPU it sends the user to `backbone`'s host
    column."""
    monkeypatch.setenv('MMPOLA_RECOMPUTE', 'auto')
    monkeypatch.delenv('MMPOLA_DEPTHWISE_CONV', raising=False)
    flushes = torch.set_flush_denormal(False)  # torch's default; False where the CPU cannot flush
    flushed, make_pass = [], BENCH.backbone_pass

    def checked_pass(*args, **kwargs):
        step = make_pass(*args, **kwargs)

        def checked():
            flushed.append(torch.tensor([1e-39]).mul(2).item() == 0)  # a denormal doubled reads 0 where flushed
            return step()
        return checked
    monkeypatch.setattr(BENCH, 'backbone_pass', checked_pass)
    threads = torch.get_num_threads()
    try:
        BENCH.main(['host', '--models', 'pola-pvt-t', 'pvt-t', '--repeat', '2', '--warmup', '1', '--compare-recompute',
                    '--also-with', 'MMPOLA_DEPTHWISE_CONV=torch'])
    finally:
        torch.set_num_threads(threads)  # host runs on one thread; the tests after it keep theirs
    out = capsys.readouterr().out
    assert '- threads: 1,' in out and 'peak memory' not in out  # one thread; no memory measured
    rows = table_rows(out, 'pola-pvt-t', 'pvt-t')
    assert list(rows) == ['pola-pvt-t', 'pvt-t', 'pola-pvt-t, MMPOLA_DEPTHWISE_CONV=torch',
                          'pola-pvt-t, MMPOLA_RECOMPUTE=triton']
    for name, cells in rows.items():
        assert cells[1] == '64x96' and cells[2] == '1'
        assert 0 < float(cells[3]) <= float(cells[4])
        assert int(cells[5]) > 1000 and int(cells[6]) > 1000 and 0 < int(cells[7]) < int(cells[6]), cells
    assert rows['pvt-t'][8] == '0'
    assert all(cells[9] == '-' for cells in rows.values())  # the interpreter's kernels would run: not timed
    assert 0 < int(rows['pola-pvt-t'][8]) < int(rows['pola-pvt-t, MMPOLA_RECOMPUTE=triton'][8])
    assert int(rows['pola-pvt-t, MMPOLA_DEPTHWISE_CONV=torch'][8]) < int(rows['pola-pvt-t'][8])  # library convs
    assert os.environ['MMPOLA_RECOMPUTE'] == 'auto' and 'MMPOLA_DEPTHWISE_CONV' not in os.environ
    assert len(flushed) > 4 * (2 + 1) and all(flushed) == flushes, flushed
    assert torch.tensor([1e-39]).mul(2).item() != 0
    with pytest.raises(SystemExit, match='backbone --device cuda'):
        BENCH.bench_host(BENCH.parse_args(['host', '--models', 'pvt-t']), torch.device('cuda'))


@pytest.mark.downstream
def test_host_times_the_triton_launches_down_triton_s_own_launch_path(tmp_path):
    """Outside the interpreter, `host` makes each step's Triton launches once more from mmpola's launch call (its
    direct launches, else Triton's launch path: the autotuners, the binding of the arguments, the kernel cache) to
    a driver standing in for an H100's, compiling the kernels for it: the host's cost of the launches that the dry
    run only records. The library's backbones launch none."""
    out = run_tool([PYTHON, 'tools/benchmark.py', 'host', '--models', 'pola-pvt-t', 'pvt-t', '--repeat', '1',
                    '--warmup', '1'], env=dict(TRITON_CACHE_DIR=str(tmp_path), TRITON_INTERPRET='0'))
    rows = table_rows(out, 'pola-pvt-t', 'pvt-t')
    assert int(rows['pola-pvt-t'][8]) > 0 and float(rows['pola-pvt-t'][9]) > 0, out
    assert rows['pvt-t'][8] == '0' and float(rows['pvt-t'][9]) == 0, out
    assert "mmpola's launch call (its direct launch of a launch like one made before, else Triton's own path" in out


@pytest.mark.downstream
def test_host_forward_times_the_inference_forward(capsys, monkeypatch):
    """`host --forward` times what evaluation runs: the forward in eval mode without autograd, which dispatches
    fewer operators and launches than a training step (mmdet's Swin, whose train() returns None, included)."""
    for variable in ('MMPOLA_DEPTHWISE_CONV', 'MMPOLA_RECOMPUTE'):  # unset, as `host` runs: 'auto'
        monkeypatch.delenv(variable, raising=False)
    threads = torch.get_num_threads()
    try:
        BENCH.main(['host', '--forward', '--models', 'pola-pvt-t', 'swin-t', '--repeat', '1', '--warmup', '1'])
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    rows = table_rows(out, 'pola-pvt-t', 'swin-t')
    assert set(rows) == {'pola-pvt-t', 'swin-t'} and 'One inference forward (eval mode, without autograd' in out
    counts = _host_counts('pola-pvt-t')  # a training step's (bf16)
    assert 0 < int(rows['pola-pvt-t'][6]) < counts[1] / 2 and 0 < int(rows['pola-pvt-t'][8]) < counts[3]
    assert 0 < int(rows['pola-pvt-t'][7]) < counts[2] and rows['swin-t'][8] == '0'


def test_the_stand_in_driver_is_triton_s_driver_inside_only():
    """Inside, Triton's active driver answers for an H100 (compute capability 9.0) on a machine without one; after,
    Triton's own driver is back (on a machine without a GPU: made again when asked for)."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    def active():
        try:
            return driver.active
        except RuntimeError:  # no GPU here
            return None
    before = active()
    with HOST.stand_in_driver():
        assert driver.active.get_current_target() == GPUTarget('cuda', 90, 32)
        assert driver.active.get_current_device() == HOST.STAND_IN_DEVICE  # Triton's kernels kept apart from a GPU's
        assert driver.active.utils.get_device_properties(0)['max_shared_mem'] == 227 * 1024
    assert type(active()) is type(before)


# What one training step of each of mmpola's backbones costs the host, as `host` counts it (its narrowed layout,
# batch 1 at 64x96, bf16 autocast, an H100 dry run): Python calls, aten operators dispatched (with CUDA's autocast
# lists: the casts of a GPU's autocast included), the GPU kernels among them (neither views nor bare allocations)
# and Triton launches. Counts, the same on every machine with the pinned
# torch; a GPU's step pays for each of them on its CPU (docs/benchmarks.md, "The host's time of a step").
HOST_BUDGETS = {  # name: (Python calls, operators, library kernels, Triton launches)
    'pola-pvt-t': (3460, 1644, 624, 56),
    'softmax-pvt-t': (1700, 1526, 708, 0),
    'pola-swin-t': (3278, 2528, 1018, 28),
    'softmax-swin-t': (2564, 2686, 1122, 0),
    'softmax-pvtv2-b2': (4211, 3251, 1368, 48),
    'flatten-pvt-t': (3388, 1524, 636, 84),
    'flatten-swin-t': (3246, 2472, 1026, 44),
    'inline-pvt-t': (2896, 1556, 718, 56),
    'polaformer++-b2': (5673, 3252, 1203, 132),
}
# mmpola's backbones whose step launches fewer kernels on a GPU (library kernels and Triton launches) than the
# network they are compared with launches (mmdet's)
FEWER_KERNELS_THAN = {'pola-pvt-t': 'pvt-t', 'softmax-pvt-t': 'pvt-t', 'pola-swin-t': 'swin-t',
                      'softmax-swin-t': 'swin-t'}


def _host_counts(name, amp='bfloat16'):
    """(Python calls, operators, kernels, Triton launches, host-device syncs) of a narrowed step of ``name``
    (autocast ``amp``), after one step that fills the caches."""
    step = BENCH.backbone_pass(HOST.build_narrowed(*BENCH.all_backbones()[name]), torch.randn(1, 3, 64, 96),
                               backward=True, amp=amp)
    with BENCH.h100_dry_run() as launches:
        step()
        return HOST.step_counts(step, launches)


@pytest.mark.downstream
def test_host_counts_of_a_training_step_stay_within_their_budgets(monkeypatch):
    """A change that adds Python calls, operators, kernels or Triton launches to a training step of mmpola's backbones
    adds host time to every step on a GPU, where these backbones' steps at batch 2 are a few milliseconds of device
    work: it fails here. If it pays on the device, raise the budget (and update the host table of
    docs/benchmarks.md, `python tools/benchmark.py host --compare-recompute --amp bfloat16`); a change that lowers
    a count lowers its budget. No step makes the host wait for the device."""
    for variable in ('MMPOLA_DEPTHWISE_CONV', 'MMPOLA_RECOMPUTE'):  # unset, as `host` runs: 'auto'
        monkeypatch.delenv(variable, raising=False)
    counts = {name: _host_counts(name) for name in {*HOST_BUDGETS, *FEWER_KERNELS_THAN.values()}}
    labels = ('Python calls', 'operators', 'kernels', 'Triton launches')
    over = [f'{name}: {label} {count} > {budget}' for name, budgets in HOST_BUDGETS.items()
            for label, count, budget in zip(labels, counts[name], budgets) if count > budget]
    assert not over, over
    assert all(count[4] == 0 for count in counts.values()), counts
    for ours, theirs in FEWER_KERNELS_THAN.items():
        assert sum(counts[ours][2:4]) < counts[theirs][2], (ours, counts[ours], theirs, counts[theirs])


def test_the_cuda_device_line_names_the_gpu_and_the_versions_that_choose_kernels(monkeypatch):
    """GPU figures say where they were made: the GPU, its compute capability, CUDA, cuDNN and Triton."""
    import triton
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda device=None: 'NVIDIA H200')
    monkeypatch.setattr(torch.cuda, 'get_device_capability', lambda device=None: (9, 0))
    monkeypatch.setattr(torch.backends.cudnn, 'is_available', lambda: True)
    monkeypatch.setattr(torch.backends.cudnn, 'version', lambda: 91900)
    monkeypatch.setattr(torch.version, 'cuda', '13.0')
    assert BENCH.cuda_device_line(torch.device('cuda')) == (
        f'device: NVIDIA H200 (compute capability 9.0), CUDA 13.0, cuDNN 91900, Triton {triton.__version__}')


def test_cuda_asked_where_it_is_unusable_is_one_line_with_the_cause_and_fix(monkeypatch):
    """--device cuda with a CPU-only torch build (a GPU machine's usual mistake): the cause and its fix, as the
    training tools say them, not only that CUDA is off."""
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    monkeypatch.setattr(torch.version, 'cuda', None)
    with pytest.raises(SystemExit) as exc:
        BENCH.main(['backbone', '--device', 'cuda', '--models', 'pola-pvt-t', '--malloc', 'default'])
    message = str(exc.value.code)
    assert message.startswith('error: --device cuda asks for a GPU, but CUDA is not usable here: this torch build ('), \
        message
    assert 'has no CUDA support. Fix: install a CUDA build of torch' in message, message
    assert message.endswith('To run on the CPU on purpose, add --device cpu.') and '\n' not in message


@pytest.mark.downstream
def test_optim_times_a_step_with_each_constructor_s_groups(capsys):
    """One row per config, constructor and torch implementation: mmengine's default constructor gives each
    parameter a group (the config has a paramwise_cfg), mmpola's merges those of equal options: the same tensors,
    fewer Python calls and operators; the fused implementation dispatches a few operators per group where foreach
    dispatches a few per tensor; on a GPU it sends the user to `train --profile`."""
    config = 'configs/demo/upernet_pola-swin-t_demo-ade-128x128.py'
    threads = torch.get_num_threads()
    try:
        BENCH.main(['optim', config, '--repeat', '2', '--warmup', '1'])
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    rows = {tuple(cell.strip() for cell in line.split('|')[2:4]): [cell.strip() for cell in line.strip('|').split('|')]
            for line in out.splitlines() if line.startswith('| upernet_pola-swin-t_demo')}
    default, merged = 'DefaultOptimWrapperConstructor', 'MergedGroupsOptimWrapperConstructor'
    assert list(rows) == [(default, 'foreach'), (default, 'fused'), (merged, 'foreach'), (merged, 'fused')], out[-2000:]
    groups, tensors, step, median, calls, ops = 3, 4, 5, 6, 7, 8  # the columns
    for row in rows.values():
        assert 0 < float(row[step]) <= float(row[median])
        assert int(row[tensors]) == int(rows[default, 'foreach'][tensors]) > 50  # the same tensors in every row
    for implementation in ('foreach', 'fused'):  # one group per parameter, and a few merged ones
        assert int(rows[default, implementation][groups]) == int(rows[default, implementation][tensors])
        assert 1 < int(rows[merged, implementation][groups]) <= 4
        assert int(rows[merged, implementation][calls]) < int(rows[default, implementation][calls]) / 2
    assert int(rows[merged, 'foreach'][ops]) < int(rows[default, 'foreach'][ops]) / 2
    assert int(rows[merged, 'fused'][ops]) <= 4 * int(rows[merged, 'fused'][groups])  # operators per group
    assert int(rows[merged, 'fused'][ops]) < int(rows[merged, 'foreach'][ops]) / 10  # not per tensor
    with pytest.raises(SystemExit, match='train --profile'):
        BENCH.bench_optim(BENCH.parse_args(['optim', config]), torch.device('cuda'))


@pytest.mark.downstream
def test_optim_full_size_steps_the_parameters_shapes_and_both_implementations_agree():
    """--full-size: the config's groups over tensors of its parameters' shapes; the fused implementation updates
    them as foreach does, within rounding (each step's arithmetic, not only its dispatch, is timed)."""
    train = load_tool('benchmark_train')
    from mmpola.runtime.param_groups import MERGED_CONSTRUCTOR
    config = 'configs/demo/mask-rcnn_pola-pvt-t_fpn_demo-coco.py'
    steps = {}
    for implementation in ('foreach', 'fused'):
        optimizer, groups, tensors = train.narrowed_optimizer(config, MERGED_CONSTRUCTOR, implementation, True)
        params = [p for g in optimizer.param_groups for p in g['params']]
        assert len(params) == tensors > 100 and max(p.numel() for p in params) > 1000
        assert all(g['fused'] == (implementation == 'fused') for g in optimizer.param_groups)
        optimizer.step()
        optimizer.step()
        steps[implementation] = params
    for a, b in zip(steps['foreach'], steps['fused']):
        assert a.abs().max() > 0  # updated from zeros
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)
