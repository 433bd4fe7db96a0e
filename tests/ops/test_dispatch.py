"""The implementation tables of the attention ops (mmpola.ops.dispatch): every registered
implementation of every op against the reference (forward and input gradients), and an extra
implementation registered from this file, selected with ``attn_impl=`` on a backbone."""
import io

import pytest
import torch

from mmpola.models import PolaPVT
from mmpola.models.attention import attention_op, registered_attention_kinds
from mmpola.ops import (
    OPS,
    depthwise_conv_impl,
    pacs_attention_reference,
    pola_attention,
    pola_attention_reference,
    recompute_impl,
    recompute_impl_from_env,
    recompute_scope,
    register_attention_impl,
)
from mmpola.ops.dispatch import AttnImplUnavailable, autocast_dtype, autocast_off, key_bias_operand
from tests.fixtures.ops import max_scaled_error, op_tables_restored

# every implementation of every op; the inputs come from the op (its example_inputs)
CASES = [(op, impl) for op in sorted(OPS) for impl in OPS[op].names() if impl != 'reference']
# an odd grid, several heads, batch 2
GRID = dict(batch=2, heads=3, hw=(3, 5), head_dim=8)


def _run(fn, tensors, options, grad_seed=1, device='cpu'):
    leaves = [t.detach().clone().to(device).requires_grad_() for t in tensors]
    out = fn(*leaves, *options)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(grad_seed), dtype=out.dtype)
    out.backward(grad_out.to(device))
    return [out.detach().cpu()] + [t.grad.cpu() for t in leaves]


def test_every_op_has_its_reference_a_default_and_example_inputs():
    # the ops are those of the registered attention kinds (Pola, FLatten, InLine, PaCS ...)
    kind_ops = {attention_op(kind) for kind in registered_attention_kinds()} - {None}
    assert sorted(OPS) == sorted(kind_ops) and len(OPS) >= 4
    for op in OPS.values():
        assert 'reference' in op.impls and op.default in op.impls and op.names()[0] == 'auto'
        assert op.example_inputs is not None


@pytest.mark.parametrize('op,impl', CASES, ids=[f'{op}-{impl}' for op, impl in CASES])
def test_every_implementation_matches_the_reference(op, impl):
    """Forward and every input gradient within the ops' tolerance (1e-5 of the scale) of the
    reference, or of the float64 truth where the fp32 reductions round differently."""
    attention = OPS[op]
    tensors, options = attention.example_inputs(generator=torch.Generator().manual_seed(0), **GRID)
    expected = _run(attention.impls['reference'], tensors, options)
    # an implementation that runs on CUDA tensors only (Triton without its interpreter) runs there, the
    # op's tensor options (PaCS's RoPE tables) with it
    cpu_only_reason = attention.unsupported(attention.choose(impl), 'cpu', torch.float32)
    device = 'cuda' if torch.cuda.is_available() and cpu_only_reason else 'cpu'
    actual = _run(attention.resolve(impl), tensors, [o.to(device) if torch.is_tensor(o) else o for o in options],
                  device=device)
    truth = _run(attention.impls['reference'], [t.double() for t in tensors],
                 [o.double() if torch.is_tensor(o) else o for o in options])
    for i, (a, e, t) in enumerate(zip(actual, expected, truth)):
        assert a.shape == e.shape and a.dtype == e.dtype, i
        assert max_scaled_error(a, e) <= 1e-5 or max_scaled_error(a.double(), t) <= 1e-5, f'{op}/{impl}: output {i}'


@pytest.mark.parametrize('op', sorted(OPS))
def test_the_fp32_island_widens_and_never_narrows(op):
    """The fp32 island (the models' default ``fp32_attn``) computes float64 inputs in float64 (a model in double
    precision, a gradcheck): equal to the reference in float64, not rounded through float32."""
    from mmpola.ops.dispatch import run_attention_op
    attention = OPS[op]
    tensors, options = attention.example_inputs(generator=torch.Generator().manual_seed(0), **GRID)
    tensors = [t.double() for t in tensors]
    options = [o.double() if torch.is_tensor(o) else o for o in options]
    out = run_attention_op(op, 'auto', True, tensors, *options)
    expected = attention.impls['reference'](*tensors, *options)
    assert out.dtype == torch.float64 and max_scaled_error(out, expected) <= 1e-12


