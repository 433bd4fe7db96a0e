"""PaCS attention's Triton kernels ('triton'): output and the gradients of q, k, v and both spikiness
logits against the reference in float64; half-precision inputs; strided views; where 'auto' picks it.

Without a GPU the kernels run through Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1):
the grids are small."""
import pytest
import torch

from mmpola.ops import OPS, pacs_attention, pacs_attention_reference, pacs_attention_triton, rope_angles, rope_tables
from mmpola.ops.dispatch import AttnImplUnavailable
from tests.fixtures.ops import H100, DispatchedOps, kernels_compiled

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'
NAMES = ['out', 'grad_q', 'grad_k', 'grad_v', 'grad_s_same', 'grad_s_opp']


def make_inputs(B, h, H, W, d, dtype=torch.float32, seed=0, q_scale=1.0, k_scale=1.0):
    """q, k, v, s_same, s_opp (unit variance, logits around 0), the rotary tables and an output gradient."""
    g = torch.Generator().manual_seed(seed)
    n = H * W
    q = torch.randn(B, h, n, d, generator=g) * q_scale
    k = torch.randn(B, h, n, d, generator=g) * k_scale
    v = torch.randn(B, h, n, d, generator=g)
    s_same = torch.randn(1, h, 1, 2 * d, generator=g)
    s_opp = torch.randn(1, h, 1, 2 * d, generator=g)
    grad_out = torch.randn(B, h, n, d, generator=g)
    sin, cos = rope_tables(rope_angles(2 * h * d, h), (H, W))
    inputs = [t.to(DEVICE, dtype) for t in (q, k, v, s_same, s_opp)]
    return inputs, (sin.to(DEVICE), cos.to(DEVICE)), grad_out.to(DEVICE)


def forward_backward(fn, inputs, tables, grad_out, dtype=None):
    """Output and the gradients of every input, in ``dtype`` (default: the inputs' own)."""
    leaves = [(t if dtype is None else t.to(dtype)).detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves, *(t if dtype is None else t.to(dtype) for t in tables))
    out.backward(grad_out.to(out.dtype))
    return [out.detach()] + [t.grad for t in leaves]


def relative_error(actual, expected):
    """max |a - e| / max |e|."""
    return ((actual.double() - expected.double()).abs().max() / expected.double().abs().max()).item()


def assert_close_to_fp64_reference(inputs, tables, grad_out, tol=1e-5):
    actual = forward_backward(pacs_attention_triton, inputs, tables, grad_out)
    expected = forward_backward(pacs_attention_reference, inputs, tables, grad_out, dtype=torch.float64)
    for name, a, e in zip(NAMES, actual, expected):
        assert a.shape == e.shape and a.dtype == inputs[0].dtype, name
        err = relative_error(a, e)
        assert err <= tol, f'{name}: relative error {err:.2e}'


# (B, h, H, W, d): odd grids (masked token tails), batch 1 and 2, several heads, head dims 8 to 128
SHAPES = [
    (2, 3, 7, 9, 16),
    (1, 2, 13, 11, 32),
    (1, 1, 21, 37, 64),
    (1, 1, 3, 5, 128),
    (2, 2, 3, 5, 8),
]


@pytest.mark.parametrize('shape', SHAPES, ids=lambda s: 'x'.join(map(str, s)))
def test_triton_matches_fp64_reference(shape):
    """fp32 kernels within 1e-5 (relative to the largest value) of the reference computed in float64."""
    assert_close_to_fp64_reference(*make_inputs(*shape))


def test_small_features_keep_relative_accuracy():
    """Tiny q and k: exp(x) - 1 of small x (where exp rounds the result away) stays accurate."""
    assert_close_to_fp64_reference(*make_inputs(1, 2, 5, 7, 16, seed=1, q_scale=1e-3, k_scale=1e-3))


