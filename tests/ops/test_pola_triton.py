"""Pola attention core in Triton ('triton'): output and the gradients of q, k, v, power and scale against
the float64 reference, odd token grids, spatially reduced keys, strided views, broadcast parameters, half
precision, and where 'auto' picks it. Without a GPU the kernels run through Triton's interpreter
(tests/conftest.py sets TRITON_INTERPRET=1)."""
import pytest
import torch

from mmpola.ops import OPS, pola_attention, pola_attention_reference, pola_attention_triton
from mmpola.ops.dispatch import AttnImplUnavailable
from tests.fixtures.ops import (
    A100,
    B200,
    H100,
    RTX_4090,
    RTX_5090,
    DispatchedOps,
    forward_backward,
    kernels_compiled,
    relative_error,
)

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'
NAMES = ('out', 'grad_q', 'grad_k', 'grad_v', 'grad_power', 'grad_scale')


def make_inputs(B, h, N, n, d, dtype=torch.float32, seed=0, zeros=False):
    """q, k, v, power, scale (near the trained regime: p around 3, s around ln 2) and dL/dout. ``zeros``
    puts exact zeros into q and k (where the feature map and its gradients meet x = 0)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, h, rows, d, generator=g) for rows in (N, n, n))
    power = torch.randn(1, h, 1, d, generator=g) * 0.5
    scale = torch.randn(1, h, 1, d, generator=g) * 0.3
    grad_out = torch.randn(B, h, N, d, generator=g)
    if zeros:
        q[..., ::3, 1::4] = 0
        k[..., 1::2, ::3] = 0
    return [t.to(device=DEVICE, dtype=dtype) for t in (q, k, v, power, scale)], grad_out.to(DEVICE, dtype)


def assert_matches(actual, expected, tol, what=''):
    for name, a, e in zip(NAMES, actual, expected):
        assert a.shape == e.shape, name
        assert torch.isfinite(a).all(), f'{what} {name}: not finite'
        err = relative_error(a, e)
        assert err <= tol, f'{what} {name}: relative error {err:.2e} > {tol}'


def float64_reference(inputs, grad_out, **kwargs):
    return forward_backward(pola_attention_reference, [t.double() for t in inputs], grad_out.double(), **kwargs)


# (B, h, (H, W) query grid, (H', W') key grid, d): odd grids (masked tails; several chunks at 21x37),
# spatially reduced keys (PVT's sr_ratio), head dims 16 to 128 and the unit tests' 8
CASES = [(1, 1, (7, 9), (7, 9), 16), (2, 2, (7, 9), (7, 9), 32), (2, 1, (13, 11), (13, 11), 64),
         (1, 3, (13, 11), (4, 3), 16), (1, 1, (21, 37), (21, 37), 64), (2, 2, (21, 37), (5, 9), 32),
         (1, 1, (5, 7), (5, 7), 128), (2, 3, (3, 5), (3, 5), 8)]


@pytest.mark.parametrize('case', CASES, ids=lambda c: 'B{}-h{}-{}x{}-kv{}x{}-d{}'.format(*c[:2], *c[2], *c[3], c[4]))
def test_triton_matches_float64_reference(case):
    """fp32 kernels within 1e-5 (relative to the largest value) of the float64 reference: output and
    the gradients of q, k, v, power and scale."""
    B, h, (H, W), (Hk, Wk), d = case
    inputs, grad_out = make_inputs(B, h, H * W, Hk * Wk, d)
    actual = forward_backward(pola_attention_triton, inputs, grad_out)
    assert all(a.dtype == torch.float32 for a in actual)
    assert_matches(actual, float64_reference(inputs, grad_out), 1e-5, str(case))


@pytest.mark.parametrize('join', [False, True], ids=['square', 'joined'])
@pytest.mark.parametrize('case', [CASES[1], CASES[4], CASES[7]], ids=['d32', 'd64-chunks', 'd8'])
def test_both_forms_of_the_weight_gradient_product(case, join, monkeypatch):
    """The query backward's dL/dW+- as two square products or as one joined product (which one a GPU runs
    depends on its compute capability and the head dim; the interpreter runs the joined one)."""
    from mmpola.ops import pola_triton
    monkeypatch.setattr(pola_triton, '_join_weight_grads', lambda bd, device: join)
    B, h, (H, W), (Hk, Wk), d = case
    inputs, grad_out = make_inputs(B, h, H * W, Hk * Wk, d)
    actual = forward_backward(pola_attention_triton, inputs, grad_out)
    assert_matches(actual, float64_reference(inputs, grad_out), 1e-5, str(case))


@pytest.mark.parametrize('d, joined_on', [
    (32, {'A100', 'H100', 'B200', 'RTX 4090', 'RTX 5090'}), (64, {'A100', 'RTX 4090', 'RTX 5090'}), (128, set())])
def test_the_query_backward_joins_its_weight_gradient_products_where_the_gpus_products_are_one_warps(d, joined_on):
    """The launch code's JOIN, recorded in a dry run for each GPU: joined at head dims up to 32, and at 64 where the
    tensor-core products are one warp's each (compute capability 8.x and 12.x, the RTX 50xx among them), not where
    they are a warpgroup's (sm_90) or in tensor memory (sm_100)."""
    from mmpola.ops.triton_support import dry_run
    targets = {'A100': A100, 'H100': H100, 'B200': B200, 'RTX 4090': RTX_4090, 'RTX 5090': RTX_5090}
    joined = set()
    for name, target in targets.items():
        if d > 64 and target.shared_memory < 227 * 1024:
            continue  # turned down there (half inputs run up to head dim 64)
        inputs, grad_out = make_inputs(1, 1, 20, 20, d, dtype=torch.bfloat16)
        inputs = [t.cpu().requires_grad_() for t in inputs]
        with dry_run(target) as launches:
            out = pola_attention_triton(*inputs)
            del launches[:]
            torch.autograd.grad(out, inputs, grad_out.cpu())
        (join, ), = {launch.kwargs['JOIN'] for launch in launches if 'JOIN' in launch.kwargs},
        if join:
            joined.add(name)
    assert joined == joined_on


