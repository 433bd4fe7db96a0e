"""Pola attention and its depthwise value term in one autograd Function (pola_value_term_triton): the results of
the two Triton ops it joins, bit for bit, forward and backward; and the attention module's choice of it, which
gives the module's results unchanged. Without a GPU the kernels run through Triton's interpreter
(tests/conftest.py sets TRITON_INTERPRET=1)."""
import contextlib

import pytest
import torch

from mmpola.models.attention.pola import PolaAttention
from mmpola.ops.depthwise_triton import depthwise_conv2d_triton
from mmpola.ops.pola_triton import pola_attention_triton, pola_value_term_triton

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'
FUSED_NODE = '_PolaValueTermTritonBackward'


def _inputs(B, heads, hw, d, dtype, seed=0, kernel=5):
    """Token-layout operands as views of one projection (q, k, v, v_term: v_term a view of its own of v's
    channels), the raw parameters, a key encoding in the keys' dtype and the depthwise conv's weight and bias."""
    g = torch.Generator().manual_seed(seed)
    N, C = hw[0] * hw[1], heads * d
    projection = torch.randn(B, N, 4 * C, generator=g)
    power = torch.randn(1, heads, 1, d, generator=g) * 0.5
    scale = torch.randn(1, 1, C, generator=g) * 0.3
    encoding = torch.randn(1, N, C, generator=g) * 0.5
    weight = torch.randn(d, 1, kernel, kernel, generator=g) * 0.2
    bias = torch.randn(d, generator=g) * 0.1
    leaves = [projection.to(DEVICE, dtype), power.to(DEVICE), scale.to(DEVICE), encoding.to(DEVICE, dtype),
              weight.to(DEVICE), bias.to(DEVICE)]
    return [t.requires_grad_() for t in leaves], torch.randn(B, N, C, generator=g).to(DEVICE, dtype)


def _split(projection, C):
    q, k, v, _ = projection.unflatten(-1, (4, C)).unbind(-2)
    return q, k, v, v.view_as(v)


def _joined(leaves, hw, heads, with_bias=True, with_conv_bias=True):
    projection, power, scale, encoding, weight, bias = leaves
    q, k, v, v_term = _split(projection, scale.shape[-1])
    return pola_value_term_triton(q, k, v, v_term, power, scale, weight, bias if with_conv_bias else None, hw,
                                  key_bias=encoding if with_bias else None)


def _apart(leaves, hw, heads, with_bias=True, with_conv_bias=True):
    """What the attention module runs without the joined Function: the core on head views, then the conv of the
    values' maps with the core's output as its residual, the heads merged."""
    projection, power, scale, encoding, weight, bias = leaves
    B, N, C = projection.shape[0], projection.shape[1], scale.shape[-1]
    d = C // heads

    def split(t):
        return t.reshape(t.shape[0], t.shape[1], heads, d).transpose(1, 2)

    q, k, v, v_term = _split(projection, C)
    out = pola_attention_triton(split(q), split(k), split(v), power, split(scale),
                                key_bias=split(encoding) if with_bias else None)

    def maps(t):
        return t.unflatten(2, hw).permute(0, 1, 4, 2, 3)

    conv_weight = weight.view(d, *weight.shape[2:], 1).permute(0, 3, 1, 2)  # as DepthwiseConv2d passes it
    dtype = projection.dtype
    total = depthwise_conv2d_triton(maps(split(v_term)), conv_weight.to(dtype),
                                    bias.to(dtype) if with_conv_bias else None, residual=maps(out))
    return total.permute(0, 1, 3, 4, 2).reshape(B, heads, N, d).transpose(1, 2).reshape(B, N, C)


def _forward_backward(fn, leaves, grad, *args, **kwargs):
    for t in leaves:
        t.grad = None
    out = fn(leaves, *args, **kwargs)
    out.backward(grad)
    return [out.detach()] + [None if t.grad is None else t.grad.clone() for t in leaves]


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16], ids=['float32', 'bfloat16'])
@pytest.mark.parametrize('case', [(2, 2, (5, 7), 16, True, True), (1, 3, (4, 6), 8, False, False),
                                  (1, 1, (9, 5), 32, True, False)],
                         ids=['B2-h2-5x7-d16', 'h3-no-biases', 'h1-d32-no-conv-bias'])
def test_joined_function_gives_the_two_ops_results_bit_for_bit(case, dtype):
    """The output and every gradient (the projection's, with v's two uses added; the raw power's and scale's, the
    encoding's, the conv's weight and bias) equal those of pola_attention_triton followed by
    depthwise_conv2d_triton, in the same dtypes and strides."""
    B, heads, hw, d, with_bias, with_conv_bias = case
    leaves, grad = _inputs(B, heads, hw, d, dtype)
    joined = _forward_backward(_joined, leaves, grad, hw, heads, with_bias, with_conv_bias)
    apart = _forward_backward(_apart, leaves, grad, hw, heads, with_bias, with_conv_bias)
    names = ['out', 'projection', 'power', 'scale', 'encoding', 'weight', 'bias']
    for name, a, e in zip(names, joined, apart):
        if e is None:
            assert a is None, name
            continue
        assert a.dtype == e.dtype and a.shape == e.shape, name
        assert torch.equal(a, e), f'{name}: differs by {(a.float() - e.float()).abs().max().item():.3g}'
    assert joined[0].dtype == dtype


