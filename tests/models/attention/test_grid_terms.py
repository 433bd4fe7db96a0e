"""The linear kinds' terms on the token grid (mmpola.models.attention.grid_terms): the key positional
encoding resized to the real grid, the depthwise value term (reduced values upsampled first), terms
added to the grid tokens only, the prefix tokens unchanged, and Pola's and FLatten's modules calling their core
and value term (InLine's: its core and local residual) through one autograd Function
(mmpola.ops.value_term_triton) where both run in their Triton kernels, with the results of the two ops called
apart (without a GPU the kernels run through Triton's interpreter: tests/conftest.py sets TRITON_INTERPRET=1)."""
import contextlib

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from mmpola.models.attention import inline as inline_attention_module
from mmpola.models.attention.flatten import FocusedLinearAttention
from mmpola.models.attention.grid_terms import (
    JoinedValueTerm,
    KeyPositionalEncoding,
    add_to_patches,
    depthwise_value_heads,
    depthwise_value_term,
    split_prefix,
    upsample_values,
)
from mmpola.models.attention.inline import InLineAttention
from mmpola.models.attention.pola import PolaAttention
from mmpola.models.layers import DepthwiseConv2d
from tests.fixtures.ops import autograd_node_names

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'


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


# Pola's and FLatten's modules: the core and the value term in one autograd Function where both run in Triton

KINDS = {'pola': (PolaAttention, '_PolaTritonBackward'), 'flatten': (FocusedLinearAttention, '_FlattenTritonBackward')}
JOINED_NODE = '_ValueTermTritonBackward'


def _randomised(build, seed=0):
    """The module ``build()`` makes (seeded), on DEVICE, its parameters drawn from N(0, 0.3^2)."""
    torch.manual_seed(seed)
    module = build().to(DEVICE)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, 0.3)
    return module


def _module(kind, layout='fused', sr_ratio=1, seed=0):
    return _randomised(lambda: KINDS[kind][0](32, 2, (4, 4), qkv_layout=layout, sr_ratio=sr_ratio,
                                              attn_impl='triton'), seed)


def _run_module(module, x, hw, amp=None, joined=True, monkeypatch=None, **kwargs):
    """Output, the input's and the parameters' gradients, and the autograd nodes' names of one step; with
    ``joined=False`` the module's choice of the joined Function is turned off (Pola's and FLatten's mixin, InLine's
    module's call of value_term_joins)."""
    context = contextlib.nullcontext() if joined else monkeypatch.context()
    with context as patch:
        if not joined and isinstance(module, InLineAttention):
            patch.setattr(inline_attention_module, 'value_term_joins', lambda *args: False)
        elif not joined:
            patch.setattr(JoinedValueTerm, '_value_term_in_kernels', lambda self, *args: False)
        module.zero_grad()
        x = x.detach().clone().requires_grad_()
        with torch.autocast(torch.device(DEVICE).type, amp, enabled=amp is not None):
            out = module(x, hw, **kwargs)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(DEVICE)
        (out.float() * g).sum().backward()
        grads = {n: p.grad for n, p in module.named_parameters() if p.grad is not None}
        return out.detach(), x.grad, grads, autograd_node_names(out)


