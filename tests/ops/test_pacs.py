"""PaCS attention core (PolaFormer++): fast path vs the official-order reference, closed form, AMP island."""
import pytest
import torch

from mmpola.ops import pacs_attention, pacs_attention_fast, pacs_attention_reference, rope_angles, rope_tables
from mmpola.ops.pacs import rope_rotate
from tests.fixtures.ops import DispatchedOps, max_scaled_error

# (B, h, H, W, d): odd grids, one token, batch and heads > 1, the smallest even head dim
SHAPES = [
    (1, 1, 3, 5, 8),
    (2, 3, 7, 7, 32),
    (2, 2, 5, 9, 16),
    (1, 1, 1, 1, 4),
    (3, 2, 1, 6, 2),
    (1, 4, 4, 4, 64),
]
NAMES = ['out', 'grad_q', 'grad_k', 'grad_v', 'grad_s_same', 'grad_s_opp']


def make_inputs(B, h, H, W, d, dtype=torch.float32, seed=0, q_scale=1.0):
    """Inputs near the trained regime: unit-variance q, k, v; spikiness logits around 0."""
    g = torch.Generator().manual_seed(seed)
    n = H * W
    q = torch.randn(B, h, n, d, generator=g) * q_scale
    k = torch.randn(B, h, n, d, generator=g)
    v = torch.randn(B, h, n, d, generator=g)
    s_same = torch.randn(1, h, 1, 2 * d, generator=g)
    s_opp = torch.randn(1, h, 1, 2 * d, generator=g)
    grad_out = torch.randn(B, h, n, d, generator=g)
    sin, cos = rope_tables(rope_angles(2 * h * d, h), (H, W))
    return [t.to(dtype) for t in (q, k, v, s_same, s_opp)], (sin.to(dtype), cos.to(dtype)), grad_out.to(dtype)


def forward_backward(fn, inputs, tables, grad_out, **kwargs):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves, *tables, **kwargs)
    out.backward(grad_out)
    return [out.detach()] + [t.grad for t in leaves]


@pytest.mark.parametrize('shape', SHAPES, ids=lambda s: 'x'.join(map(str, s)))
def test_fast_matches_reference_fp32(shape):
    inputs, tables, grad_out = make_inputs(*shape)
    ref = forward_backward(pacs_attention_reference, inputs, tables, grad_out)
    fast = forward_backward(pacs_attention_fast, inputs, tables, grad_out)
    for name, a, e in zip(NAMES, fast, ref):
        assert a.shape == e.shape, name
        err = max_scaled_error(a, e)
        assert err <= 1e-5, f'{name}: scaled max error {err:.2e} at shape {shape}'


@pytest.mark.parametrize('shape', [(2, 3, 3, 5, 8), (1, 2, 4, 3, 16)])
def test_fast_equals_reference_math_in_fp64(shape):
    inputs, tables, grad_out = make_inputs(*shape, dtype=torch.float64)
    ref = forward_backward(pacs_attention_reference, inputs, tables, grad_out)
    fast = forward_backward(pacs_attention_fast, inputs, tables, grad_out)
    for name, a, e in zip(NAMES, fast, ref):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12, msg=name)


def test_fast_gradcheck():
    """The hand-written backward against finite differences."""
    inputs, tables, _ = make_inputs(1, 2, 2, 3, 4, dtype=torch.float64, seed=3)
    leaves = [t.clone().requires_grad_() for t in inputs]
    assert torch.autograd.gradcheck(lambda *a: pacs_attention_fast(*a, *tables), leaves)


def test_exact_zeros_get_relu_gradient():
    """q = 0 or k = 0 exactly: zero gradient as autograd's relu in the reference (a kink, so not
    checkable by finite differences)."""
    inputs, tables, grad_out = make_inputs(1, 2, 2, 3, 4, dtype=torch.float64, seed=3)
    inputs[0][0, 0, 0, 0] = 0.0
    inputs[1][0, 1, 2, 1] = 0.0
    ref = forward_backward(pacs_attention_reference, inputs, tables, grad_out)
    fast = forward_backward(pacs_attention_fast, inputs, tables, grad_out)
    assert fast[1][0, 0, 0, 0] == 0 and fast[2][0, 1, 2, 1] == 0
    for name, a, e in zip(NAMES, fast, ref):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12, msg=name)


