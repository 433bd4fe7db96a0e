"""Pola attention core: fast path vs the official-order reference, closed form, AMP island.

The fast path is tested eagerly (compile disabled, tests/conftest.py) except in the tests of its
torch.compile kernels, which compile them once at small sizes (forced by force_compile()).
"""
import pytest
import torch
import torch.nn.functional as F

from mmpola.ops import pola, pola_attention, pola_attention_reference
from mmpola.ops.pola import pola_attention_fast, polarity_feature_map, polarity_feature_map_and_mean
from tests.fixtures.ops import forward_backward, max_scaled_error

# (B, h, N, n, d): odd token counts, spatial reduction (n != N), single tokens, batch and heads > 1
SHAPES = [
    (1, 1, 7, 7, 4),
    (2, 3, 49, 49, 32),
    (2, 2, 37, 9, 16),  # n != N (PVT sr > 1), odd N
    (1, 5, 15, 15, 64),
    (2, 2, 1, 1, 8),  # N = n = 1
    (1, 2, 1, 6, 8),  # one query
    (3, 1, 11, 1, 2),  # one key, smallest even d
]


def make_inputs(B, h, N, n, d, dtype=torch.float32, seed=0, q_scale=1.0):
    """Inputs near the trained regime: p in (1, 5) around 3, s around ln 2."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, h, N, d, generator=g) * q_scale
    k = torch.randn(B, h, n, d, generator=g)
    v = torch.randn(B, h, n, d, generator=g)
    power = torch.randn(1, h, 1, d, generator=g) * 0.5
    scale = torch.randn(1, h, 1, d, generator=g) * 0.3
    grad_out = torch.randn(B, h, N, d, generator=g)
    return [t.to(dtype) for t in (q, k, v, power, scale)], grad_out.to(dtype)


NAMES = ['out', 'grad_q', 'grad_k', 'grad_v', 'grad_power', 'grad_scale']


@pytest.mark.parametrize('shape', SHAPES, ids=lambda s: 'x'.join(map(str, s)))
def test_fast_matches_reference_fp32(shape):
    inputs, grad_out = make_inputs(*shape)
    ref = forward_backward(pola_attention_reference, inputs, grad_out)
    fast = forward_backward(pola_attention_fast, inputs, grad_out)
    for name, a, e in zip(NAMES, fast, ref):
        assert a.shape == e.shape, name
        err = max_scaled_error(a, e)
        assert err <= 1e-5, f'{name}: scaled max error {err:.2e} at shape {shape}'


@pytest.mark.parametrize('shape', [(2, 3, 13, 5, 8), (1, 1, 1, 1, 4)])
def test_fast_equals_reference_math_in_fp64(shape):
    """In float64 the two op orders agree to rounding: the fast path is the same function."""
    inputs, grad_out = make_inputs(*shape, dtype=torch.float64)
    ref = forward_backward(pola_attention_reference, inputs, grad_out)
    fast = forward_backward(pola_attention_fast, inputs, grad_out)
    for name, a, e in zip(NAMES, fast, ref):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12, msg=name)


@pytest.mark.parametrize('shape', [(2, 3, 49, 13, 32), (2, 1, 64, 64, 64)])
def test_fast_is_as_accurate_as_reference_in_fp32(shape):
    """Against the float64 truth the fast path's fp32 error is of the reference's order: the
    1e-5-scaled bound above is fp32 rounding of sums, not a deviation of the fast path."""
    inputs, grad_out = make_inputs(*shape)
    truth = forward_backward(pola_attention_reference, [t.double() for t in inputs], grad_out.double())
    ref = forward_backward(pola_attention_reference, inputs, grad_out)
    fast = forward_backward(pola_attention_fast, inputs, grad_out)
    for name, a, r, e in zip(NAMES, fast, ref, truth):
        fast_err, ref_err = max_scaled_error(a.double(), e), max_scaled_error(r.double(), e)
        assert fast_err <= 4 * ref_err + 1e-7, f'{name}: fast {fast_err:.1e} vs reference {ref_err:.1e}'


def test_dispatcher_impls_and_default():
    inputs, _ = make_inputs(2, 2, 9, 9, 8)
    ref = pola_attention(*inputs, impl='reference')
    assert torch.equal(ref, pola_attention_reference(*inputs))
    for impl in ('fast', 'auto'):
        torch.testing.assert_close(pola_attention(*inputs, impl=impl), ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(pola_attention(*inputs), ref, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match='impl must be'):
        pola_attention(*inputs, impl='unregistered')


def test_broadcast_parameter_shapes():
    """power / scale shared over heads or channels: gradients are summed over the broadcast dims.

    float64, because a scale shared by everything gets a gradient summed over all elements with
    heavy cancellation, which is fp32 noise for either implementation."""
    (q, k, v, _, _), grad_out = make_inputs(2, 3, 10, 6, 8, dtype=torch.float64)
    for p_shape, s_shape in [((1, 1, 1, 8), (1, 3, 1, 8)), ((1, 3, 1, 1), (1, 1, 1, 1)), ((8, ), (1, 3, 1, 8))]:
        g = torch.Generator().manual_seed(1)
        power = torch.randn(p_shape, generator=g, dtype=torch.float64) * 0.5
        scale = torch.randn(s_shape, generator=g, dtype=torch.float64) * 0.3
        inputs = [q, k, v, power, scale]
        ref = forward_backward(pola_attention_reference, inputs, grad_out)
        fast = forward_backward(pola_attention_fast, inputs, grad_out)
        for name, a, e in zip(NAMES, fast, ref):
            assert a.shape == e.shape, (name, p_shape, s_shape)
            torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12, msg=f'{name} {p_shape} {s_shape}')


def test_frozen_power_and_scale():
    """Frozen Pola parameters (frozen stages): no gradient for them, the rest unchanged."""
    inputs, grad_out = make_inputs(2, 2, 12, 12, 8)
    q, k, v, power, scale = inputs
    results = []
    for fn in (pola_attention_reference, pola_attention_fast):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        fn(*leaves, power, scale).backward(grad_out)
        results.append([t.grad for t in leaves])
    for a, e in zip(*results):
        assert max_scaled_error(a, e) <= 1e-5


def test_feature_map_gradcheck():
    """The hand-written backward against finite differences, exact zeros included."""
    g = torch.Generator().manual_seed(0)
    t = torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64)
    t[0, 0, 0] = 0.0
    s = (F.softplus(torch.randn(1, 3, 1, 4, generator=g, dtype=torch.float64)))
    p = 1 + 4 * torch.sigmoid(torch.randn(1, 3, 1, 4, generator=g, dtype=torch.float64))
    args = [x.requires_grad_() for x in (t, s, p)]
    assert torch.autograd.gradcheck(polarity_feature_map, args)
    # the token mean's gradient is folded into the same backward
    assert torch.autograd.gradcheck(polarity_feature_map_and_mean, args)
    assert torch.autograd.gradcheck(lambda *a: polarity_feature_map_and_mean(*a)[1], args)


def test_feature_map_values_and_zero_gradients():
    t = torch.tensor([[-2.0, -0.0, 0.0, 3.0]], requires_grad=True)
    s = torch.tensor([2.0, 1.0, 1.0, 1.5], requires_grad=True)
    p = torch.tensor([2.0, 3.0, 3.0, 2.0], requires_grad=True)
    y = polarity_feature_map(t, s, p)
    torch.testing.assert_close(y.detach(), torch.tensor([[0.0, 0.0, 0.0, 4.0, 1.0, 0.0, 0.0, 0.0]]))
    y.sum().backward()
    for grad in (t.grad, s.grad, p.grad):
        assert torch.isfinite(grad).all()
    assert t.grad[0, 1] == 0 and t.grad[0, 2] == 0 and p.grad[1] == 0 and s.grad[2] == 0
    # d/dt relu(t/s)^p at t=3, s=1.5, p=2: 2 * (t/s) / s = 8/3; t=-2, s=2, p=2: -2 * (2/2) / 2 = -1
    torch.testing.assert_close(t.grad[0, [0, 3]], torch.tensor([-1.0, 8.0 / 3.0]))


def closed_form(q, k, v, power, scale, alpha=4.0, eps=1e-6):
    """The closed form of docs/design.md ("Attention math and op order"), quadratic in tokens, float64:
    x_s,i = (1/n) sum_j S_ij v1_j / ((1/n) sum_j S_ij + eps), S = phi+(q).phi+(k) + phi-(q).phi-(k);
    x_o,i likewise with O = phi-(q).phi+(k) + phi+(q).phi-(k) and v2."""
    q, k, v, power, scale = (t.double() for t in (q, k, v, power, scale))
    n, half = k.shape[-2], v.shape[-1] // 2
    s, p = F.softplus(scale), 1 + alpha * torch.sigmoid(power)
    qp, qn = (q / s).clamp(min=0) ** p, (-q / s).clamp(min=0) ** p
    kp, kn = (k / s).clamp(min=0) ** p, (-k / s).clamp(min=0) ** p
    same = torch.einsum('bhid,bhjd->bhij', qp, kp) + torch.einsum('bhid,bhjd->bhij', qn, kn)
    opp = torch.einsum('bhid,bhjd->bhij', qn, kp) + torch.einsum('bhid,bhjd->bhij', qp, kn)
    x_s = (same @ v[..., :half] / n) / (same.sum(-1, keepdim=True) / n + eps)
    x_o = (opp @ v[..., half:] / n) / (opp.sum(-1, keepdim=True) / n + eps)
    return torch.cat([x_s, x_o], dim=-1)


@pytest.mark.parametrize('shape', [(2, 3, 20, 20, 8), (1, 2, 17, 5, 16), (1, 1, 1, 3, 4)])
def test_reference_matches_closed_form(shape):
    inputs, _ = make_inputs(*shape)
    expected = closed_form(*inputs)
    for fn in (pola_attention_reference, pola_attention_fast):
        err = max_scaled_error(fn(*inputs).double(), expected)
        assert err <= 1e-5, f'{fn.__name__}: {err:.2e}'


@pytest.mark.parametrize('impl', ['reference', 'fast'])
def test_autocast_bf16_fp32_island(impl):
    inputs, grad_out = make_inputs(2, 2, 30, 30, 16)
    q, k, v, power, scale = inputs
    expected = pola_attention(*inputs, impl='reference')
    leaves = [t.bfloat16().requires_grad_() for t in (q, k, v)]
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = pola_attention(*leaves, power, scale, impl=impl)
    assert out.dtype == torch.bfloat16
    assert torch.isfinite(out).all()
    out.float().backward(grad_out)
    for t in leaves:
        assert t.grad.dtype == torch.bfloat16 and torch.isfinite(t.grad).all()
    # only the bf16 rounding of inputs and output separates it from the fp32 result
    torch.testing.assert_close(out.float(), expected, rtol=0.05, atol=0.05)


@pytest.mark.parametrize('impl', ['reference', 'fast'])
def test_large_magnitudes_stay_finite_under_bf16_autocast(impl):
    """|q/s| ~ 20 with p ~ 5 gives features ~ 3e6: overflows fp16 matmuls, fine in the fp32 island."""
    inputs, grad_out = make_inputs(2, 2, 25, 25, 8, q_scale=20 * 0.693)
    q, k, v, _, scale = inputs
    power = torch.full((1, 2, 1, 8), 6.0, requires_grad=True)  # p = 1 + 4 sigmoid(6) ~ 4.99
    k = k * 20 * 0.693
    leaves = [t.bfloat16().requires_grad_() for t in (q, k, v)]
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = pola_attention(*leaves, power, scale, fp32=True, impl=impl)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    out.float().backward(grad_out)
    for t in leaves + [power]:
        assert torch.isfinite(t.grad).all()


def test_fp32_false_follows_input_dtype():
    inputs, _ = make_inputs(1, 2, 9, 9, 8, dtype=torch.float64)
    out = pola_attention(*inputs, fp32=False)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, pola_attention_reference(*inputs), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize('impl', ['reference', 'fast'])
def test_fp32_false_under_autocast_uses_low_precision_matmuls(impl):
    inputs, grad_out = make_inputs(2, 2, 30, 30, 16)
    leaves = [t.requires_grad_() for t in inputs]
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = pola_attention(*leaves, fp32=False, impl=impl)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    out.float().backward(grad_out)
    assert all(torch.isfinite(t.grad).all() for t in leaves)


def test_odd_head_dim_is_rejected_with_a_hint():
    inputs, _ = make_inputs(1, 1, 4, 4, 6)
    q, k, v, power, scale = inputs
    with pytest.raises(ValueError, match='head dim must be even'):
        pola_attention_fast(q[..., :5], k[..., :5], v[..., :5], power[..., :5], scale[..., :5])


def test_compile_failure_falls_back_to_eager_once(monkeypatch):
    """A broken torch.compile (no compiler, unsupported platform) must not break the op."""
    monkeypatch.delenv('MMPOLA_NO_COMPILE')
    monkeypatch.setattr(pola, 'COMPILE_MIN_NUMEL', 0)
    monkeypatch.setattr(pola._CompileState, 'compiled', {})
    monkeypatch.setattr(pola._CompileState, 'disabled_reason', None)
    monkeypatch.setattr(pola._CompileState, 'logged', False)
    calls = []

    def broken_compile(fn, **kwargs):
        def run(*args):
            calls.append(fn.__name__)
            raise RuntimeError('no working C++ compiler found')

        return run

    monkeypatch.setattr(torch, 'compile', broken_compile)
    inputs, grad_out = make_inputs(1, 2, 9, 9, 8)
    ref = forward_backward(pola_attention_reference, inputs, grad_out)
    fast = forward_backward(pola_attention, inputs, grad_out)
    for name, a, e in zip(NAMES, fast, ref):
        assert max_scaled_error(a, e) <= 1e-5, name
    assert len(calls) == 1 and calls[0].startswith('_fused_forward'), calls  # tried once, then disabled
    enabled, reason = pola.compile_status()
    assert not enabled and 'no working C++ compiler' in reason
    assert pola._CompileState.logged


def test_recompile_limit_runs_that_call_eager_and_keeps_compiling(monkeypatch):
    """An input variant beyond dynamo's recompile limit must not switch compiling off for good."""
    monkeypatch.delenv('MMPOLA_NO_COMPILE')
    monkeypatch.setattr(pola, 'COMPILE_MIN_NUMEL', 0)
    monkeypatch.setattr(pola._CompileState, 'compiled', {})
    monkeypatch.setattr(pola._CompileState, 'disabled_reason', None)

    class FailOnRecompileLimitHit(RuntimeError):
        pass

    calls = []

    def limited_compile(fn, **kwargs):
        def run(*args):
            calls.append(fn.__name__)
            assert not any(torch.is_tensor(a) and a.requires_grad for a in args)  # detached inputs
            raise FailOnRecompileLimitHit('Hard failure due to fullgraph=True')

        return run

    monkeypatch.setattr(torch, 'compile', limited_compile)
    inputs, grad_out = make_inputs(1, 2, 9, 9, 8)
    ref = forward_backward(pola_attention_reference, inputs, grad_out)
    fast = forward_backward(pola_attention, inputs, grad_out)
    for name, a, e in zip(NAMES, fast, ref):
        assert max_scaled_error(a, e) <= 1e-5, name
    assert pola.compile_status()[0]
    # forward with and without the token mean and both backwards: separate compiled functions
    assert {'_fused_forward', '_fused_forward_with_mean', '_fused_backward'} <= set(calls), calls


