"""Tensors computed from the map size and no trainable parameter are kept for the next call at the
same size (mmpola.models.layers.SizeCache): PolaFormer++'s RoPE tables. The residual connection of a branch with a
layer scale and stochastic depth (mmpola.models.layers.add_branch)."""
import copy
import pickle

import pytest
import torch

from mmpola.models.attention import RotaryEmbedding
from mmpola.models.layers import ParameterCache, SizeCache
from mmpola.ops import rope_tables


def _expected(rope, hw):
    return torch.stack(rope_tables(rope.angle, hw))


def test_rope_tables_are_reused_at_the_same_size_and_right_at_another():
    rope = RotaryEmbedding(64, 2)
    first = rope((7, 9))
    assert torch.equal(first, _expected(rope, (7, 9)))
    assert rope((7, 9)) is first  # the same size: kept
    other = rope((5, 12))  # another size: its own tables
    assert other.shape == (2, 60, first.shape[-1]) and torch.equal(other, _expected(rope, (5, 12)))
    assert rope((7, 9)) is first  # both kept (maxsize 2)
    rope((4, 4))  # (5, 12), the least recently used, goes out
    assert rope((7, 9)) is first and rope((5, 12)) is not other


def test_rope_tables_follow_the_buffer_and_stay_out_of_the_state_dict():
    rope = RotaryEmbedding(64, 2)
    before = rope((6, 6))
    state = rope.state_dict()
    assert list(state) == ['angle']
    rope.load_state_dict({'angle': state['angle'] * 2})  # in place: the buffer's version changes
    after = rope((6, 6))
    assert after is not before and torch.equal(after, _expected(rope, (6, 6)))
    rope.double()  # another dtype (a new buffer)
    assert rope((6, 6)).dtype == torch.float64


def test_inference_mode_tables_are_kept_apart():
    """A table made under torch.inference_mode cannot be saved for a later backward."""
    rope = RotaryEmbedding(64, 2)
    with torch.inference_mode():
        rope((5, 5))
    x = torch.randn(2, 25, rope((5, 5)).shape[-1], requires_grad=True)
    (x * rope((5, 5))[0]).sum().backward()  # would fail with the inference-mode table
    assert x.grad is not None


def test_size_cache_copies_start_empty():
    cache = SizeCache(maxsize=3)
    cache.get('a', lambda: torch.ones(2))
    assert len(copy.deepcopy(cache).entries) == 0
    restored = pickle.loads(pickle.dumps(cache))
    assert restored.maxsize == 3 and len(restored.entries) == 0
    assert len(cache.entries) == 1


def test_parameter_cache_reuses_until_a_parameter_changes():
    """Without autograd the tensor made from parameters is reused for the same key until one of them is
    updated in place; with autograd (or disabled) it is made every time and nothing is kept; tensors made in
    inference mode are kept apart; copies start empty."""
    cache, weight = ParameterCache(), torch.nn.Parameter(torch.ones(3))
    calls = []

    def make():
        calls.append(1)
        return weight * 2

    with torch.no_grad():
        first = cache.get([weight], 'a', make)
        assert cache.get([weight], 'a', make) is first and len(calls) == 1
        assert cache.get([weight], 'b', make) is not first and len(calls) == 2
        weight.add_(1)  # an optimizer step, load_state_dict
        assert torch.equal(cache.get([weight], 'b', make), torch.full((3, ), 4.0)) and len(calls) == 3
        cache.get([weight], 'b', make, enabled=False)
        assert cache.value is None and len(calls) == 4
    with torch.inference_mode():
        cache.get([weight], 'b', make)
    with torch.no_grad():
        cache.get([weight], 'b', make)
    assert len(calls) == 6
    made = cache.get([weight], 'b', make)
    assert made.requires_grad and cache.value is None and len(calls) == 7
    with torch.no_grad():
        cache.get([weight], 'b', make)
    assert copy.deepcopy(cache).value is None and pickle.loads(pickle.dumps(cache)).value is None
    assert cache.value is not None


def _residual_runs(fn, x, branch, gamma, seed=0):
    """fn's output and the gradients of x, the branch and gamma (None where it has none), with the random numbers
    of ``seed``."""
    leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in (x, branch, gamma)]
    torch.manual_seed(seed)
    out = fn(*leaves)
    out.backward(torch.linspace(-1, 1, out.numel()).view(out.shape).to(out.dtype))
    return [out.detach()] + [t.grad if t is not None else None for t in leaves]


@pytest.mark.parametrize('branch_dtype', [torch.float32, torch.bfloat16])
@pytest.mark.parametrize('training', [True, False], ids=['train', 'eval'])
def test_add_branch_multiplies_the_branch_once_by_the_layer_scale_and_the_drop_path_factors(branch_dtype, training):
    """``x + drop_path(gamma * branch)`` (PolaFormer++'s layer-scaled branches; a float32 stream, a float32 layer
    scale, the branch in float32 or bfloat16 as under autocast): the same result and gradients as timm's DropPath
    after the library's product, from the same random numbers; in training one product of the branch (by the
    product of the two small factors) where the modules make two, in the forward and in the backward."""
    from timm.layers import DropPath

    from mmpola.models.layers import add_branch
    from tests.fixtures.ops import DispatchedOps
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 8, 5, 6, generator=gen)
    branch = torch.randn(4, 8, 5, 6, generator=gen).to(branch_dtype)
    gamma = torch.rand(1, 8, 1, 1, generator=gen) + 0.5
    drop = DropPath(0.5).train(training)
    actual = _residual_runs(lambda x, b, g: add_branch(x, b, drop, g), x, branch, gamma)
    expected = _residual_runs(lambda x, b, g: x + drop(g * b), x, branch, gamma)
    for name, a, e in zip(('out', 'dx', 'dbranch', 'dgamma'), actual, expected):
        assert a.dtype == e.dtype and torch.allclose(a.double(), e.double(), rtol=1e-6, atol=1e-6), name
    if training:  # some images dropped, some kept
        dropped = (expected[0] == x).flatten(1).all(1)
        assert 0 < int(dropped.sum()) < 4
    counts = []
    for fn in (lambda x, b, g: add_branch(x, b, drop, g), lambda x, b, g: x + drop(g * b)):
        leaves = [t.detach().clone().requires_grad_() for t in (x, branch, gamma)]
        with DispatchedOps() as forward:
            out = fn(*leaves)
        with DispatchedOps() as backward:
            out.backward(torch.ones_like(out))
        counts.append([len(ops.kernels(x.numel())) for ops in (forward, backward)])
    assert [a + training for a in counts[0]] == counts[1], counts


def test_add_branch_without_a_layer_scale_is_timms_drop_path_and_calls_hooked_modules():
    """Without a layer scale the branch times the factors per sample is timm's DropPath's product, bit for bit, in
    either dtype; a drop path with hooks is called as it is."""
    from timm.layers import DropPath

    from mmpola.models.layers import add_branch
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 10, 16, generator=gen)
    drop = DropPath(0.5).train()
    for dtype in (torch.bfloat16, torch.float32):
        branch = torch.randn(4, 10, 16, generator=gen).to(dtype)
        actual = _residual_runs(lambda x, b, g: add_branch(x, b, drop), x, branch, None)
        expected = _residual_runs(lambda x, b, g: x + drop(b), x, branch, None)
        for name, a, e in zip(('out', 'dx', 'dbranch'), actual, expected):
            assert a.dtype == e.dtype and torch.equal(a, e), (dtype, name)
    seen = []
    drop.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    out = add_branch(x, branch, drop, torch.ones(16))
    assert seen == [branch.shape] and out.shape == x.shape
