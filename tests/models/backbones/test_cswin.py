"""The CSWin architecture (mmpola.models.backbones.cswin) on its own: mixed stages with a whole-map
branch of another kind. The stripes themselves are tested with the softmax kinds
(tests/models/attention/test_softmax.py); CSWin's dense contract is in test_base.py."""
import pytest
import torch

from mmpola.models import CSWinBackbone
from mmpola.models.checks import PolaConfigError
from tests.fixtures.backbones import MINI_CSWIN
from tests.fixtures.ops import DispatchedOps


def test_cswin_mixed_stage_and_pola_branches():
    """'M<k>': the first k blocks of the stage with the kind (one whole-map branch), the rest stripes; Pola's
    branch needs four projections, so its blocks' qkv is Linear(C, 4C)."""
    torch.manual_seed(0)
    model = CSWinBackbone(arch=dict(MINI_CSWIN, depths=[1, 3, 1, 1]), attn='pola', attn_type='LMSS1').train()
    assert model.block_kinds[1] == ['pola', 'stripe_softmax', 'stripe_softmax']
    assert [len(b.attns) for b in model.stage2] == [1, 2, 2]
    assert model.stage2[0].qkv.out_features == 4 * 32 and model.stage2[1].qkv.out_features == 3 * 32
    assert hasattr(model.stage2[0].attns[0], 'get_v')  # CSWin's LePE, stored under the official name
    outs = model(torch.randn(1, 3, 61, 83))
    sum(o.square().mean() for o in outs).backward()
    assert not [n for n, p in model.named_parameters() if p.grad is None]


@pytest.mark.parametrize('kind,letter', [('flatten', 'L'), ('inline', 'I'), ('pola', 'L')])
def test_a_linear_branch_and_its_lepe_take_v_from_one_unbind(kind, letter):
    """The block takes a linear branch's operands apart once and hands the module that tuple: the LePE's v is
    the attention's, so the backward selects nothing of the projection (each selection's backward fills a
    zero gradient of the whole projection), and the module computes from the tuple what it computes from the
    projection."""
    torch.manual_seed(0)
    model = CSWinBackbone(arch=MINI_CSWIN, attn=kind, attn_type=letter * 4).train()
    outs = model(torch.randn(1, 3, 64, 96))
    with DispatchedOps() as backward:
        sum(o.square().mean() for o in outs).backward()
    assert 'stack' in backward.names  # unbind's backward
    assert 'select_backward' not in backward.names, backward.names

    block = model.stage2[0]
    attn = block.attns[0]
    hw = (4, 6)
    qkv = torch.randn(2, 24, block.projections, block.dim)
    x_mean = torch.randn(2, block.dim)
    results = []
    for whole in (True, False):
        leaf = qkv.clone().requires_grad_()
        out = attn(leaf if whole else leaf.unbind(2), hw, x_mean=x_mean)
        out.square().sum().backward()
        results.append((out.detach(), leaf.grad))
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)


def test_the_stripe_branches_take_their_halves_from_one_split():
    """A block of two stripe branches hands each half of the projection's channels as views of one split: the
    backward stacks their gradients once, where a slice per branch filled a zero gradient of the whole
    projection each and added the two; the same output and gradients as the slices."""
    torch.manual_seed(0)
    model = CSWinBackbone(arch=MINI_CSWIN, attn='flatten', attn_type='LSSS').train()
    block = model.stage2[0]
    assert len(block.attns) == 2
    x = torch.randn(2, 8 * 12, block.dim)
    with DispatchedOps() as backward:
        out = block(x.requires_grad_(), (8, 12))
        out.square().sum().backward()
    assert 'slice_backward' not in backward.names and 'stack' in backward.names, backward.names

    half = block.dim // 2
    qkv = torch.randn(2, 8 * 12, block.projections, block.dim)
    x_mean = torch.randn(2, block.dim)
    results = []
    for split in (True, False):
        leaf = qkv.clone().requires_grad_()
        if split:
            halves = leaf.unflatten(-1, (2, half)).unbind(-2)
        else:
            halves = (leaf[..., :half], leaf[..., half:])
        out = torch.cat([block._branch(b, halves[b], (8, 12), x_mean[:, b * half:(b + 1) * half], {})
                         for b in range(2)], dim=2)
        out.square().sum().backward()
        results.append((out.detach(), leaf.grad))
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)


def test_stripe_stages_need_an_even_head_count():
    """The two stripe branches take half the heads each: an odd count is a clear error, not a crash."""
    with pytest.raises(PolaConfigError, match=r"stage 1 has stripe softmax blocks .* num_heads\[0\] = 1"):
        CSWinBackbone(arch=MINI_CSWIN, attn_type='SSSS')
    CSWinBackbone(arch=MINI_CSWIN, attn='flatten', attn_type='LSSS')  # the stage of one head runs the linear kind