@pytest.fixture
def counting_pola_impl():
    """An extra implementation of the Pola op, registered the documented way: the reference, counted."""
    calls = []
    with op_tables_restored('pola'):
        @register_attention_impl('pola', 'counting')
        def pola_attention_counting(q, k, v, power, scale, alpha=4.0, eps=1e-6):
            calls.append(tuple(q.shape))
            return pola_attention_reference(q, k, v, power, scale, alpha, eps)

        yield calls


def test_extra_implementation_selected_with_attn_impl_on_a_backbone(counting_pola_impl):
    arch = dict(embed_dims=[16, 32, 48, 64], num_heads=[1, 2, 3, 4], mlp_ratios=[2, 2, 2, 2], depths=[1, 1, 1, 1])
    torch.manual_seed(0)
    model = PolaPVT(arch=arch, attn_impl='counting').eval()
    reference = PolaPVT(arch=arch, attn_impl='reference').eval()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        outs = model(x)
        expected = reference(x)
    assert len(counting_pola_impl) == 4  # one call per stage, with the stage's per-head tensors
    assert counting_pola_impl[0] == (1, 1, 16 * 24, 16)
    assert all(torch.equal(a, b) for a, b in zip(outs, expected))
    model.set_attn_impl('auto')
    model(x)
    assert len(counting_pola_impl) == 4
    model.set_attn_impl('counting')
    model.train()
    sum(o.sum() for o in model(x)).backward()  # gradients through the extra implementation
    assert len(counting_pola_impl) == 8 and model.block1[0].attn.power.grad is not None


def test_unknown_implementation_is_a_clear_error():
    with pytest.raises(ValueError, match=r"attn_impl must be one of auto, fast, reference, triton .*got 'counting'"):
        OPS['pola'].resolve('counting')
    with pytest.raises(ValueError, match="implementations of pacs_attention"):
        OPS['pacs'].resolve('unregistered')
    with pytest.raises(KeyError, match='already has'):
        register_attention_impl('pola', 'fast', pola_attention_reference)
    assert pacs_attention_reference is OPS['pacs'].impls['reference']


@pytest.fixture
def device_bound_impl():
    """An implementation that runs on 'meta'-free CPU float32 only and is preferred on the CPU: what a
    fused kernel for one device registers (supports / preferred_on / fp32_inside)."""
    seen = []

    def supports(device, dtype):
        if device.type != 'cpu':
            return f'runs on CPU tensors only, got {device.type}'
        return None if dtype == torch.float32 else f'takes float32 only, got {dtype}'

    with op_tables_restored('pola'):
        @register_attention_impl('pola', 'cpu_only', supports=supports, preferred_on=('cpu',), fp32_inside=True)
        def pola_cpu_only(q, k, v, power, scale, alpha=4.0, eps=1e-6):
            seen.append(q.dtype)
            return pola_attention_reference(q.float(), k.float(), v.float(), power.float(), scale.float(), alpha, eps)

        yield seen


def test_auto_picks_the_preferred_implementation_that_supports_the_tensors(device_bound_impl):
    op = OPS['pola']
    assert op.choose('auto', torch.device('cpu'), torch.float32) == 'cpu_only'
    assert op.choose('auto', torch.device('cpu'), torch.float64) == op.default  # not supported: the default
    assert op.choose('auto') == op.default  # no device: the default
    tensors, options = op.example_inputs(generator=torch.Generator().manual_seed(0), **GRID)
    out = pola_attention(*tensors, *options)  # fp32 island: float32 compute -> the preferred one
    assert device_bound_impl == [torch.float32]
    torch.testing.assert_close(out, pola_attention_reference(*tensors, *options), rtol=0, atol=0)


