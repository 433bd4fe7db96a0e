"""Tensors computed from the map size and no trainable parameter are kept for the next call at the
same size (mmpola.models.layers.SizeCache): PolaFormer++'s RoPE tables."""
import copy
import pickle

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
