"""InLine attention core (mmpola.ops.inline): fast path vs the official-order reference (the checks of the
FLatten and InLine cores side by side: test_flatten.py; the Triton kernels: test_inline_triton.py)."""
import pytest

from mmpola.ops import inline_attention_fast, inline_attention_reference
from tests.fixtures.ops import TOKEN_SHAPES, assert_fast_matches_reference, forward_backward, token_inputs


@pytest.mark.parametrize('shape', [s for s in TOKEN_SHAPES if s[1] == s[2]], ids=lambda s: 'x'.join(map(str, s)))
def test_inline_fast_matches_reference_fp32(shape):
    inputs, grad_out = token_inputs(*shape)
    ref = forward_backward(inline_attention_reference, inputs[:3], grad_out, shape[-1])
    fast = forward_backward(inline_attention_fast, inputs[:3], grad_out, shape[-1])
    truth = forward_backward(inline_attention_reference, [t.double() for t in inputs[:3]], grad_out.double(),
                             shape[-1])
    assert_fast_matches_reference(fast, ref, truth, ['out', 'q', 'k', 'v'])