def test_fp32_inside_implementations_get_low_precision_tensors_uncast(device_bound_impl):
    tensors, options = OPS['pola'].example_inputs(generator=torch.Generator().manual_seed(0), **GRID)
    out = pola_attention(*(t.bfloat16() for t in tensors), *options, impl='cpu_only')
    assert device_bound_impl == [torch.bfloat16] and out.dtype == torch.bfloat16
    pola_attention(*tensors, *options, impl='fast')
    assert len(device_bound_impl) == 1  # 'fast' named: the preferred one is not used


def test_an_implementation_on_tensors_it_cannot_run_on_fails_with_one_line(device_bound_impl):
    tensors, options = OPS['pola'].example_inputs(generator=torch.Generator().manual_seed(0), **GRID)
    with pytest.raises(AttnImplUnavailable, match=r"attn_impl='cpu_only' \(pola_attention\) cannot run here: "
                       r'takes float32 only, got torch.float64') as info:
        pola_attention(*(t.double() for t in tensors), *options, impl='cpu_only', fp32=False)
    assert '\n' not in str(info.value)
    assert not device_bound_impl


def test_a_key_bias_reaches_implementations_that_take_it_and_is_added_for_the_others():
    """An implementation registered ``key_bias=True`` gets the bias as its keyword (uncast inside the fp32
    island when it computes in float32 itself); the others get k + key_bias, added in the keys' dtype."""
    calls = []

    def takes_bias(q, k, v, power, scale, alpha=4.0, eps=1e-6, key_bias=None):
        calls.append(('takes', k.dtype, None if key_bias is None else key_bias.dtype))
        return pola_attention_reference(q.float(), (k + key_bias).float(), v.float(), power.float(), scale.float(),
                                        alpha, eps)

    def plain(q, k, v, power, scale, alpha=4.0, eps=1e-6):
        calls.append(('plain', k.dtype))
        return pola_attention_reference(q, k, v, power, scale, alpha, eps)

    with op_tables_restored('pola'):
        register_attention_impl('pola', 'takes_bias', takes_bias, fp32_inside=True, key_bias=True)
        register_attention_impl('pola', 'plain', plain)
        (q, k, v, power, scale), options = OPS['pola'].example_inputs(generator=torch.Generator().manual_seed(0),
                                                                      **GRID)
        bias = torch.randn(1, *k.shape[1:], generator=torch.Generator().manual_seed(1))
        expected = pola_attention_reference(q, k + bias, v, power, scale, *options)
        for impl in ('takes_bias', 'plain', 'reference', 'fast'):
            out = pola_attention(q, k, v, power, scale, *options, impl=impl, key_bias=bias)
            torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
        assert calls == [('takes', torch.float32, torch.float32), ('plain', torch.float32)]
        half = [t.bfloat16() for t in (q, k, v, power, scale, bias)]
        pola_attention(*half[:5], *options, impl='takes_bias', key_bias=half[5])
        pola_attention(*half[:5], *options, impl='plain', key_bias=half[5])
        assert calls[2:] == [('takes', torch.bfloat16, torch.bfloat16), ('plain', torch.float32)]