def test_joined_function_checks_its_operands():
    leaves, _ = _inputs(1, 2, (4, 6), 8, torch.float32)
    projection, power, scale, encoding, weight, bias = leaves
    q, k, v, v_term = _split(projection, 16)
    with pytest.raises(ValueError, match='grid'):
        pola_value_term_triton(q, k, v, v_term, power, scale, weight, bias, (5, 6))
    with pytest.raises(ValueError, match='one shape'):
        pola_value_term_triton(q, k[:, :12], v, v_term, power, scale, weight, bias, (4, 6))
    with pytest.raises(TypeError, match='one dtype'):
        pola_value_term_triton(q, k, v.double(), v_term, power, scale, weight, bias, (4, 6))
    with pytest.raises(ValueError, match='scale'):
        pola_value_term_triton(q, k, v, v_term, power, scale.view(1, 2, 1, 8), weight, bias, (4, 6))
    with pytest.raises(ValueError, match='key_bias'):
        pola_value_term_triton(q, k, v, v_term, power, scale, weight, bias, (4, 6), key_bias=encoding.double())


def _node_names(out):
    names, stack, seen = set(), [out.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return names


def _module(layout='fused', sr_ratio=1, seed=0):
    torch.manual_seed(seed)
    module = PolaAttention(32, 2, (4, 4), qkv_layout=layout, sr_ratio=sr_ratio, attn_impl='triton').to(DEVICE)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, 0.3)
    return module


def _run_module(module, x, hw, amp=None, joined=True, monkeypatch=None, **kwargs):
    """Output, the input's and the parameters' gradients, and the autograd nodes' names of one step; with
    ``joined=False`` the module's choice of the joined Function is turned off."""
    context = contextlib.nullcontext() if joined else monkeypatch.context()
    with context as patch:
        if not joined:
            patch.setattr(PolaAttention, '_value_term_in_kernels', lambda self, *args: False)
        module.zero_grad()
        x = x.detach().clone().requires_grad_()
        with torch.autocast(torch.device(DEVICE).type, amp, enabled=amp is not None):
            out = module(x, hw, **kwargs)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(DEVICE)
        (out.float() * g).sum().backward()
        grads = {n: p.grad for n, p in module.named_parameters() if p.grad is not None}
        return out.detach(), x.grad, grads, _node_names(out)


@pytest.mark.parametrize('amp', [None, torch.bfloat16], ids=['float32', 'bf16-autocast'])
@pytest.mark.parametrize('layout', ['fused', 'separate'])
def test_attention_module_joins_core_and_term_with_the_same_results(layout, amp, monkeypatch):
    """With the Triton kernels for the core (attn_impl='triton') and the conv (MMPOLA_DEPTHWISE_CONV=triton), the
    module runs the joined Function (one autograd node for the core, the term and their views) and gives the
    results of the two ops called apart, bit for bit, gradients and their strides included; the encoding is
    resized to the grid (4 x 6 against its 4 x 4)."""
    monkeypatch.setenv('MMPOLA_DEPTHWISE_CONV', 'triton')
    module = _module(layout)
    x = torch.randn(2, 24, 32, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    out, grad_x, grads, nodes = _run_module(module, x, (4, 6), amp)
    assert FUSED_NODE in nodes
    assert not {'_PolaTritonBackward', '_DepthwiseTritonBackward'} & nodes
    expected_out, expected_grad_x, expected_grads, expected_nodes = _run_module(
        module, x, (4, 6), amp, joined=False, monkeypatch=monkeypatch)
    assert FUSED_NODE not in expected_nodes and '_PolaTritonBackward' in expected_nodes
    assert torch.equal(out, expected_out) and torch.equal(grad_x, expected_grad_x)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        assert torch.equal(grad, expected_grads[name]), name
        assert grad.stride() == expected_grads[name].stride(), name


@pytest.mark.parametrize('case', ['prefix tokens', 'reduced keys', "attn_impl='fast'", 'library conv', 'dwc hooked'])
def test_attention_module_calls_the_ops_apart_where_the_joined_function_does_not_apply(case, monkeypatch):
    """Prefix tokens, keys on a reduced grid, another implementation of the core or of the conv, and hooks on
    the conv (which must see its own call) keep the two ops apart."""
    monkeypatch.setenv('MMPOLA_DEPTHWISE_CONV', 'torch' if case == 'library conv' else 'triton')
    module = _module('separate', sr_ratio=2 if case == 'reduced keys' else 1)
    if case == "attn_impl='fast'":
        module.attn_impl = 'fast'
    if case == 'dwc hooked':
        module.dwc.register_forward_hook(lambda *args: None)
    prefix = 1 if case == 'prefix tokens' else 0
    x = torch.randn(2, prefix + 24, 32, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    *_, nodes = _run_module(module, x, (4, 6), num_prefix_tokens=prefix)
    assert FUSED_NODE not in nodes
