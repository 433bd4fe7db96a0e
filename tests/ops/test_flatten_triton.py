"""The 'triton' implementation of the FLatten op (mmpola.ops.flatten_triton) against the reference:
output and every gradient, odd token grids, head dims 8..128, strided inputs, low precision, and
where 'auto' picks it. Without a GPU the kernels run through Triton's interpreter (tests/conftest.py)."""
import pytest
import torch

from mmpola.ops import OPS, flatten_attention, flatten_attention_reference, flatten_attention_triton
from mmpola.ops.dispatch import AttnImplUnavailable
from tests.fixtures.ops import A100, H100, DispatchedOps, kernels_compiled

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'
NAMES = ['out', 'q', 'k', 'v', 'scale']

# (B, (H, W) of the queries, (H, W) of the keys, heads, head dim): n != N is PVT's spatial reduction
CASES = [(1, (7, 9), (7, 9), 1, 16), (2, (13, 11), (4, 3), 2, 32), (2, (21, 37), (21, 37), 1, 64),
         (1, (13, 11), (13, 11), 3, 16), (2, (7, 9), (3, 5), 4, 8), (1, (3, 5), (3, 5), 2, 128)]


def make_inputs(B, hw, hw_k, heads, head_dim, seed=0):
    g = torch.Generator().manual_seed(seed)
    N, n, C = hw[0] * hw[1], hw_k[0] * hw_k[1], heads * head_dim
    q, k, v = torch.randn(B, N, C, generator=g), torch.randn(B, n, C, generator=g), torch.randn(B, n, C, generator=g)
    scale = torch.randn(1, 1, C, generator=g) * 0.3
    return [q, k, v, scale], torch.randn(B, N, C, generator=g)


def forward_backward(fn, inputs, grad_out, *options, dtype=None, device=DEVICE):
    leaves = [t.to(device, dtype).detach().requires_grad_() for t in inputs]
    out = fn(*leaves, *options)
    out.backward(grad_out.to(device, out.dtype))
    return [out.detach()] + [t.grad for t in leaves]


def scaled_error(actual, expected):
    """max |actual - expected| / max |expected|, on the CPU in float64."""
    actual, expected = actual.detach().cpu().double(), expected.detach().cpu().double()
    return ((actual - expected).abs().max() / expected.abs().max()).item()


def case_id(c):
    return f'B{c[0]}-{c[1][0]}x{c[1][1]}-n{c[2][0]}x{c[2][1]}-h{c[3]}-d{c[4]}'


@pytest.mark.parametrize('case', CASES, ids=case_id)
def test_triton_matches_float64_reference(case):
    """fp32 kernels within 1e-5 (relative to the largest value) of the float64 reference, output and
    every gradient; multi-chunk reductions at 21x37 (777 tokens)."""
    inputs, grad_out = make_inputs(*case)
    heads = case[3]
    actual = forward_backward(flatten_attention_triton, inputs, grad_out, heads)
    truth = forward_backward(flatten_attention_reference, inputs, grad_out, heads, dtype=torch.float64, device='cpu')
    for name, a, t in zip(NAMES, actual, truth):
        assert a.dtype == torch.float32 and a.shape == t.shape, name
        assert scaled_error(a, t) <= 1e-5, name


def test_one_key_token():
    """With one key the output is v but for eps: the gradients of q, k and scale are differences of
    O(1) terms cancelling to O(eps), so fp32 (the reference's too) is ~1e-4 off relative to their own
    size; they are compared on the scale max(|reference|, 1) (as tests/ops/test_dispatch.py)."""
    inputs, grad_out = make_inputs(2, (1, 1), (1, 1), 2, 16)
    actual = forward_backward(flatten_attention_triton, inputs, grad_out, 2)
    truth = forward_backward(flatten_attention_reference, inputs, grad_out, 2, dtype=torch.float64, device='cpu')
    for name, a, t in zip(NAMES, actual, truth):
        t = t.double()
        assert ((a.cpu().double() - t).abs().max() / t.abs().max().clamp_min(1.0)).item() <= 1e-5, name


@pytest.mark.parametrize('focusing_factor', [1, 2.5])
def test_other_focusing_factors(focusing_factor):
    inputs, grad_out = make_inputs(2, (5, 7), (5, 7), 2, 16, seed=3)
    actual = forward_backward(flatten_attention_triton, inputs, grad_out, 2, focusing_factor)
    truth = forward_backward(flatten_attention_reference, inputs, grad_out, 2, focusing_factor,
                             dtype=torch.float64, device='cpu')
    for name, a, t in zip(NAMES, actual, truth):
        assert scaled_error(a, t) <= 1e-5, name