@pytest.mark.parametrize('dtype,tol', [(torch.float16, 1e-2), (torch.bfloat16, 3e-2)])
def test_half_precision_inputs(dtype, tol):
    """fp16 / bf16 q, k, v, logits: computed in float32 inside, results (and gradients) in the inputs' dtype,
    within ``tol`` (relative to the largest value) of the fp32 reference on the same rounded inputs."""
    inputs, tables, grad_out = make_inputs(2, 2, 7, 9, 32, dtype=dtype)
    actual = forward_backward(pacs_attention_triton, inputs, tables, grad_out.to(dtype))
    expected = forward_backward(pacs_attention_reference, inputs, tables, grad_out.to(dtype), dtype=torch.float32)
    for name, a, e in zip(NAMES, actual, expected):
        assert a.dtype == dtype, name
        err = relative_error(a, e)
        assert err <= tol, f'{name}: relative error {err:.2e}'


def test_strided_views_and_shared_logits():
    """q, k, v as head slices of one (B, N, 3, h, d) projection, a non-contiguous output gradient, and
    logits shared by all heads (1, 1, 1, 2d): the same numbers as contiguous tensors."""
    B, h, H, W, d = 2, 3, 5, 7, 16
    inputs, tables, grad_out = make_inputs(B, h, H, W, d)
    qkv = torch.stack(inputs[:3], dim=2).permute(0, 3, 2, 1, 4).contiguous()  # (B, N, 3, h, d)
    views = [qkv[:, :, i].transpose(1, 2) for i in range(3)]
    assert not any(t.is_contiguous() for t in views)
    logits = [s[:, :1] for s in inputs[3:]]
    grad_view = grad_out.transpose(-1, -2).contiguous().transpose(-1, -2)
    assert not grad_view.is_contiguous()
    assert_close_to_fp64_reference(views + logits, tables, grad_view)


def test_exact_zeros_get_relu_gradient():
    """q = 0 or k = 0 exactly: zero gradient there, as autograd's relu in the reference."""
    inputs, tables, grad_out = make_inputs(1, 2, 2, 3, 8, seed=3)
    inputs[0][0, 0, 0, 0] = 0.0
    inputs[1][0, 1, 2, 1] = 0.0
    actual = forward_backward(pacs_attention_triton, inputs, tables, grad_out)
    assert actual[1][0, 0, 0, 0] == 0 and actual[2][0, 1, 2, 1] == 0
    assert_close_to_fp64_reference(inputs, tables, grad_out)


def test_frozen_logits_and_the_fp32_island():
    """Through pacs_attention: bf16 q, k, v under autocast go in uncast (fp32 inside), frozen logits get no
    gradient, and q, k, v's gradients come back in bf16."""
    inputs, tables, grad_out = make_inputs(1, 2, 5, 6, 16)
    q, k, v, s_same, s_opp = inputs
    expected = pacs_attention_reference(q.bfloat16().float(), k.bfloat16().float(), v.bfloat16().float(), s_same,
                                        s_opp, *tables)
    leaves = [t.bfloat16().requires_grad_() for t in (q, k, v)]
    with torch.autocast(torch.device(DEVICE).type, dtype=torch.bfloat16):
        out = pacs_attention(*leaves, s_same, s_opp, *tables, impl='triton')
    assert out.dtype == torch.bfloat16
    out.float().backward(grad_out)
    assert all(t.grad.dtype == torch.bfloat16 and torch.isfinite(t.grad).all() for t in leaves)
    assert relative_error(out, expected) <= 3e-2


def test_auto_prefers_triton_on_cuda_and_fast_on_cpu():
    assert OPS['pacs'].preferred['cuda'][0] == 'triton'
    assert OPS['pacs'].choose('auto', torch.device('cpu'), torch.float32) == 'fast'
    assert OPS['pacs'].records['triton'].fp32_inside


def test_cpu_tensors_without_the_interpreter_fail_clearly(monkeypatch):
    inputs, tables, _ = make_inputs(1, 1, 2, 2, 8)
    kernels_compiled(monkeypatch)
    cpu = [t.cpu() for t in inputs] + [t.cpu() for t in tables]
    with pytest.raises(AttnImplUnavailable, match="attn_impl='triton'.*run on CUDA tensors.*'fast'"):
        pacs_attention(*cpu, impl='triton')
    with pytest.raises(AttnImplUnavailable, match='run on CUDA tensors'):
        pacs_attention_triton(*cpu)


