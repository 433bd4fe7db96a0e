"""The linear kinds' terms on the token grid (mmpola.models.attention.grid_terms): the key positional
encoding resized to the real grid, the depthwise value term (reduced values upsampled first), and terms
added to the grid tokens only, the prefix tokens unchanged."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from mmpola.models.attention.grid_terms import (
    KeyPositionalEncoding,
    add_to_patches,
    depthwise_value_heads,
    depthwise_value_term,
    split_prefix,
    upsample_values,
)
from mmpola.models.layers import DepthwiseConv2d


class _Encoded(KeyPositionalEncoding, nn.Module):
    def __init__(self, dim, key_grid):
        super().__init__()
        self._init_positional_encoding(dim, key_grid)


def test_key_positional_encoding_is_stored_on_the_pretraining_grid_and_resized():
    module = _Encoded(4, (4, 6))
    assert module.positional_encoding.shape == (1, 24, 4)
    with torch.no_grad():
        module.positional_encoding.copy_(torch.randn(1, 24, 4))
    assert torch.equal(module.resized_positional_encoding((4, 6)), module.positional_encoding)
    grid = module.positional_encoding.reshape(1, 4, 6, 4).permute(0, 3, 1, 2)
    expected = F.interpolate(grid, size=(8, 3), mode='bilinear', align_corners=False).flatten(2).transpose(1, 2)
    assert torch.allclose(module.resized_positional_encoding((8, 3)), expected, atol=1e-6)


def test_the_key_bias_keeps_the_keys_dtype_and_the_encoding_its_float32_gradient():
    """The key bias is the encoding in the keys' dtype: keys of a half-precision projection (autocast) plus
    the bias stay half precision (type promotion would make them float32: twice the bytes the core reads
    and saves); the encoding's gradient still arrives in float32, the same as with float32 keys."""
    g = torch.Generator().manual_seed(0)
    module = _Encoded(4, (2, 3))
    with torch.no_grad():
        module.positional_encoding.copy_(torch.randn(1, 6, 4, generator=g))
    keys = torch.randn(2, 1 + 12, 4, generator=g)  # a prefix token, then a 3 x 4 key grid
    reference = keys + module.key_bias((3, 4), keys.dtype, num_prefix_tokens=1)
    reference.square().sum().backward()
    expected_grad = module.positional_encoding.grad.clone()
    module.positional_encoding.grad = None

    half = keys.to(torch.bfloat16)
    encoded = half + module.key_bias((3, 4), half.dtype, num_prefix_tokens=1)
    assert encoded.dtype == torch.bfloat16
    assert torch.equal(encoded[:, 0], half[:, 0])  # the prefix token unchanged
    assert torch.allclose(encoded.float(), reference, rtol=1e-2, atol=1e-2)
    encoded.float().square().sum().backward()
    grad = module.positional_encoding.grad
    # (the sums differ by the keys' bf16 rounding, about 2**-8 relative)
    assert grad.dtype == torch.float32 and (grad - expected_grad).norm() <= 2e-2 * expected_grad.norm()


@pytest.mark.parametrize('in_projection', [False, True])
def test_depthwise_value_term_per_head_and_as_tokens(in_projection):
    """The value term per head, from contiguous values or from their per-head view of a fused projection
    (B, N, 4, h, d), as the attentions pass them: each head's map convolved by the shared conv."""
    torch.manual_seed(0)
    dwc = DepthwiseConv2d(2, 3)
    projection = torch.randn(1, 4 * 5, 4, 3, 2)
    v = projection[:, :, 2].transpose(1, 2) if in_projection else projection[:, :, 2].transpose(1, 2).contiguous()
    assert v.shape == (1, 3, 20, 2) and v.is_contiguous() != in_projection  # (B, heads, N, d)
    heads = depthwise_value_heads(dwc, v, (4, 5), (4, 5))
    maps = v.reshape(3, 4, 5, 2).permute(0, 3, 1, 2)
    expected = nn.Conv2d.forward(dwc, maps).permute(0, 2, 3, 1).reshape(1, 3, 20, 2)
    assert torch.allclose(heads, expected, atol=1e-6)
    tokens = depthwise_value_term(dwc, v, (4, 5), (4, 5))
    assert torch.equal(tokens, heads.transpose(1, 2).reshape(1, 20, 6))


@pytest.mark.parametrize('impl', ['torch', 'triton'])
def test_depthwise_value_term_added_to_a_residual(impl, monkeypatch):
    """``residual=``: the core's output plus the term, per head (B, h, N, d) and as tokens (B, N, C), in the
    residual's layout (merging the heads after it is a view); the same values as the term added after it.
    The Triton path (Pola's and FLatten's on a GPU) adds the residual where its kernel writes the term."""
    monkeypatch.setenv('MMPOLA_DEPTHWISE_CONV', impl)
    torch.manual_seed(0)
    dwc = DepthwiseConv2d(2, 3)
    projection = torch.randn(1, 4 * 5, 4, 3, 2)
    v = projection[:, :, 2].transpose(1, 2)
    core = torch.randn(1, 20, 3, 2)  # the core's output in the tokens' layout, seen per head
    heads = depthwise_value_heads(dwc, v, (4, 5), (4, 5), residual=core.transpose(1, 2))
    expected = core.transpose(1, 2) + depthwise_value_heads(dwc, v, (4, 5), (4, 5))
    assert torch.allclose(heads, expected, atol=1e-6)
    assert heads.transpose(1, 2).is_contiguous()
    tokens = depthwise_value_term(dwc, v, (4, 5), (4, 5), residual=core.flatten(2))
    assert torch.allclose(tokens, expected.transpose(1, 2).reshape(1, 20, 6), atol=1e-6)


def test_values_of_a_reduced_grid_are_upsampled_first():
    v = torch.arange(2 * 3, dtype=torch.float32).reshape(1, 1, 6, 1)
    assert upsample_values(v, (2, 3), (4, 6), 'bilinear2d').shape == (1, 1, 24, 1)
    along_tokens = upsample_values(v, (2, 3), (4, 6), 'linear1d')
    assert torch.allclose(along_tokens[0, 0, :, 0], F.interpolate(v[0, 0].T[None], size=24, mode='linear')[0, 0])


def test_terms_reach_the_grid_tokens_only():
    x = torch.randn(2, 1 + 6, 4)
    term = torch.randn(2, 6, 4)
    prefix, patches = split_prefix(x, 1)
    out = add_to_patches(x, term, 1)
    assert torch.equal(out[:, :1], prefix) and torch.equal(out[:, 1:], patches + term)
    assert torch.equal(add_to_patches(x[:, 1:], term, 0), x[:, 1:] + term)


def test_key_bias_is_the_encoding_on_the_grid_tokens_and_zero_on_prefix_tokens():
    """``k + key_bias(...)`` adds the resized encoding to the grid tokens only (a zero bias on the prefix
    tokens), in the keys' dtype."""
    g = torch.Generator().manual_seed(0)
    module = _Encoded(6, (2, 3))
    with torch.no_grad():
        module.positional_encoding.copy_(torch.randn(1, 6, 6, generator=g))
    encoding = module.resized_positional_encoding((3, 4))
    for prefix, dtype in ((0, torch.float32), (1, torch.float32), (2, torch.bfloat16)):
        keys = torch.randn(2, prefix + 12, 6, generator=g).to(dtype)
        bias = module.key_bias((3, 4), dtype, num_prefix_tokens=prefix)
        assert bias.shape == (1, prefix + 12, 6) and bias.dtype == dtype
        assert torch.equal(keys + bias, add_to_patches(keys, encoding.to(dtype), prefix))