def test_auto_runs_the_default_when_the_preferred_one_turns_the_call_down():
    """What only the call shows (the Triton kernels' shared memory at a wide head dim) is checked on
    entry: under 'auto' the default runs instead, with the reason as one warning; named, it fails."""
    calls = []

    def picky(q, k, v, power, scale, alpha=4.0, eps=1e-6):
        calls.append(q.shape[-1])
        if q.shape[-1] > 8:
            raise AttnImplUnavailable('this device holds heads of at most 8 channels')
        return pola_attention_reference(q, k, v, power, scale, alpha, eps)

    with op_tables_restored('pola'):
        register_attention_impl('pola', 'picky', picky, preferred_on=('cpu',))
        op = OPS['pola']
        narrow, options = op.example_inputs(generator=torch.Generator().manual_seed(0), **GRID)
        torch.testing.assert_close(pola_attention(*narrow, *options), pola_attention_reference(*narrow, *options),
                                   rtol=0, atol=0)
        wide, options = op.example_inputs(generator=torch.Generator().manual_seed(0), **{**GRID, 'head_dim': 16})
        with pytest.warns(UserWarning, match=r"pola_attention: attn_impl='auto' runs 'fast' instead of 'picky' .*"
                          'at most 8 channels'):
            out = pola_attention(*wide, *options)
        torch.testing.assert_close(out, pola_attention_reference(*wide, *options), rtol=1e-5, atol=1e-6)
        assert calls == [8, 16]
        with pytest.raises(AttnImplUnavailable, match='at most 8 channels'):
            pola_attention(*wide, *options, impl='picky')


def test_auto_runs_the_default_while_a_tracer_records(monkeypatch):
    """While torch.compile, torch.jit.trace or an ONNX export records the model, 'auto' is the op's default
    (the PyTorch bodies they can record and export), on any device, and nothing of it is cached."""
    from mmpola.ops.dispatch import recording
    assert not recording()
    monkeypatch.setattr(torch.jit, 'is_tracing', lambda: True)
    assert recording()
    for op in OPS.values():
        assert op.choose('auto', torch.device('cuda'), torch.float32) == op.default
    monkeypatch.undo()
    assert OPS['pola'].choose('auto', torch.device('cpu'), torch.float32) == 'fast'


def test_recording_while_torch_export_or_an_onnx_export_runs_the_model():
    """torch.export (and with it the dynamo ONNX exporter) and the TorchScript ONNX exporter run the model's
    forward while :func:`recording` says so; outside them it does not."""
    from mmpola.ops.dispatch import recording
    seen = []

    class Noting(torch.nn.Module):
        def forward(self, x):
            seen.append(recording())
            return x * 2

    Noting()(torch.randn(2, 3))
    torch.export.export(Noting(), (torch.randn(2, 3), ))
    assert seen[0] is False and seen[1:] and all(seen[1:]), seen
    seen.clear()
    try:  # the exporter traces the forward first; without the onnx package it fails after that
        torch.onnx.export(Noting(), (torch.randn(2, 3), ), io.BytesIO(), dynamo=False)
    except torch.onnx.OnnxExporterError:
        pass
    assert seen and all(seen), seen


def test_the_implementation_note_names_every_variables_choice(monkeypatch):
    """One line with each implementation variable's choice and Triton's tuning, for a run's log (the tools add
    it); the variables are the ones the train benchmark's --also-with may set."""
    from mmpola.ops import IMPLEMENTATION_VARIABLES, implementation_note, sdpa_impl
    assert IMPLEMENTATION_VARIABLES == {'MMPOLA_DEPTHWISE_CONV': depthwise_conv_impl,
                                        'MMPOLA_RECOMPUTE': recompute_impl_from_env, 'MMPOLA_SDPA': sdpa_impl}
    monkeypatch.setenv('MMPOLA_DEPTHWISE_CONV', 'torch')
    monkeypatch.delenv('MMPOLA_RECOMPUTE', raising=False)
    monkeypatch.setenv('MMPOLA_SDPA', ' Torch ')
    monkeypatch.setenv('MMPOLA_TRITON_AUTOTUNE', 'off')
    assert implementation_note() == ("op implementations: MMPOLA_DEPTHWISE_CONV=torch, MMPOLA_RECOMPUTE=auto, "
                                     "MMPOLA_SDPA=torch; Triton's tuning off (MMPOLA_TRITON_AUTOTUNE)")
    monkeypatch.setenv('MMPOLA_RECOMPUTE', 'fused')
    with pytest.raises(AttnImplUnavailable, match="MMPOLA_RECOMPUTE='fused' is not an implementation"):
        implementation_note()