def test_zeros_in_queries_and_keys_give_finite_exact_gradients():
    """x = 0 exactly: features 0, gradients 0 there (no 0/0, no 0 * log 0), the rest as the reference."""
    inputs, grad_out = make_inputs(2, 2, 40, 40, 16, zeros=True)
    actual = forward_backward(pola_attention_triton, inputs, grad_out)
    assert_matches(actual, float64_reference(inputs, grad_out), 1e-5)
    q = inputs[0]
    assert (actual[1][q == 0] == 0).all()


def test_alpha_and_eps_options():
    inputs, grad_out = make_inputs(1, 2, 30, 12, 16)
    actual = forward_backward(pola_attention_triton, inputs, grad_out, alpha=2.0, eps=1e-3)
    assert_matches(actual, float64_reference(inputs, grad_out, alpha=2.0, eps=1e-3), 1e-5)


# (power shape, scale shape); a scale shared by channels of one exponent would leave the output invariant
# (its gradient only the eps term), so every case keeps the exponent or the scale per channel
# (the kernels read a parameter shared by the batch with batch stride 0, and sum its gradient over the batch
# themselves; a per-sample parameter keeps its batch)
@pytest.mark.parametrize('shapes', [((1, 1, 1, 16), (1, 3, 1, 16)), ((1, 3, 1, 1), (1, 1, 1, 16)), ((16, ), (1, )),
                                    ((2, 3, 1, 16), (1, 3, 1, 16)), ((2, 1, 1, 16), (2, 3, 1, 16))],
                         ids=['shared-by-heads', 'per-head-power', 'vector-power-scalar-scale', 'per-sample-power',
                              'per-sample-both'])
def test_broadcast_parameters_get_gradients_of_their_shape(shapes):
    (q, k, v, _, _), grad_out = make_inputs(2, 3, 20, 9, 16)
    g = torch.Generator().manual_seed(1)
    power, scale = (torch.randn(shape, generator=g).to(DEVICE) * 0.3 for shape in shapes)
    inputs = [q, k, v, power, scale]
    actual = forward_backward(pola_attention_triton, inputs, grad_out)
    assert actual[4].shape == power.shape and actual[5].shape == scale.shape
    assert_matches(actual, float64_reference(inputs, grad_out), 1e-5)