def closed_form(q, k, v, s_same, s_opp, sin, cos, eps=1e-6):
    """Quadratic form, float64: x_f,i = sum_j (R_i phi_f(q_i)) . (R_j phi(k_j)) v_f,j / n divided by
    phi_f(q_i) . mean_j phi(k_j) + eps, with the same-sign map phi_s(q) = exp([q+, q-] sigmoid(s_same)) - 1,
    the opposite-sign map phi_o(q) = exp([q-, q+] sigmoid(s_opp)) - 1 and phi(k) = exp([k+, k-]) - 1."""
    q, k, v, s_same, s_opp, sin, cos = (t.double() for t in (q, k, v, s_same, s_opp, sin, cos))
    n, half = k.shape[-2], v.shape[-1] // 2
    qp, qn, kp, kn = q.clamp(min=0), (-q).clamp(min=0), k.clamp(min=0), (-k).clamp(min=0)
    phi_k = torch.expm1(torch.cat([kp, kn], -1))
    outs = []
    for phi_q, values in ((torch.expm1(torch.cat([qp, qn], -1) * torch.sigmoid(s_same)), v[..., :half]),
                          (torch.expm1(torch.cat([qn, qp], -1) * torch.sigmoid(s_opp)), v[..., half:])):
        scores = torch.einsum('bhic,bhjc->bhij', rope_rotate(phi_q, sin, cos), rope_rotate(phi_k, sin, cos))
        norm = phi_q @ phi_k.mean(-2, keepdim=True).transpose(-2, -1) + eps
        outs.append(scores @ values / n / norm)
    return torch.cat(outs, dim=-1)


@pytest.mark.parametrize('shape', [(2, 3, 4, 5, 8), (1, 1, 1, 3, 4)])
def test_reference_and_fast_match_closed_form(shape):
    inputs, tables, _ = make_inputs(*shape)
    expected = closed_form(*inputs, *tables)
    for fn in (pacs_attention_reference, pacs_attention_fast):
        err = max_scaled_error(fn(*inputs, *tables).double(), expected)
        assert err <= 1e-5, f'{fn.__name__}: {err:.2e}'


def test_rope_tables_follow_the_grid():
    """Rows then columns: channel pairs share an angle, the first half rotates with the row index."""
    angle = rope_angles(32, 2)  # head dim 16 -> 4 distinct angles, each for a channel pair
    assert angle.shape == (8,) and torch.equal(angle[::2], angle[1::2])
    sin, cos = rope_tables(angle, (3, 5))
    assert sin.shape == cos.shape == (15, 16)
    token = 2 * 5 + 4  # row 2, column 4
    torch.testing.assert_close(cos[token, :8], torch.cos(2 * angle))
    torch.testing.assert_close(sin[token, 8:], torch.sin(4 * angle))
    x = torch.randn(15, 16)
    # a rotation: norms of each channel pair are kept
    pairs = rope_rotate(x, sin, cos).unflatten(-1, (8, 2)).norm(dim=-1)
    torch.testing.assert_close(pairs, x.unflatten(-1, (8, 2)).norm(dim=-1))


def test_dispatcher_impls_and_errors():
    inputs, tables, _ = make_inputs(2, 2, 3, 3, 8)
    ref = pacs_attention(*inputs, *tables, impl='reference')
    assert torch.equal(ref, pacs_attention_reference(*inputs, *tables))
    for impl in ('fast', 'auto'):
        torch.testing.assert_close(pacs_attention(*inputs, *tables, impl=impl), ref, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match='impl must be'):
        pacs_attention(*inputs, *tables, impl='unregistered')
    q, k, v, s_same, s_opp = inputs
    with pytest.raises(ValueError, match='rotary tables'):
        pacs_attention_fast(q, k, v, s_same, s_opp, tables[0][:4], tables[1][:4])
    with pytest.raises(ValueError, match='head dim must be even'):
        pacs_attention_fast(q[..., :7], k[..., :7], v[..., :7], s_same[..., :14], s_opp[..., :14],
                            tables[0][:, :14], tables[1][:, :14])