def test_logits_of_another_shape_are_a_clear_error():
    inputs, tables, _ = make_inputs(2, 2, 2, 2, 8)
    q, k, v, s_same, s_opp = inputs
    with pytest.raises(ValueError, match=r"broadcastable to \(1, h, 1, 2d\).*impl='fast'"):
        pacs_attention_triton(q, k, v, s_same.expand(2, -1, -1, -1), s_opp, *tables)


@pytest.mark.parametrize('index', range(8))
def test_every_tuned_config_matches_the_reference(index):
    """Each config the GPU kernels are tuned over (token block, warps), forced in turn: the chunks do not
    depend on the config (a block stops at its chunk's end), the result agrees with the reference."""
    from mmpola.ops.pacs_triton import _TUNED
    from mmpola.ops.triton_support import fixed_config
    assert len(_TUNED) == 8
    with fixed_config(index):
        # 90 tokens in two chunks of 48 (the interpreter's granule is 16): not a multiple of 32 or 64
        assert_close_to_fp64_reference(*make_inputs(1, 1, 9, 10, 16))


def test_tables_and_logits_of_any_strides():
    """The kernels read the rotary tables at their strides (here column-major) and the logits as they are:
    one (2d,) row shared by every head, and a strided view per head; the same numbers as the reference."""
    B, h, H, W, d = 1, 2, 5, 6, 16
    (q, k, v, s_same, s_opp), (sin, cos), grad_out = make_inputs(B, h, H, W, d)
    tables = [t.t().contiguous().t() for t in (sin, cos)]
    assert tables[0].stride() == (1, H * W)
    wide = torch.zeros(1, h, 1, 4 * d, device=s_opp.device, dtype=s_opp.dtype)
    wide[..., ::2] = s_opp
    logits = [s_same[0, 0, 0], wide[..., ::2]]
    assert logits[0].shape == (2 * d, ) and logits[1].stride(-1) == 2
    assert_close_to_fp64_reference([q, k, v, *logits], tables, grad_out)


def test_only_the_sums_run_around_the_kernels():
    """Launched as on an H100 (a dry run): besides its Triton kernels (two in the forward, four in the
    backward: the queries' pass runs in two parts, the keys' once per value half), the op dispatches one
    torch kernel in the forward and three in the backward: the sums of the chunks' partial records and of
    the two flows' parts of q's gradient (in float32, written in q's dtype). The logits' sigmoid and its
    derivative, the rotary tables' even channels and the divisions by N happen in the kernels. The output and
    the gradients of q, k and v come in the tokens' layout."""
    from mmpola.ops.triton_support import dry_run

    inputs, tables, grad_out = make_inputs(2, 2, 8, 8, 32)
    q, k, v = (t.bfloat16().requires_grad_() for t in inputs[:3])
    logits = [s.requires_grad_() for s in inputs[3:]]
    grad_out = grad_out.bfloat16()
    with dry_run(H100) as launches:
        with DispatchedOps() as forward:
            out = pacs_attention_triton(q, k, v, *logits, *tables)
        with DispatchedOps() as backward:
            grads = torch.autograd.grad(out, [q, k, v, *logits], grad_out)
    assert forward.kernels() == ['sum'] and backward.kernels() == ['sum', 'add', 'sum'], (forward.names, backward.names)
    assert len(launches) == 6
    assert out.transpose(1, 2).is_contiguous()  # the tokens' layout: the model merges the heads with a view
    # so are q's, k's and v's gradients: the model's head views of its tokens take them without a copy
    assert all(g.transpose(1, 2).is_contiguous() for g in grads[:3])
    assert [g.shape for g in grads] == [t.shape for t in (q, k, v, *logits)]
    assert [g.dtype for g in grads] == [torch.bfloat16] * 3 + [torch.float32] * 2