def test_strided_views_of_a_projection():
    """q, k, v as column slices of one (B, N, 3C) projection and a non-contiguous output gradient give
    what contiguous copies give (the kernels read through the strides)."""
    B, N, heads, d = 2, 7 * 9, 2, 16
    C = heads * d
    g = torch.Generator().manual_seed(5)
    qkv = torch.randn(B, N, 3 * C, generator=g).to(DEVICE).requires_grad_()
    scale = (torch.randn(1, 1, C, generator=g) * 0.3).to(DEVICE).requires_grad_()
    grad_out = torch.randn(B, C, N, generator=g).to(DEVICE).transpose(1, 2)  # strided
    q, k, v = qkv.split(C, dim=-1)
    out = flatten_attention_triton(q, k, v, scale, heads)
    out.backward(grad_out)
    dense = [t.detach().clone().contiguous().requires_grad_() for t in (q, k, v, scale)]
    expected = flatten_attention_triton(*dense, heads)
    expected.backward(grad_out.contiguous())
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    torch.testing.assert_close(qkv.grad, torch.cat([t.grad for t in dense[:3]], dim=-1), rtol=0, atol=0)
    torch.testing.assert_close(scale.grad, dense[3].grad, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize('dtype,tol', [(torch.float16, 1e-2), (torch.bfloat16, 3e-2)])
def test_half_precision_inputs(dtype, tol):
    """fp16 / bf16 tensors go into the kernels uncast (loaded, computed in float32); the output and
    gradients come back in their dtype, within 1e-2 (fp16) / 3e-2 (bf16) of the fp32 reference on
    the same rounded inputs; also through the public function's fp32 island under autocast."""
    inputs, grad_out = make_inputs(2, (13, 11), (13, 11), 2, 32, seed=2)
    low = [t.to(dtype) for t in inputs[:3]] + [inputs[3]]
    actual = forward_backward(flatten_attention_triton, low, grad_out, 2)
    expected = forward_backward(flatten_attention_reference, [t.float() for t in low], grad_out, 2,
                                dtype=torch.float32, device='cpu')
    for name, a, e, t in zip(NAMES, actual, expected, [low[0]] + low):
        assert a.dtype == (t.dtype if name != 'out' else dtype), name
        assert scaled_error(a, e) <= tol, name
    with torch.autocast(device_type=DEVICE, dtype=dtype, enabled=DEVICE == 'cuda' or dtype == torch.bfloat16):
        out = flatten_attention(*[t.to(DEVICE) for t in low], 2, impl='triton')
    assert out.dtype == dtype and scaled_error(out, expected[0]) <= tol


@pytest.mark.parametrize('case', [CASES[1], CASES[2], CASES[3]], ids=case_id)
def test_a_key_bias_is_added_where_the_keys_are_read(case):
    """key_bias (1, n, C), as the models pass their key positional encoding, and a per-sample one: output and
    gradients (the bias's summed over the batch it is shared by) as the float64 reference on k + bias; one
    head and several (their token statistics couple the heads), several key chunks at 21x37."""
    inputs, grad_out = make_inputs(*case)
    B, heads, n, C = case[0], case[3], inputs[1].shape[1], inputs[1].shape[2]
    g = torch.Generator().manual_seed(5)

    def with_bias(q, k, v, scale, key_bias):
        return flatten_attention_triton(q, k, v, scale, heads, key_bias=key_bias)

    def keys_plus_bias(q, k, v, scale, key_bias):
        return flatten_attention_reference(q, k + key_bias, v, scale, heads)

    for shape in ((1, n, C), (B, n, C)):
        bias = torch.randn(*shape, generator=g) * 0.5
        actual = forward_backward(with_bias, inputs + [bias], grad_out)
        truth = forward_backward(keys_plus_bias, inputs + [bias], grad_out, dtype=torch.float64, device='cpu')
        assert actual[-1].shape == shape
        for name, a, t in zip(NAMES + ['key_bias'], actual, truth):
            assert scaled_error(a, t) <= 1e-5, f'{shape} {name}: {scaled_error(a, t):.2e}'


def test_a_key_bias_is_no_tensor_of_its_own():
    """Launched as on an H100 (a dry run), with the bias of a (1, n, C) encoding: the forward runs the torch
    kernels it runs without one (no k + bias tensor is made or kept), the backward one sum more (the bias's
    gradient, over the batch); the key launches get the bias, the query ones do not."""
    from mmpola.ops.triton_support import dry_run

    inputs, grad_out = make_inputs(2, (7, 9), (7, 9), 2, 16)
    inputs = [t.to(DEVICE).requires_grad_() for t in inputs]
    encoding = torch.randn(1, 7 * 9, 32).to(DEVICE).requires_grad_()
    with dry_run(H100) as launches:
        with DispatchedOps() as plain:
            plain_out = flatten_attention_triton(*inputs, 2)
        with DispatchedOps() as without:
            torch.autograd.grad(plain_out, inputs, grad_out.to(DEVICE))
        plain_launches = len(launches)
        with DispatchedOps() as forward:
            out = flatten_attention_triton(*inputs, 2, key_bias=encoding)
        with DispatchedOps() as backward:
            torch.autograd.grad(out, [*inputs, encoding], grad_out.to(DEVICE))
    assert forward.kernels() == plain.kernels(), (forward.names, plain.names)
    assert backward.kernels() == without.kernels() + ['sum'], (backward.names, without.names)
    biased = [launch.kwargs.get('BIAS') for launch in launches[plain_launches:]]
    assert len(biased) == plain_launches and biased.count(True) == 4, biased


def test_one_head_key_backward_in_float32_at_head_dim_128_fits_an_a100():
    """Launched as on an A100 (a dry run): one head's key backward (dv, dk and G in one program) at head dim 128 in
    float32 is tuned over, and defaults to, 16-token blocks (32-token ones need 177 KiB of shared memory, more than
    the 163 KiB an A100 gives a block: ``make check-kernels`` compiles them); in half precision and with several
    heads it is tuned over 32-token blocks too. The backward kernels' defaults at 128 take 16-token blocks."""
    from mmpola.ops.triton_support import dry_run, tuned_configs

    for heads, dtype, longest in [(1, torch.float32, 16), (1, torch.bfloat16, 32), (2, torch.float32, 32)]:
        inputs, grad_out = make_inputs(1, (9, 10), (9, 10), heads, 128)
        leaves = [t.to(dtype).requires_grad_() for t in inputs[:3]] + [inputs[3].requires_grad_()]
        with dry_run(A100) as launches:
            flatten_attention_triton(*leaves, heads).backward(grad_out.to(dtype))
        keys = [launch for launch in launches if launch.kernel.fn.__name__ == '_key_backward_kernel']
        assert len(keys) == (1 if heads == 1 else 2)
        for launch in keys:
            blocks = {config.kwargs['BLOCK_T'] for config in tuned_configs(launch.kernel, launch.args, launch.kwargs)}
            assert max(blocks) == longest, (heads, dtype, blocks)
            assert launch.default['BLOCK_T'] == 16, (heads, dtype, launch.default)


def test_inference_without_grad():
    inputs, _ = make_inputs(1, (7, 9), (7, 9), 2, 16, seed=4)
    with torch.no_grad():
        out = flatten_attention_triton(*[t.to(DEVICE) for t in inputs], 2)
    expected = flatten_attention_reference(*[t.double() for t in inputs], 2)
    assert scaled_error(out, expected) <= 1e-5


def test_auto_picks_triton_on_cuda_and_fast_on_the_cpu():
    assert OPS['flatten'].preferred['cuda'][0] == 'triton'
    assert OPS['flatten'].choose('auto', torch.device('cpu'), torch.float32) == 'fast'
    assert OPS['flatten'].records['triton'].fp32_inside


def test_triton_on_cpu_tensors_without_the_interpreter_is_one_clear_error(monkeypatch):
    kernels_compiled(monkeypatch)
    inputs, _ = make_inputs(1, (3, 3), (3, 3), 1, 16)
    with pytest.raises(AttnImplUnavailable, match=r"attn_impl='triton' \(flatten_attention\) cannot run here: .*CUDA"):
        flatten_attention(*inputs, 1, impl='triton')
    with pytest.raises(AttnImplUnavailable, match='cannot run here'):
        flatten_attention_triton(*inputs, 1)


@pytest.mark.parametrize('index', range(6))
def test_every_tuned_config_matches_the_reference(index):
    """Each config the GPU kernels are tuned over (token block, warps), forced in turn, with two heads and
    with one (its fused backward); at head dim 128 the chunks of 32 tokens are shorter than a 64 block,
    which stops at its chunk's end: the result agrees with the reference."""
    from mmpola.ops.flatten_triton import _TUNED
    from mmpola.ops.triton_support import fixed_config
    assert len(_TUNED) == 6
    for case in [(1, (9, 10), (5, 5), 2, 16), (1, (9, 10), (9, 10), 1, 128)]:
        inputs, grad_out = make_inputs(*case)
        with fixed_config(index):
            actual = forward_backward(flatten_attention_triton, inputs, grad_out, case[3])
        truth = forward_backward(flatten_attention_reference, inputs, grad_out, case[3], dtype=torch.float64,
                                 device='cpu')
        for name, a, t in zip(NAMES, actual, truth):
            assert scaled_error(a, t) <= 1e-5, (case, name)