def test_no_compile_env_disables_compile(monkeypatch):
    monkeypatch.setenv('MMPOLA_NO_COMPILE', '1')
    enabled, reason = pola.compile_status()
    assert not enabled and 'MMPOLA_NO_COMPILE' in reason


def test_compiled_fast_path_matches_reference_and_one_graph_serves_every_size(monkeypatch):
    """The torch.compile kernels of the fast path (forced at small sizes) equal the reference, and the
    graphs compiled at the first call serve other token grids, batch sizes, head counts and head dims:
    a detector's changing image sizes compile nothing more (sizes of 1 have graphs of their own)."""
    from torch._dynamo.utils import counters
    monkeypatch.setattr(pola._CompileState, 'compiled', {})
    monkeypatch.setattr(pola._CompileState, 'disabled_reason', None)
    torch._dynamo.reset()
    before = counters['stats']['unique_graphs']
    with pola.force_compile():
        for i, shape in enumerate([(2, 2, 20, 20, 8), (2, 2, 35, 9, 8), (3, 2, 48, 48, 8), (2, 3, 12, 12, 16)]):
            inputs, grad_out = make_inputs(*shape)
            ref = forward_backward(pola_attention_reference, inputs, grad_out)
            fast = forward_backward(pola_attention, inputs, grad_out)
            assert pola._CompileState.disabled_reason is None, pola._CompileState.disabled_reason
            for name, a, e in zip(NAMES, fast, ref):
                assert max_scaled_error(a, e) <= 1e-5, (name, shape)
            if i == 0:  # the forward with and without the token mean and their backwards
                assert counters['stats']['unique_graphs'] - before == 4, dict(counters['stats'])
    assert counters['stats']['unique_graphs'] - before == 4, dict(counters['stats'])


def test_compile_only_on_the_cpu_by_default():
    """On other devices the fast path stays eager ('auto' runs Triton on CUDA); force_compile() compiles
    everywhere."""
    large = torch.empty(pola.COMPILE_MIN_NUMEL, device='meta')
    assert pola.COMPILE_DEVICES == ('cpu',)
    assert not pola._want_compile(large)  # MMPOLA_NO_COMPILE=1 (tests/conftest.py)
    with pola.force_compile():
        assert pola._want_compile(large) and pola._want_compile(torch.empty(1))
    assert pola.COMPILE_DEVICES == ('cpu',) and pola.COMPILE_MIN_NUMEL == 2 ** 20


def test_compile_devices_and_size_threshold(monkeypatch):
    monkeypatch.delenv('MMPOLA_NO_COMPILE')
    monkeypatch.setattr(pola._CompileState, 'disabled_reason', None)
    assert pola._want_compile(torch.empty(pola.COMPILE_MIN_NUMEL))
    assert not pola._want_compile(torch.empty(pola.COMPILE_MIN_NUMEL - 1))
    assert not pola._want_compile(torch.empty(pola.COMPILE_MIN_NUMEL, device='meta'))
    assert 'on cpu' in pola.compile_status()[1]
