"""FLatten and InLine attention cores: fast path vs the official-order reference, fp32 island."""
import pytest
import torch

from mmpola.ops import (
    flatten_attention,
    flatten_attention_fast,
    flatten_attention_reference,
    focused_feature_map,
    inline_attention,
    inline_attention_fast,
    inline_attention_reference,
)

# (B, N, n, C, h): n != N (PVT spatial reduction), one token, one and many heads
SHAPES = [(1, 7, 7, 4, 1), (2, 49, 49, 32, 2), (2, 37, 9, 48, 3), (1, 15, 15, 64, 8),
          (2, 1, 1, 8, 2), (1, 1, 6, 16, 1), (3, 11, 1, 12, 6)]


def make_inputs(B, N, n, C, h, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(B, N, C, generator=g), torch.randn(B, n, C, generator=g), torch.randn(B, n, C, generator=g)
    scale = torch.randn(1, 1, C, generator=g) * 0.3
    grad_out = torch.randn(B, N, C, generator=g)
    return [t.to(dtype) for t in (q, k, v, scale)], grad_out.to(dtype)


def forward_backward(fn, inputs, grad_out, *args):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves, *args)
    out.backward(grad_out)
    return [out.detach()] + [t.grad for t in leaves]


def scaled_error(actual, expected):
    return ((actual - expected).abs().max() / expected.abs().max().clamp_min(1.0)).item()


def assert_fast_matches_reference(fast, ref, truth, names):
    """Each output / gradient of the fast path within 1e-5 of the reference's. A gradient that is a
    reduction over many products (``scale``) rounds differently in the two fp32 op orders: where
    they differ by more on some CPU's kernels, the fast path must be within 1e-5 of the float64
    truth (the reference is then about as far on the other side)."""
    for name, a, e, t in zip(names, fast, ref, truth):
        assert a.shape == e.shape, name
        assert scaled_error(a, e) <= 1e-5 or scaled_error(a.double(), t) <= 1e-5, name


@pytest.mark.parametrize('shape', SHAPES, ids=lambda s: 'x'.join(map(str, s)))
def test_flatten_fast_matches_reference_fp32(shape):
    inputs, grad_out = make_inputs(*shape)
    ref = forward_backward(flatten_attention_reference, inputs, grad_out, shape[-1])
    fast = forward_backward(flatten_attention_fast, inputs, grad_out, shape[-1])
    truth = forward_backward(flatten_attention_reference, [t.double() for t in inputs], grad_out.double(), shape[-1])
    assert_fast_matches_reference(fast, ref, truth, ['out', 'q', 'k', 'v', 'scale'])


@pytest.mark.parametrize('shape', [s for s in SHAPES if s[1] == s[2]], ids=lambda s: 'x'.join(map(str, s)))
def test_inline_fast_matches_reference_fp32(shape):
    inputs, grad_out = make_inputs(*shape)
    ref = forward_backward(inline_attention_reference, inputs[:3], grad_out, shape[-1])
    fast = forward_backward(inline_attention_fast, inputs[:3], grad_out, shape[-1])
    truth = forward_backward(inline_attention_reference, [t.double() for t in inputs[:3]], grad_out.double(),
                             shape[-1])
    assert_fast_matches_reference(fast, ref, truth, ['out', 'q', 'k', 'v'])


@pytest.mark.parametrize('shape', [(2, 13, 13, 16, 2), (1, 9, 9, 48, 6)])
def test_fast_paths_equal_reference_math_in_fp64(shape):
    inputs, grad_out = make_inputs(*shape, dtype=torch.float64)
    for fast, ref, n_in in ((flatten_attention_fast, flatten_attention_reference, 4),
                            (inline_attention_fast, inline_attention_reference, 3)):
        a = forward_backward(fast, inputs[:n_in], grad_out, shape[-1])
        e = forward_backward(ref, inputs[:n_in], grad_out, shape[-1])
        for x, y in zip(a, e):
            torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12)


def test_focused_feature_map_gradcheck():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 5, 6, generator=g, dtype=torch.float64, requires_grad=True)
    s = (torch.rand(1, 1, 6, generator=g, dtype=torch.float64) + 0.5).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, s: focused_feature_map(x, s, 3), (x, s))
    y = focused_feature_map(x, s, 3)  # the norm over channels is kept: ||phi(x)|| = ||a||
    a = (x.relu() + 1e-6) / s
    torch.testing.assert_close(y.norm(dim=-1), a.norm(dim=-1))


@pytest.mark.parametrize('impl', ['reference', 'fast'])
def test_fp32_island_under_autocast(impl):
    inputs, _ = make_inputs(2, 30, 30, 32, 2)
    low = [t.bfloat16() for t in inputs]
    with torch.autocast('cpu', dtype=torch.bfloat16):
        f_out = flatten_attention(*low, 2, impl=impl)
        i_out = inline_attention(*low[:3], 2, impl=impl)
    assert f_out.dtype == i_out.dtype == torch.bfloat16
    f_ref = flatten_attention(*[t.float() for t in low], 2, impl='reference')
    i_ref = inline_attention(*[t.float() for t in low[:3]], 2, impl='reference')
    assert scaled_error(f_out.float(), f_ref) <= 1e-2 and scaled_error(i_out.float(), i_ref) <= 1e-2


def test_errors():
    q = torch.randn(1, 4, 6)
    with pytest.raises(ValueError, match='not divisible by num_heads'):
        flatten_attention(q, q, q, torch.zeros(1, 1, 6), 4)
    with pytest.raises(ValueError, match='expects q'):
        inline_attention(q, q[:, :, :4], q, 2)
    with pytest.raises(ValueError, match="impl must be"):
        inline_attention(q, q, q, 2, impl='fastest')
