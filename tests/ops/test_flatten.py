"""FLatten attention core (mmpola.ops.flatten): fast path vs the official-order reference, the focused
feature map; and what the FLatten and InLine cores are checked for side by side: the fast paths' math
in float64, the fp32 island under autocast, argument errors (InLine's own: test_inline.py)."""
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
from tests.fixtures.ops import (
    TOKEN_SHAPES,
    assert_fast_matches_reference,
    forward_backward,
    max_scaled_error,
    token_inputs,
)


@pytest.mark.parametrize('shape', TOKEN_SHAPES, ids=lambda s: 'x'.join(map(str, s)))
def test_flatten_fast_matches_reference_fp32(shape):
    inputs, grad_out = token_inputs(*shape)
    ref = forward_backward(flatten_attention_reference, inputs, grad_out, shape[-1])
    fast = forward_backward(flatten_attention_fast, inputs, grad_out, shape[-1])
    truth = forward_backward(flatten_attention_reference, [t.double() for t in inputs], grad_out.double(), shape[-1])
    assert_fast_matches_reference(fast, ref, truth, ['out', 'q', 'k', 'v', 'scale'])


@pytest.mark.parametrize('shape', [(2, 13, 13, 16, 2), (1, 9, 9, 48, 6)])
def test_fast_paths_equal_reference_math_in_fp64(shape):
    inputs, grad_out = token_inputs(*shape, dtype=torch.float64)
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
    inputs, _ = token_inputs(2, 30, 30, 32, 2)
    low = [t.bfloat16() for t in inputs]
    with torch.autocast('cpu', dtype=torch.bfloat16):
        f_out = flatten_attention(*low, 2, impl=impl)
        i_out = inline_attention(*low[:3], 2, impl=impl)
    assert f_out.dtype == i_out.dtype == torch.bfloat16
    f_ref = flatten_attention(*[t.float() for t in low], 2, impl='reference')
    i_ref = inline_attention(*[t.float() for t in low[:3]], 2, impl='reference')
    assert max_scaled_error(f_out.float(), f_ref) <= 1e-2 and max_scaled_error(i_out.float(), i_ref) <= 1e-2


def test_errors():
    q = torch.randn(1, 4, 6)
    with pytest.raises(ValueError, match='not divisible by num_heads'):
        flatten_attention(q, q, q, torch.zeros(1, 1, 6), 4)
    with pytest.raises(ValueError, match='expects q'):
        inline_attention(q, q[:, :, :4], q, 2)
    with pytest.raises(ValueError, match="impl must be"):
        inline_attention(q, q, q, 2, impl='fastest')