def test_extreme_parameters_match_the_reference():
    """The kernels compute s = softplus(scale) and p = 1 + alpha * sigmoid(power) and their derivatives
    themselves: far from 0 (softplus near 0 and near the identity, sigmoid saturated) they agree with
    torch's in float64 as near it."""
    (q, k, v, _, _), grad_out = make_inputs(2, 2, 30, 12, 16)
    # channels of a tiny s get p near 1 (x = t / s is large: x^5 would pass float32's range)
    order = torch.randperm(32, generator=torch.Generator().manual_seed(2))
    scale = torch.linspace(-10, 10, 32)[order].reshape(1, 2, 1, 16)
    power = torch.linspace(-20, 20, 32)[order].reshape(1, 2, 1, 16)
    inputs = [q, k, v, power.to(DEVICE), scale.to(DEVICE)]
    assert_matches(forward_backward(pola_attention_triton, inputs, grad_out), float64_reference(inputs, grad_out),
                   1e-5)


def test_parameters_varying_along_tokens_are_a_clear_error():
    (q, k, v, power, scale), _ = make_inputs(1, 1, 6, 6, 8)
    with pytest.raises(ValueError, match=r"constant along the tokens.*impl='fast'"):
        pola_attention_triton(q, k, v, power.expand(1, 1, 6, 8), scale)


