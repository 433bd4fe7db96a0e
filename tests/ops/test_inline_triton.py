"""InLine attention core in Triton ('triton'): output and every gradient against the float64 reference,
odd token grids, strided views, half precision, and where 'auto' picks it. Without a GPU the kernels
run through Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1)."""
import pytest
import torch

from mmpola.ops import OPS, inline_attention, inline_attention_reference, inline_attention_triton
from mmpola.ops.dispatch import AttnImplUnavailable
from tests.fixtures.ops import forward_backward, kernels_compiled, relative_error

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'


def make_inputs(B, N, n, C, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    tensors = [torch.randn(B, rows, C, generator=g) for rows in (N, n, n, N)]  # q, k, v, dL/dout
    return [t.to(device=DEVICE, dtype=dtype) for t in tensors]


def assert_matches(actual, expected, tol, what=''):
    for name, a, e in zip(('out', 'dq', 'dk', 'dv'), actual, expected):
        assert a.shape == e.shape, name
        err = relative_error(a, e)
        assert err <= tol, f'{what} {name}: relative error {err:.2e} > {tol}'


# (B, H, W, head_dim, heads): odd grids (masked tails, several chunks at 21x37), head dims 16 to 128
CASES = [(1, 7, 9, 16, 1), (2, 7, 9, 32, 2), (2, 13, 11, 64, 1), (1, 13, 11, 16, 3), (1, 21, 37, 64, 1),
         (2, 21, 37, 32, 2), (1, 5, 7, 128, 1), (2, 3, 5, 8, 3)]


@pytest.mark.parametrize('case', CASES, ids=lambda c: 'B{}-{}x{}-d{}-h{}'.format(*c))
def test_triton_matches_float64_reference(case):
    """fp32 kernels within 1e-5 (relative to the largest value) of the float64 reference."""
    B, H, W, d, h = case
    q, k, v, g = make_inputs(B, H * W, H * W, d * h)
    actual = forward_backward(inline_attention_triton, [q, k, v], g, h)
    expected = forward_backward(inline_attention_reference, [q.double(), k.double(), v.double()], g.double(), h)
    assert all(a.dtype == torch.float32 for a in actual)
    assert_matches(actual, expected, 1e-5, str(case))


def test_fewer_keys_than_queries():
    q, k, v, g = make_inputs(2, 37, 9, 48)
    actual = forward_backward(inline_attention_triton, [q, k, v], g, 3)
    expected = forward_backward(inline_attention_reference, [q.double(), k.double(), v.double()], g.double(), 3)
    assert_matches(actual, expected, 1e-5)


def test_strided_views_are_read_in_place():
    """q, k, v as column slices of one fused (B, N, 3C) projection and a non-contiguous dL/dout: the
    kernels read them through their strides; results equal those of contiguous copies."""
    B, N, C, h = 2, 13 * 11, 64, 2
    qkv, _, _, _ = make_inputs(B, N, N, 3 * C, seed=1)
    q, k, v = qkv.split(C, dim=-1)
    assert not q.is_contiguous()
    g = make_inputs(B, C, C, N, seed=2)[0].transpose(1, 2)  # (B, N, C), not contiguous
    strided = forward_backward(inline_attention_triton, [q, k, v], g, h)
    contiguous = forward_backward(inline_attention_triton, [q.contiguous(), k.contiguous(), v.contiguous()],
                                  g.contiguous(), h)
    for a, e in zip(strided, contiguous):
        torch.testing.assert_close(a, e, rtol=1e-6, atol=1e-6)
    leaf = qkv.detach().clone().requires_grad_()
    inline_attention_triton(*leaf.split(C, dim=-1), h).backward(g)  # gradients flow back into the fused tensor
    torch.testing.assert_close(leaf.grad, torch.cat(strided[1:], dim=-1), rtol=1e-6, atol=1e-6)


def test_deterministic():
    q, k, v, g = make_inputs(1, 21 * 37, 21 * 37, 32)
    first = forward_backward(inline_attention_triton, [q, k, v], g, 1)
    second = forward_backward(inline_attention_triton, [q, k, v], g, 1)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


@pytest.mark.parametrize('dtype,tol', [(torch.float16, 1e-2), (torch.bfloat16, 3e-2)])
def test_half_precision_inputs(dtype, tol):
    """fp16 / bf16 tensors are loaded as they are and computed in float32; outputs and gradients come
    back in the inputs' dtype, within the half-precision rounding of the fp32 reference on the same values."""
    q, k, v, g = make_inputs(2, 13 * 11, 13 * 11, 64, dtype=dtype)
    actual = forward_backward(inline_attention_triton, [q, k, v], g, 2)
    assert all(a.dtype == dtype for a in actual)
    expected = forward_backward(inline_attention_reference, [q.float(), k.float(), v.float()], g.float(), 2)
    assert_matches(actual, expected, tol, str(dtype))


def test_fp32_island_passes_half_tensors_uncast():
    q, k, v, _ = make_inputs(1, 7 * 9, 7 * 9, 32, dtype=torch.bfloat16)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        out = inline_attention(q, k, v, 2, impl='triton')
    assert out.dtype == torch.bfloat16
    expected = inline_attention_reference(q.float(), k.float(), v.float(), 2)
    assert relative_error(out, expected) <= 3e-2


def test_auto_picks_triton_on_cuda_and_fast_on_cpu():
    assert OPS['inline'].preferred['cuda'][0] == 'triton'
    assert OPS['inline'].choose('auto', torch.device('cpu'), torch.float32) == 'fast'
    assert OPS['inline'].records['triton'].fp32_inside
    if torch.cuda.is_available():
        assert OPS['inline'].choose('auto', torch.device('cuda'), torch.float32) == 'triton'


def test_cpu_tensors_without_the_interpreter_are_a_clear_error(monkeypatch):
    kernels_compiled(monkeypatch)
    q = torch.randn(1, 6, 16)
    with pytest.raises(AttnImplUnavailable, match=r"attn_impl='triton'.*run on CUDA tensors.*'fast'"):
        inline_attention(q, q, q, 2, impl='triton')
    with pytest.raises(AttnImplUnavailable, match=r"run on CUDA tensors"):
        inline_attention_triton(q, q, q, 2)


@pytest.mark.parametrize('index', range(6))
def test_every_tuned_config_matches_the_reference(index):
    """Each config the GPU kernels are tuned over (rows a block, warps), forced in turn: the chunks do not
    depend on the config (a block stops at its chunk's end), the result agrees with the reference."""
    from mmpola.ops.inline_triton import _TUNED
    from mmpola.ops.triton_support import fixed_config
    assert len(_TUNED) == 6
    q, k, v, g = make_inputs(1, 100, 100, 32)  # two heads of 16: two chunks of 64 rows, the second cut at 100
    with fixed_config(index):
        actual = forward_backward(inline_attention_triton, [q, k, v], g, 2)
    expected = forward_backward(inline_attention_reference, [q.double(), k.double(), v.double()], g.double(), 2)
    assert_matches(actual, expected, 1e-5, f'config {index}')