@pytest.mark.parametrize('amp', [None, torch.bfloat16], ids=['float32', 'bf16-autocast'])
@pytest.mark.parametrize('layout', ['fused', 'separate'])
@pytest.mark.parametrize('kind', list(KINDS))
def test_attention_module_joins_core_and_term_with_the_same_results(kind, layout, amp, monkeypatch):
    """With the Triton kernels for the core (attn_impl='triton') and the conv (MMPOLA_DEPTHWISE_CONV=triton), the
    module runs the joined Function (one autograd node for the core, the term and their views, and for the
    projection's operands taken apart, with Pola's gate) and gives the results of the two ops called apart, bit for
    bit, gradients and their strides included; the encoding is resized to the grid (4 x 6 against its 4 x 4)."""
    monkeypatch.setenv('MMPOLA_DEPTHWISE_CONV', 'triton')
    module = _module(kind, layout)
    core_node = KINDS[kind][1]
    x = torch.randn(2, 24, 32, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    out, grad_x, grads, nodes = _run_module(module, x, (4, 6), amp)
    assert JOINED_NODE in nodes
    assert not {core_node, '_DepthwiseTritonBackward', 'UnbindBackward0', 'MulBackward0'} & nodes
    expected_out, expected_grad_x, expected_grads, expected_nodes = _run_module(
        module, x, (4, 6), amp, joined=False, monkeypatch=monkeypatch)
    assert JOINED_NODE not in expected_nodes and {core_node, 'UnbindBackward0'} <= expected_nodes
    assert torch.equal(out, expected_out) and torch.equal(grad_x, expected_grad_x)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        assert torch.equal(grad, expected_grads[name]), name
        assert grad.stride() == expected_grads[name].stride(), name


@pytest.mark.parametrize('case', ['prefix tokens', 'reduced keys', "attn_impl='fast'", 'library conv', 'dwc hooked'])
@pytest.mark.parametrize('kind', list(KINDS))
def test_attention_module_calls_the_ops_apart_where_the_joined_function_does_not_apply(kind, case, monkeypatch):
    """Prefix tokens, keys on a reduced grid, another implementation of the core or of the conv, and hooks on
    the conv (which must see its own call) keep the two ops apart."""
    monkeypatch.setenv('MMPOLA_DEPTHWISE_CONV', 'torch' if case == 'library conv' else 'triton')
    module = _module(kind, 'separate', sr_ratio=2 if case == 'reduced keys' else 1)
    if case == "attn_impl='fast'":
        module.attn_impl = 'fast'
    if case == 'dwc hooked':
        module.dwc.register_forward_hook(lambda *args: None)
    prefix = 1 if case == 'prefix tokens' else 0
    x = torch.randn(2, prefix + 24, 32, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    *_, nodes = _run_module(module, x, (4, 6), num_prefix_tokens=prefix)
    assert JOINED_NODE not in nodes


# InLine's module: the core and its local residual (kernels per image) in the same Function

def _inline_module(layout, seed=0):
    return _randomised(lambda: InLineAttention(32, 2, qkv_layout=layout, attn_impl='triton'), seed)


@pytest.mark.parametrize('amp', [None, torch.bfloat16], ids=['float32', 'bf16-autocast'])
@pytest.mark.parametrize('layout', ['fused', 'separate'])
def test_inline_module_joins_core_and_local_residual_with_the_same_results(layout, amp, monkeypatch):
    """With the Triton kernels for the core and the conv, InLine attention runs the joined Function (no node of
    its core's nor of the convolution's own Function, nor of the projection's operands taken apart) and gives the
    results of the two ops called apart, bit for bit: the output, the input's gradient (through the projections and
    the mean token its kernels come from) and every parameter's, with their strides."""
    monkeypatch.setenv('MMPOLA_DEPTHWISE_CONV', 'triton')
    module = _inline_module(layout)
    x = torch.randn(2, 24, 32, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    out, grad_x, grads, nodes = _run_module(module, x, (4, 6), amp)
    assert JOINED_NODE in nodes
    assert not {'_InLineTritonBackward', '_DepthwiseTritonBackward', 'UnbindBackward0'} & nodes
    expected_out, expected_grad_x, expected_grads, expected_nodes = _run_module(
        module, x, (4, 6), amp, joined=False, monkeypatch=monkeypatch)
    assert JOINED_NODE not in expected_nodes and {'_InLineTritonBackward', 'UnbindBackward0'} <= expected_nodes
    assert torch.equal(out, expected_out) and torch.equal(grad_x, expected_grad_x)
    assert grads.keys() == expected_grads.keys() and 'residual.2.weight' in grads
    for name, grad in grads.items():
        assert torch.equal(grad, expected_grads[name]), name
        assert grad.stride() == expected_grads[name].stride(), name


@pytest.mark.parametrize('case', ['prefix tokens', "attn_impl='fast'", 'library conv'])
def test_inline_module_calls_the_ops_apart_where_the_joined_function_does_not_apply(case, monkeypatch):
    """A class token first (its residual reaches the grid tokens only), another implementation of the core or of
    the conv keep the two ops apart."""
    monkeypatch.setenv('MMPOLA_DEPTHWISE_CONV', 'torch' if case == 'library conv' else 'triton')
    module = _inline_module('fused')
    if case == "attn_impl='fast'":
        module.attn_impl = 'fast'
    prefix = 1 if case == 'prefix tokens' else 0
    x = torch.randn(2, prefix + 24, 32, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    *_, nodes = _run_module(module, x, (4, 6), num_prefix_tokens=prefix)
    assert JOINED_NODE not in nodes


def test_inline_module_joins_on_the_projected_layout_of_stripes(monkeypatch):
    """The 'projected' layout (InLine-CSWin: the block hands the module its q, k, v and the mean token) on stripes
    cut from an image, the operands strided views of a permuted copy: joined and apart give the same bits."""
    monkeypatch.setenv('MMPOLA_DEPTHWISE_CONV', 'triton')
    module = _inline_module('projected')
    g = torch.Generator().manual_seed(1)
    image = torch.randn(2, 8, 12, 3, 32, generator=g).to(DEVICE)  # (B, H, W, q k v, C)
    x_mean = torch.randn(6, 32, generator=g).to(DEVICE)
    stripes = image.reshape(2, 8, 3, 4, 3, 32).permute(0, 2, 1, 3, 4, 5).reshape(6, 32, 3, 32)  # stripes 4 wide
    joined = _run_module(module, stripes, (8, 4), x_mean=x_mean)
    apart = _run_module(module, stripes, (8, 4), joined=False, monkeypatch=monkeypatch, x_mean=x_mean)
    assert JOINED_NODE in joined[3] and JOINED_NODE not in apart[3]
    assert torch.equal(joined[0], apart[0]) and torch.equal(joined[1], apart[1])
    assert joined[2].keys() == apart[2].keys()
    for name, grad in joined[2].items():
        assert torch.equal(grad, apart[2][name]), name
