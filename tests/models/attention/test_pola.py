"""Pola attention (kind 'pola', mmpola.models.attention.pola): where the core and the depthwise value term both run
in their Triton kernels, the module calls them through one autograd Function (pola_value_term_triton), with the
results of the two ops called apart; elsewhere it calls them apart. Without a GPU the kernels run through Triton's
interpreter (tests/conftest.py sets TRITON_INTERPRET=1)."""
import contextlib

import pytest
import torch

from mmpola.models.attention.pola import PolaAttention

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'
FUSED_NODE = '_PolaValueTermTritonBackward'


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