@pytest.mark.parametrize('variable, read, what, choices', [
    ('MMPOLA_DEPTHWISE_CONV', depthwise_conv_impl, 'the depthwise convolution', 'auto, torch, triton'),
    ('MMPOLA_RECOMPUTE', recompute_impl, 'the linear layers that recompute their input',
     'auto, torch, triton, elementwise'),
    ('MMPOLA_RECOMPUTE', recompute_impl_from_env, 'the linear layers that recompute their input',
     'auto, torch, triton, elementwise')])
def test_environment_switches(monkeypatch, variable, read, what, choices):
    """The variables that pick an implementation for a whole run: 'auto' when unset or empty, case and spaces
    ignored, an unknown name one error naming the variable, what it picks for and the choices."""
    monkeypatch.delenv(variable, raising=False)
    assert read() == 'auto'
    monkeypatch.setenv(variable, '')
    assert read() == 'auto'
    monkeypatch.setenv(variable, ' Triton ')
    assert read() == 'triton'
    monkeypatch.setenv(variable, 'cudnn')
    with pytest.raises(AttnImplUnavailable, match=rf"^{variable}='cudnn' is not an implementation of {what}; "
                       rf'use one of {choices} \(or unset it\)$'):
        read()


def test_a_recompute_scope_overrides_the_variable_inside_it_only(monkeypatch):
    """A backbone's ``recompute`` argument: inside its scope ``recompute_impl`` gives it whatever the variable
    says (the innermost scope wins; None changes nothing); the variable's own reader is not swayed."""
    monkeypatch.setenv('MMPOLA_RECOMPUTE', 'torch')
    with recompute_scope('triton'):
        assert recompute_impl() == 'triton' and recompute_impl_from_env() == 'torch'
        with recompute_scope('auto'):
            assert recompute_impl() == 'auto'
        with recompute_scope(None):
            assert recompute_impl() == 'triton'
        with recompute_scope('elementwise'):
            assert recompute_impl() == 'elementwise'
    assert recompute_impl() == 'torch'
    with pytest.raises(ValueError, match="recompute must be one of 'auto', 'torch', 'triton', 'elementwise' or None"):
        with recompute_scope('fused'):
            pass
    assert recompute_impl() == 'torch'


def test_autocast_helpers_know_device_types_without_autocast():
    assert autocast_dtype('cpu') is None
    with torch.autocast('cpu', torch.bfloat16):
        assert autocast_dtype('cpu') == torch.bfloat16
        with autocast_off('cpu'):
            assert autocast_dtype('cpu') is None
            assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.float32
        # meta tensors: autocast has no such device type (torch.autocast('meta') fails); nothing to turn off
        assert autocast_dtype('meta') is None
        with autocast_off('meta'):
            assert autocast_dtype('cpu') == torch.bfloat16


@pytest.mark.parametrize('shape', [(1, 2, 5, 4), (3, 1, 5, 4), (5, 4), (4, ), (1, 1, 1, 1), (3, 2, 5, 4), (2, 5, 1),
                                   (2, 5, 3), (1, 3, 2, 5, 4), (3, 2, 1, 5, 4), (2, 4), (6, 4)])
def test_a_key_bias_is_taken_where_torch_broadcasts_it_to_the_keys(shape):
    """key_bias_operand takes a bias exactly where torch.broadcast_shapes gives the keys' shape, with the keys'
    number of dims; else one ValueError naming the op and both shapes."""
    k = torch.zeros(3, 2, 5, 4)
    bias = torch.ones(shape)
    try:
        expected = torch.broadcast_shapes(bias.shape, k.shape) == k.shape
    except RuntimeError:
        expected = False
    if expected:
        operand = key_bias_operand('pola_attention', k, bias)
        assert operand.dim() == k.dim() and torch.equal(operand.expand_as(k), bias.expand_as(k))
    else:
        with pytest.raises(ValueError, match=r'pola_attention takes key_bias broadcastable to the keys \(3, 2, 5, 4\); '
                           rf'got shape \({", ".join(map(str, shape))},?\)'):
            key_bias_operand('pola_attention', k, bias)