def test_strided_views_are_read_in_place():
    """q, k, v as head-split column slices of one fused (B, N, 3C) projection (as in the models) and a
    non-contiguous dL/dout: the kernels read them through their strides, with the results of
    contiguous copies, and the gradients flow back into the fused tensor."""
    B, N, h, d = 2, 13 * 11, 2, 32
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(B, N, 3, h, d, generator=g).to(DEVICE)
    grad_out = torch.randn(B, N, h, d, generator=g).to(DEVICE).transpose(1, 2)  # (B, h, N, d) view
    power, scale = (torch.randn(1, h, 1, d, generator=g).to(DEVICE) * 0.3 for _ in range(2))
    leaf = qkv.clone().requires_grad_()
    q, k, v = leaf.permute(2, 0, 3, 1, 4).unbind(0)
    assert not q.is_contiguous() and not grad_out.is_contiguous()
    out = pola_attention_triton(q, k, v, power, scale)
    out.backward(grad_out)
    copies = [t.detach().contiguous() for t in qkv.permute(2, 0, 3, 1, 4).unbind(0)] + [power, scale]
    expected = forward_backward(pola_attention_triton, copies, grad_out.contiguous())
    torch.testing.assert_close(out, expected[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(leaf.grad, torch.stack(expected[1:4], 0).permute(1, 3, 0, 2, 4), rtol=1e-6,
                               atol=1e-6)


def _with_key_bias(fn):
    def attention(q, k, v, power, scale, key_bias):
        return fn(q, k, v, power, scale, key_bias=key_bias)
    return attention


def _keys_plus_bias(q, k, v, power, scale, key_bias):
    return pola_attention_reference(q, k + key_bias, v, power, scale)


@pytest.mark.parametrize('case', [CASES[1], CASES[3], CASES[5]], ids=['d32', 'reduced', 'reduced-chunks'])
def test_a_key_bias_is_added_where_the_keys_are_read(case):
    """key_bias (1, h, n, d), as the models pass their key positional encoding, and a per-sample one: output
    and gradients (the bias's summed over the batch it is shared by) as the float64 reference on k + bias."""
    B, h, (H, W), (Hk, Wk), d = case
    inputs, grad_out = make_inputs(B, h, H * W, Hk * Wk, d)
    g = torch.Generator().manual_seed(5)
    for shape in ((1, h, Hk * Wk, d), (B, h, Hk * Wk, d)):
        bias = torch.randn(*shape, generator=g).to(DEVICE) * 0.5
        actual = forward_backward(_with_key_bias(pola_attention_triton), inputs + [bias], grad_out)
        expected = forward_backward(_keys_plus_bias, [t.double() for t in inputs + [bias]], grad_out.double())
        assert actual[-1].shape == shape
        for name, a, e in zip(NAMES + ('grad_key_bias', ), actual, expected):
            assert relative_error(a, e) <= 1e-5, f'{shape} {name}: relative error {relative_error(a, e):.2e}'


# (bf16: Triton's interpreter rounds a sum that lies halfway between two bf16 numbers, common for the sum of
# two of them, not always to the even one; its keys then differ from torch's by one unit in the last place)
@pytest.mark.parametrize('dtype,tol', [(torch.float16, 1e-3), (torch.bfloat16, 2e-2)], ids=['fp16', 'bf16'])
def test_a_key_bias_in_half_precision_is_added_in_the_keys_dtype(dtype, tol):
    """The kernels add the bias in the keys' dtype, as ``k + key_bias`` does outside: the results of the
    keys with the bias added first."""
    inputs, grad_out = make_inputs(2, 2, 13 * 11, 5 * 4, 32, dtype=dtype)
    bias = (torch.randn(1, 2, 5 * 4, 32, generator=torch.Generator().manual_seed(5)) * 0.5).to(DEVICE, dtype)
    actual = forward_backward(_with_key_bias(pola_attention_triton), inputs + [bias], grad_out)
    added = inputs[:1] + [inputs[1] + bias] + inputs[2:]
    expected = forward_backward(pola_attention_triton, added, grad_out)
    for name, a, e in zip(NAMES, actual, expected):
        assert a.dtype == dtype and relative_error(a, e) <= tol, name
    assert relative_error(actual[-1], expected[2].sum(0, keepdim=True)) <= tol


def test_a_key_bias_is_no_tensor_of_its_own():
    """Launched as on an H100 (a dry run), with a key bias that is a per-head view of a (1, n, C) encoding, as
    the models pass it: the forward runs no torch kernel on the keys (no k + bias tensor is made or kept),
    the backward one sum of k's gradient over the batch, written in the encoding's layout (no copy on its
    way to the encoding)."""
    from mmpola.ops.triton_support import dry_run

    inputs, grad_out = make_inputs(2, 2, 7 * 9, 7 * 9, 16)
    inputs = [t.requires_grad_() for t in inputs]
    encoding = torch.randn(1, 7 * 9, 2 * 16).to(DEVICE).requires_grad_()
    bias = encoding.unflatten(-1, (2, 16)).transpose(1, 2)
    with dry_run(H100):
        with DispatchedOps() as plain:
            plain_out = pola_attention_triton(*inputs)
        with DispatchedOps() as forward:
            out = pola_attention_triton(*inputs, key_bias=bias)
        with DispatchedOps() as backward:
            torch.autograd.grad(out, [*inputs, encoding], grad_out)
        with DispatchedOps() as without:
            torch.autograd.grad(plain_out, inputs, grad_out)
    assert forward.kernels() == plain.kernels(), (forward.names, plain.names)
    assert backward.kernels() == without.kernels() + ['sum'], (backward.names, without.names)


def test_deterministic():
    inputs, grad_out = make_inputs(2, 1, 13 * 11, 13 * 11, 16)  # several chunks per head
    first = forward_backward(pola_attention_triton, inputs, grad_out)
    second = forward_backward(pola_attention_triton, inputs, grad_out)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


@pytest.mark.parametrize('dtype,tol', [(torch.float16, 1e-2), (torch.bfloat16, 3e-2)], ids=['fp16', 'bf16'])
def test_half_precision_inputs_against_fp32_reference(dtype, tol):
    """fp16 / bf16 tensors are loaded and computed in float32 (TF32 products); output and gradients come
    back in the input dtype, within the input dtype's rounding of the fp32 reference on the same values."""
    inputs, grad_out = make_inputs(2, 2, 13 * 11, 5 * 4, 32, dtype=dtype)
    actual = forward_backward(pola_attention_triton, inputs, grad_out)
    assert all(a.dtype == dtype for a in actual)
    expected = forward_backward(pola_attention_reference, [t.float() for t in inputs], grad_out.float())
    assert_matches(actual, expected, tol, str(dtype))


def test_fp32_island_passes_half_tensors_uncast():
    """pola_attention(fp32=True) under bf16 autocast: the bf16 tensors go in as they are (fp32_inside),
    large query magnitudes stay finite, the result comes back in bf16."""
    inputs, grad_out = make_inputs(1, 2, 50, 50, 16, dtype=torch.bfloat16)
    inputs[0] = inputs[0] * 30  # |q/s| ~ 40: overflows bf16 / fp16 matmuls of |q/s|^p
    with torch.autocast(device_type=DEVICE, dtype=torch.bfloat16):
        actual = forward_backward(pola_attention, inputs, grad_out, impl='triton')
    assert actual[0].dtype == torch.bfloat16
    expected = forward_backward(pola_attention_reference, [t.float() for t in inputs], grad_out.float())
    assert_matches(actual, expected, 3e-2)


def test_auto_prefers_triton_on_cuda_and_fast_on_cpu():
    assert OPS['pola'].preferred['cuda'][0] == 'triton'
    assert OPS['pola'].choose('auto', torch.device('cpu'), torch.float32) == 'fast'
    if torch.cuda.is_available():
        assert OPS['pola'].choose('auto', torch.device('cuda'), torch.float32) == 'triton'


def test_triton_on_cpu_without_interpreter_is_one_clear_error(monkeypatch):
    kernels_compiled(monkeypatch)
    (q, k, v, power, scale), _ = make_inputs(1, 1, 4, 4, 8)
    q, k, v = q.cpu(), k.cpu(), v.cpu()
    with pytest.raises(AttnImplUnavailable, match=r"attn_impl='triton' \(pola_attention\) cannot run here: .*CUDA"):
        pola_attention(q, k, v, power.cpu(), scale.cpu(), impl='triton')
    with pytest.raises(AttnImplUnavailable, match='CUDA'):
        pola_attention_triton(q, k, v, power.cpu(), scale.cpu())


@pytest.mark.skipif(DEVICE == 'cuda', reason='float64 kernels run only under the interpreter')
def test_float64_computes_in_float64():
    inputs, grad_out = make_inputs(2, 2, 21, 9, 8, dtype=torch.float64)
    actual = forward_backward(pola_attention_triton, inputs, grad_out)
    assert all(a.dtype == torch.float64 for a in actual)
    assert_matches(actual, float64_reference(inputs, grad_out), 1e-12)


def test_example_inputs_of_the_op():
    tensors, (alpha, eps) = OPS['pola'].example_inputs(2, 3, (5, 7), 16, torch.Generator().manual_seed(0))
    tensors = [t.to(DEVICE) for t in tensors]
    grad_out = torch.randn(tensors[0].shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    actual = forward_backward(pola_attention_triton, tensors, grad_out, alpha=alpha, eps=eps)
    assert_matches(actual, float64_reference(tensors, grad_out, alpha=alpha, eps=eps), 1e-5)


def test_backbone_with_triton_matches_fast(monkeypatch):
    """A Pola-PVT with attn_impl='triton' (the models' calling convention: the scale parameter's per-head
    view, the fp32 island): same stage outputs and parameter gradients as with 'fast'."""
    from mmpola.models import PolaPVT
    # TF32 convolutions (cuDNN's default) would round the two models' slightly different activations
    # to different TF32 values: fp32 convolutions keep the comparison to the cores' own difference
    monkeypatch.setattr(torch.backends.cudnn, 'allow_tf32', False)
    arch = dict(embed_dims=[16, 32, 48, 64], num_heads=[1, 2, 3, 4], mlp_ratios=[2, 2, 2, 2], depths=[1, 1, 1, 1])
    torch.manual_seed(0)
    # eval mode: no drop path, so both models compute the same function (gradients flow all the same)
    models = {impl: PolaPVT(arch=arch, attn_impl=impl).to(DEVICE).eval() for impl in ('fast', 'triton')}
    models['triton'].load_state_dict(models['fast'].state_dict())
    x = torch.randn(2, 3, 64, 96, device=DEVICE)
    outs = {}
    for impl, model in models.items():
        outs[impl] = model(x)
        sum((o * o).mean() for o in outs[impl]).backward()
    for a, e in zip(outs['triton'], outs['fast']):
        assert relative_error(a.detach(), e.detach()) <= 1e-5
    fast = dict(models['fast'].named_parameters())
    for name, param in models['triton'].named_parameters():
        assert relative_error(param.grad, fast[name].grad) <= 1e-5, name


@pytest.mark.parametrize('index', range(6))
def test_every_tuned_config_matches_the_reference(index):
    """Each config the GPU kernels are tuned over (token block, warps), forced in turn: the chunks do not
    depend on the config (the backward's chunks of 32 tokens are shorter than a 64 block, which stops
    at its chunk's end), the result agrees with the reference."""
    from mmpola.ops.triton_support import fixed_config
    inputs, grad_out = make_inputs(1, 1, 100, 100, 16)
    with fixed_config(index):
        actual = forward_backward(pola_attention_triton, inputs, grad_out)
    assert_matches(actual, float64_reference(inputs, grad_out), 1e-5, f'config {index}')