def test_frozen_spikiness():
    """Frozen s (frozen stages): q, k, v gradients unchanged."""
    inputs, tables, grad_out = make_inputs(2, 2, 3, 4, 8)
    q, k, v, s_same, s_opp = inputs
    results = []
    for fn in (pacs_attention_reference, pacs_attention_fast):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        fn(*leaves, s_same, s_opp, *tables).backward(grad_out)
        results.append([t.grad for t in leaves])
    for a, e in zip(*results):
        assert max_scaled_error(a, e) <= 1e-5


@pytest.mark.parametrize('impl', ['reference', 'fast'])
def test_autocast_bf16_fp32_island(impl):
    inputs, tables, grad_out = make_inputs(2, 2, 5, 6, 16, q_scale=3.0)
    q, k, v, s_same, s_opp = inputs
    expected = pacs_attention(*inputs, *tables, impl='reference')
    leaves = [t.bfloat16().requires_grad_() for t in (q, k, v)]
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = pacs_attention(*leaves, s_same, s_opp, *tables, impl=impl)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    out.float().backward(grad_out)
    for t in leaves:
        assert t.grad.dtype == torch.bfloat16 and torch.isfinite(t.grad).all()
    torch.testing.assert_close(out.float(), expected, rtol=0.05, atol=0.05)


def test_fp32_false_follows_input_dtype():
    inputs, tables, _ = make_inputs(1, 2, 3, 3, 8, dtype=torch.float64)
    out = pacs_attention(*inputs, *tables, fp32=False)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, pacs_attention_reference(*inputs, *tables), rtol=1e-10, atol=1e-12)


def test_rope_tables_are_made_on_the_angles_device_and_dtype():
    """No tensor is made elsewhere and copied over: on a GPU such a copy of a CPU tensor waits for the
    device at every call (every stage of every forward)."""
    angle = rope_angles(32, 2).double()
    with DispatchedOps() as ops:
        sin, cos = rope_tables(angle, (3, 5))
    assert not {'_to_copy', 'copy_', 'to'} & set(ops.names), ops.names
    assert sin.dtype == cos.dtype == torch.float64
    expected = torch.arange(3, dtype=torch.float64)[:, None] * angle[None, :]
    torch.testing.assert_close(sin.view(3, 5, -1)[:, 0, :8], torch.sin(expected), rtol=0, atol=0)


def test_rope_rotation_with_its_hand_written_backward():
    """rope_rotate_fast: rope_rotate's forward bit for bit, and the gradient of x (here a strided view, as
    the RoPE softmax passes q and k) equal to autograd's through the official ops, without their
    zero-filled slice gradients; tables that need a gradient go through autograd."""
    from mmpola.ops import rope_rotate_fast

    sin, cos = (t.double() for t in rope_tables(rope_angles(64, 2), (4, 6)))
    projection = torch.randn(2, 24, 4, 2, 32, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(2, 2, 24, 32, dtype=torch.float64)
    x = projection[:, :, 0].transpose(1, 2)  # (B, h, N, d), not contiguous
    out = rope_rotate_fast(x, sin, cos)
    assert torch.equal(out, rope_rotate(x, sin, cos))
    with DispatchedOps() as ops:
        (fast,) = torch.autograd.grad(out, projection, grad)
    (expected,) = torch.autograd.grad(rope_rotate(x, sin, cos), projection, grad)
    torch.testing.assert_close(fast, expected, rtol=0, atol=1e-12)
    assert 'slice_backward' not in ops.names
    table = sin.clone().requires_grad_()
    rope_rotate_fast(x, table, cos).sum().backward()
    assert table.grad is not None
