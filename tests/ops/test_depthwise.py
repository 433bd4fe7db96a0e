"""The depthwise convolution of the token maps (mmpola.ops.depthwise_conv2d): the Triton kernels against
the library convolution in float64 (output, input, weight and bias gradients), odd map sizes, kernel
sizes, layouts, half precision, autocast, every tuned config, and the module and environment switch.
Without a GPU the kernels run through Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1)."""
import contextlib

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from mmpola.models.layers import DepthwiseConv2d
from mmpola.ops import depthwise_conv2d
from mmpola.ops.depthwise_triton import depthwise_conv2d_triton
from mmpola.ops.dispatch import AttnImplUnavailable
from tests.fixtures.ops import H100, DispatchedOps, forward_backward, kernels_compiled, relative_error

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'


def make_inputs(B, C, H, W, k, dtype=torch.float32, channels_last=True, seed=0):
    """x (B, C, H, W) (a channels-last view, as the models pass it, or contiguous), weight, bias, dL/dout."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, H, W, C, generator=g).permute(0, 3, 1, 2)
    x = x if channels_last else x.contiguous()
    weight = torch.randn(C, 1, k, k, generator=g).to(memory_format=torch.channels_last)
    bias = torch.randn(C, generator=g)
    grad = torch.randn(B, H, W, C, generator=g).permute(0, 3, 1, 2)
    return [t.to(device=DEVICE, dtype=dtype) for t in (x, weight, bias, grad)]


def library(x, weight, bias=None):
    return F.conv2d(x, weight, bias, padding=weight.shape[-1] // 2, groups=weight.shape[0])


def assert_matches(actual, expected, tol, what=''):
    for name, a, e in zip(('out', 'dx', 'dweight', 'dbias'), actual, expected):
        assert a.shape == e.shape, name
        err = relative_error(a, e)
        assert err <= tol, f'{what} {name}: relative error {err:.2e} > {tol}'


# (B, C, H, W, k, channels_last): maps smaller and larger than a tile, channels not a multiple of the
# channel block, kernels 3 / 5 / 7, Swin's 7 x 7 windows, contiguous inputs
CASES = [(2, 40, 9, 13, 5, True), (3, 64, 7, 7, 5, True), (1, 24, 5, 6, 7, True), (2, 96, 17, 11, 3, True),
         (1, 32, 1, 1, 5, True), (2, 16, 12, 20, 3, False), (1, 70, 3, 19, 5, False)]


@pytest.mark.parametrize('case', CASES, ids=lambda c: 'B{}-C{}-{}x{}-k{}-{}'.format(*c[:5], 'cl' if c[5] else 'nchw'))
def test_triton_matches_the_library_convolution(case):
    """fp32 kernels within 1e-5 (relative to the largest value) of the float64 convolution: output and
    the gradients of x, weight and bias."""
    B, C, H, W, k, channels_last = case
    x, weight, bias, g = make_inputs(B, C, H, W, k, channels_last=channels_last)
    actual = forward_backward(depthwise_conv2d_triton, [x, weight, bias], g)
    expected = forward_backward(library, [x.double(), weight.double(), bias.double()], g.double())
    assert all(a.dtype == torch.float32 for a in actual)
    assert_matches(actual, expected, 1e-5, str(case))
    assert actual[0].is_contiguous(memory_format=torch.channels_last)


def test_without_bias_and_with_frozen_inputs():
    x, weight, _, g = make_inputs(2, 32, 9, 10, 5)
    actual = forward_backward(depthwise_conv2d_triton, [x, weight], g)
    expected = forward_backward(library, [x.double(), weight.double()], g.double())
    assert_matches(actual, expected, 1e-5)
    leaf = weight.clone().requires_grad_()  # x needs no gradient: only the weight's is computed
    depthwise_conv2d_triton(x, leaf).backward(g)
    assert relative_error(leaf.grad, expected[2]) <= 1e-5


def test_weight_gradient_has_the_weights_strides():
    """The Triton kernels give the weight gradient the weight's strides."""
    x, weight, bias, g = make_inputs(2, 32, 9, 10, 5)
    weight = weight.to(memory_format=torch.channels_last).requires_grad_()
    depthwise_conv2d_triton(x, weight, bias).backward(g)
    assert weight.grad.stride() == weight.stride()


@pytest.mark.parametrize('impl', ['torch', 'triton'])
def test_the_modules_weight_gradient_is_contiguous_whatever_the_inputs_layout(impl, monkeypatch):
    """DDP's gradient buckets take the parameter's strides: the module's weight (contiguous) gets contiguous
    gradients from channels-last maps (whose library convolution gives them channels-last), contiguous maps
    and strided views of a projection (CSWin's LePE), the same numbers as nn.Conv2d's."""
    monkeypatch.setenv('MMPOLA_DEPTHWISE_CONV', impl)
    torch.manual_seed(0)
    conv = DepthwiseConv2d(8, 3)
    reference = nn.Conv2d(8, 8, 3, padding=1, groups=8)
    reference.load_state_dict(conv.state_dict())
    tokens = torch.randn(2, 5 * 6, 3, 8)  # (B, H*W, P, C): the values are P's slot 2
    maps = {'channels_last': torch.randn(2, 8, 5, 6).to(memory_format=torch.channels_last),
            'contiguous': torch.randn(2, 8, 5, 6),
            'projection': tokens[:, :, 2].transpose(1, 2).unflatten(2, (5, 6))}
    for layout, x in maps.items():
        conv.zero_grad(set_to_none=True)
        reference.zero_grad(set_to_none=True)
        conv(x).square().sum().backward()
        reference(x).square().sum().backward()
        assert conv.weight.grad.stride() == conv.weight.stride() == (9, 9, 3, 1), layout
        assert relative_error(conv.weight.grad, reference.weight.grad) <= 1e-5, layout
    # channels innermost (channels-last maps, views of a projection): the library convolution runs channels-last
    # (no NCHW copy of a projection's view), a contiguous map stays NCHW
    monkeypatch.setenv('MMPOLA_DEPTHWISE_CONV', 'torch')
    assert conv(maps['projection']).is_contiguous(memory_format=torch.channels_last)
    assert conv(maps['contiguous']).is_contiguous()


@pytest.mark.parametrize('dtype,tol', [(torch.float16, 1e-2), (torch.bfloat16, 3e-2)])
def test_half_precision_inputs(dtype, tol):
    """fp16 / bf16 tensors are accumulated in float32; output and gradients in the inputs' dtype."""
    x, weight, bias, g = make_inputs(2, 48, 11, 9, 5, dtype=dtype)
    actual = forward_backward(depthwise_conv2d_triton, [x, weight, bias], g)
    assert all(a.dtype == dtype for a in actual)
    expected = forward_backward(library, [x.double(), weight.double(), bias.double()], g.double())
    assert_matches(actual, expected, tol, str(dtype))


def test_autocast_computes_in_the_autocast_dtype():
    """Under autocast the kernels take the input in the autocast dtype and give the output in it, as the
    convolution does; float32 weights and bias are read as they are, not rounded to the autocast dtype (no cast
    dispatched either way: the convolution's autocast casts them forward and their gradients back), and their
    gradients come back in float32, summed in float32 without rounding to the autocast dtype."""
    x, weight, bias, g = make_inputs(1, 32, 7, 9, 5)
    weight = weight + 2 ** -12  # values that bfloat16 does not hold
    dtype = torch.bfloat16
    leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
    grad = g.to(dtype)
    with DispatchedOps() as ops:
        with torch.autocast(DEVICE, dtype=dtype):
            out = depthwise_conv2d_triton(*leaves)
        out.backward(grad)
    casts = [shape for name, shape in zip(ops.names, ops.shapes) if name == '_to_copy']
    assert casts == [x.shape] * 2, casts  # the input's, as the convolution casts it, and its gradient's back
    with torch.autocast(DEVICE, dtype=dtype):
        expected = library(x, weight, bias)
    assert out.dtype == expected.dtype == dtype
    assert relative_error(out, expected) <= 3e-2
    assert [t.grad.dtype for t in leaves] == [torch.float32] * 3
    # against float64 on the rounded input and gradient: the weights unrounded, their gradients summed in float32
    xr, gr = x.to(dtype).double().requires_grad_(), g.to(dtype).double()
    wd, bd = weight.double().requires_grad_(), bias.double().requires_grad_()
    exact = library(xr, wd, bd)
    exact.backward(gr)
    assert relative_error(out, exact) <= 2 ** -8  # the output's own rounding
    assert relative_error(leaves[0].grad, xr.grad) <= 2 ** -7  # rounded to bfloat16 on the way back, as the input
    assert relative_error(leaves[1].grad, wd.grad) <= 1e-5 and relative_error(leaves[2].grad, bd.grad) <= 1e-5


def test_deterministic():
    x, weight, bias, g = make_inputs(1, 64, 17, 19, 5)
    first = forward_backward(depthwise_conv2d_triton, [x, weight, bias], g)
    second = forward_backward(depthwise_conv2d_triton, [x, weight, bias], g)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


@pytest.mark.parametrize('index', range(6))
def test_every_tuned_config_matches_the_library(index):
    """Each config the GPU kernels are tuned over (tile, channel block), forced in turn."""
    from mmpola.ops.depthwise_triton import _TUNED
    from mmpola.ops.triton_support import fixed_config
    assert len(_TUNED) == 6
    x, weight, bias, g = make_inputs(1, 80, 9, 17, 5)  # 80 channels: a partial second block of 64
    with fixed_config(index):
        actual = forward_backward(depthwise_conv2d_triton, [x, weight, bias], g)
    expected = forward_backward(library, [x.double(), weight.double(), bias.double()], g.double())
    assert_matches(actual, expected, 1e-5, f'config {index}')


def test_default_tile_is_the_gpus_in_a_dry_run_and_larger_in_the_interpreter(monkeypatch):
    """Where no timing chooses, a GPU runs the widest tuned tile (8 x 8 pixels, one of the configs above); the
    interpreter, whose time goes per program and per operation, tiles of 16 x 16 (the maps of CASES larger than
    that still take several) in the forward and both backward kernels, with the same results
    (test_triton_matches_the_library_convolution)."""
    from mmpola.ops import triton_support
    from mmpola.ops.depthwise_triton import _TUNED
    x, weight, bias, g = make_inputs(1, 80, 9, 17, 5)
    with triton_support.dry_run(H100) as launches:
        depthwise_conv2d_triton(x, weight, bias)
    (gpu, ) = launches
    tile = {key: gpu.default[key] for key in ('BLOCK_H', 'BLOCK_W', 'BLOCK_C')}
    assert tile == dict(BLOCK_H=8, BLOCK_W=8, BLOCK_C=64) and any(c.kwargs == tile for c in _TUNED)
    if DEVICE == 'cpu':
        seen, first_fitting = [], triton_support._launch_first_fitting
        monkeypatch.setattr(triton_support, '_launch_first_fitting', lambda tuner, grid, args, kwargs, default: (
            seen.append(default) or first_fitting(tuner, grid, args, kwargs, default)))
        forward_backward(depthwise_conv2d_triton, [x, weight, bias], g)
        assert [(d['BLOCK_H'], d['BLOCK_W'], d['BLOCK_C']) for d in seen] == [(16, 16, 64)] * 3


def test_empty_batch():
    """An input without elements runs on the library convolution (nothing to launch), gradients included."""
    x, weight, bias, _ = make_inputs(1, 16, 5, 5, 3)
    leaf = weight.clone().requires_grad_()
    out = depthwise_conv2d(x[:0], leaf, bias, impl='triton')
    assert out.shape == (0, 16, 5, 5)
    out.sum().backward()
    assert torch.equal(leaf.grad, torch.zeros_like(leaf))
    with pytest.raises(ValueError, match='takes inputs with elements'):
        depthwise_conv2d_triton(x[:0], weight, bias)


def test_public_function_and_its_choices():
    x, weight, bias, _ = make_inputs(1, 16, 5, 6, 3)
    torch.testing.assert_close(depthwise_conv2d(x, weight, bias), library(x, weight, bias))
    torch.testing.assert_close(depthwise_conv2d(x, weight, bias, impl='triton'), library(x, weight, bias),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="impl must be one of auto, torch, triton, got 'cudnn'"):
        depthwise_conv2d(x, weight, bias, impl='cudnn')
    with pytest.raises(ValueError, match='odd square kernel'):
        depthwise_conv2d(x, torch.randn(16, 1, 4, 4), None, impl='triton')
    with pytest.raises(ValueError, match=r'x \(B, C, H, W\) or \(B, G, C, H, W\) and weight \(C, 1, k, k\)'):
        depthwise_conv2d(x, torch.randn(8, 1, 3, 3), None, impl='triton')


def test_cpu_tensors_without_the_interpreter_are_a_clear_error(monkeypatch):
    kernels_compiled(monkeypatch)
    x = torch.randn(1, 16, 5, 5)
    with pytest.raises(AttnImplUnavailable, match=r"cannot run here: .*CUDA tensors.*impl='torch' "
                       r'\(MMPOLA_DEPTHWISE_CONV=torch\)'):
        depthwise_conv2d(x, torch.randn(16, 1, 3, 3), None, impl='triton')


def test_module_runs_the_implementation_the_environment_names(monkeypatch):
    """mmpola's depthwise convs are nn.Conv2d with the same parameters and keys; MMPOLA_DEPTHWISE_CONV=triton
    runs them through the kernels, with the same output and gradients."""
    conv = DepthwiseConv2d(48, 5).to(DEVICE)
    assert isinstance(conv, DepthwiseConv2d) and isinstance(conv, nn.Conv2d)
    assert list(conv.state_dict()) == ['weight', 'bias']
    x, _, _, g = make_inputs(2, 48, 9, 11, 5)
    monkeypatch.delenv('MMPOLA_DEPTHWISE_CONV', raising=False)
    library_run = forward_backward(conv, [x], g) + [conv.weight.grad.clone(), conv.bias.grad.clone()]
    conv.zero_grad()
    monkeypatch.setenv('MMPOLA_DEPTHWISE_CONV', 'triton')
    triton_run = forward_backward(conv, [x], g) + [conv.weight.grad.clone(), conv.bias.grad.clone()]
    for a, e in zip(triton_run, library_run):
        assert relative_error(a, e) <= 1e-5


def per_sample_library(x, weight, bias=None):
    return torch.cat([library(x[i:i + 1], weight[i].unsqueeze(1), None if bias is None else bias[i])
                      for i in range(x.shape[0])])


@pytest.mark.parametrize('case', [(3, 40, 9, 13, 3, True), (2, 24, 7, 7, 5, False), (1, 32, 11, 6, 3, True)],
                         ids=lambda c: 'B{}-C{}-{}x{}-k{}-{}'.format(*c[:5], 'cl' if c[5] else 'nchw'))
def test_kernels_of_their_own_per_image(case):
    """per_sample=True (InLine's predicted kernels): weight (B, C, k, k) and bias (B, C), against one
    convolution per image in float64, output and every gradient."""
    B, C, H, W, k, channels_last = case
    x, _, _, g = make_inputs(B, C, H, W, k, channels_last=channels_last)
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(B, C, k, k, generator=gen).to(DEVICE)
    bias = torch.randn(B, C, generator=gen).to(DEVICE)
    actual = forward_backward(depthwise_conv2d_triton, [x, weight, bias], g, per_sample=True)
    expected = forward_backward(per_sample_library, [x.double(), weight.double(), bias.double()], g.double())
    assert_matches(actual, expected, 1e-5, str(case))
    library_run = forward_backward(depthwise_conv2d, [x.double(), weight.double(), bias.double()], g.double(),
                                   per_sample=True)  # the library path: one grouped convolution
    assert_matches(library_run, expected, 1e-12, 'library')
    with pytest.raises(ValueError, match=r'weight \(B, C, k, k\), one kernel per image and channel'):
        depthwise_conv2d(x, weight[:, :1], None, impl='triton', per_sample=True)
    with pytest.raises(ValueError, match=r'a bias of shape \(%d, %d\)' % (B, C)):
        depthwise_conv2d(x, weight, bias[0], impl='triton', per_sample=True)


@pytest.mark.parametrize('index', range(6))
def test_every_tuned_config_with_kernels_per_image(index):
    from mmpola.ops.triton_support import fixed_config
    x, _, _, g = make_inputs(2, 80, 9, 13, 3)
    weight = torch.randn(2, 80, 3, 3, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    with fixed_config(index):
        actual = forward_backward(depthwise_conv2d_triton, [x, weight], g, per_sample=True)
    expected = forward_backward(per_sample_library, [x.double(), weight.double()], g.double())
    assert_matches(actual, expected, 1e-5, f'config {index}')


def test_auto_runs_the_kernels_on_a_gpu_and_the_library_elsewhere(monkeypatch):
    """'auto': the Triton kernels for CUDA tensors (and inside a dry run, as on its GPU), the library
    convolution on the CPU (also under the interpreter), for float64, and while a tracer records."""
    from mmpola.ops.depthwise import auto_impl
    from mmpola.ops.triton_support import dry_run
    x = torch.randn(1, 16, 5, 5)
    assert auto_impl(x) == 'torch'
    with dry_run(H100):
        assert auto_impl(x) == 'triton'
        assert auto_impl(x.half()) == 'triton'
        assert auto_impl(x.double()) == 'torch'
        monkeypatch.setattr(torch.jit, 'is_tracing', lambda: True)
        assert auto_impl(x) == 'torch'
    if torch.cuda.is_available():
        monkeypatch.undo()
        expected = 'triton' if torch.cuda.get_device_capability()[0] >= 8 else 'torch'
        assert auto_impl(x.cuda()) == expected


def test_module_under_auto_on_the_cpu_is_the_library_convolution(monkeypatch):
    """With MMPOLA_DEPTHWISE_CONV unset, mmpola's depthwise convs on the CPU give nn.Conv2d's results exactly."""
    monkeypatch.delenv('MMPOLA_DEPTHWISE_CONV', raising=False)
    conv = DepthwiseConv2d(24, 5)
    x = torch.randn(2, 9, 7, 24).permute(0, 3, 1, 2)
    assert torch.equal(conv(x), nn.Conv2d.forward(conv, x))


def test_module_takes_odd_kernel_sizes_only():
    assert DepthwiseConv2d(8, 3).padding == (1, 1) and DepthwiseConv2d(8, 5, bias=False).bias is None
    with pytest.raises(ValueError, match='odd kernel size'):
        DepthwiseConv2d(8, 4)


@pytest.mark.parametrize('impl', ['triton', 'torch'])
def test_maps_per_image_read_in_place(impl):
    """x (B, G, C, H, W): G maps per image convolved by the same kernels, here the per-head values of an
    attention seen in place in their projection (B, H*W, 4, G, C), as the Pola and FLatten value terms pass
    them. Against the library convolution of the B * G maps in float64: the output and the gradients of the
    projection (in the values' slot only), weight and bias; the Triton kernels read the maps where they are
    (no copy: counted in a dry run for an H100, since the interpreter copies every argument), the library
    convolution copies them once, channels-last."""
    from mmpola.ops.triton_support import dry_run

    B, G, C, H, W, k = 2, 3, 20, 7, 9, 5
    gen = torch.Generator().manual_seed(0)
    projection = torch.randn(B, H * W, 4, G, C, generator=gen).to(DEVICE)
    weight = torch.randn(C, 1, k, k, generator=gen).to(DEVICE, memory_format=torch.channels_last)
    bias = torch.randn(C, generator=gen).to(DEVICE)
    grad = torch.randn(B, G, C, H, W, generator=gen).to(DEVICE)

    def values(projection):
        return projection[:, :, 2].unflatten(1, (H, W)).permute(0, 3, 4, 1, 2)  # (B, G, C, H, W), a view

    def run(fn, dtype):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (projection, weight, bias)]
        out = fn(values(leaves[0]), *leaves[1:])
        out.backward(grad.to(dtype))
        return [out.detach()] + [t.grad for t in leaves]

    out, *grads = run(lambda *args: depthwise_conv2d(*args, impl=impl), torch.float32)
    expected, *expected_grads = run(lambda x, w, b: library(x.flatten(0, 1), w, b).unflatten(0, (B, G)),
                                    torch.float64)
    assert out.shape == (B, G, C, H, W)
    assert_matches([out, *grads], [expected, *expected_grads], 1e-5, impl)
    assert grads[0][:, :, [0, 1, 3]].abs().max() == 0
    assert out.permute(0, 1, 3, 4, 2).is_contiguous()  # channels-last per map: the heads' layout as a view
    counting = dry_run(H100) if impl == 'triton' else contextlib.nullcontext()
    with counting, DispatchedOps() as ops:
        depthwise_conv2d(values(projection), weight, bias, impl=impl)
    copies = sum(name in ('clone', 'copy_', '_to_copy') for name in ops.names)
    assert copies == (0 if impl == 'triton' else 1)
    conv = DepthwiseConv2d(C, k).to(DEVICE)
    with torch.no_grad():
        conv.weight.copy_(weight)
        conv.bias.copy_(bias)
    with pytest.MonkeyPatch.context() as env:
        env.setenv('MMPOLA_DEPTHWISE_CONV', impl)
        assert relative_error(conv(values(projection)), expected) <= 1e-5
    with pytest.raises(ValueError, match=r'x \(B, C, H, W\) or \(B, G, C, H, W\)'):
        depthwise_conv2d(values(projection)[:, :, :4], weight, bias, impl=impl)


def test_input_gradient_in_the_inputs_layout_when_its_channels_are_contiguous():
    """The Triton input gradient of the per-head values seen in their projection comes in the projection's
    layout (B, H, W, G, C), where it meets the attention core's gradient of the values: their sum then
    needs no copy on its way to the projection; a channels-last map gets a channels-last gradient, and an
    input whose channels are not contiguous (NCHW) a channels-last one too (the kernels' own layout)."""
    B, G, C, H, W = 2, 3, 8, 5, 7
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(C, 1, 3, 3, generator=gen).to(DEVICE)
    projection = torch.randn(B, H * W, 4, G, C, generator=gen).to(DEVICE).requires_grad_()
    x = projection[:, :, 2].unflatten(1, (H, W)).permute(0, 3, 4, 1, 2)  # (B, G, C, H, W), a view
    out = depthwise_conv2d(x, weight, impl='triton')
    (grad_x, ) = torch.autograd.grad(out, x, torch.randn(out.shape, generator=gen).to(DEVICE))
    assert grad_x.permute(0, 3, 4, 1, 2).is_contiguous()
    expected = library(x.detach().flatten(0, 1).double(), weight.double(), None)
    assert relative_error(out.flatten(0, 1), expected) <= 1e-5
    for image, channels_last in ((torch.randn(B, C, H, W, generator=gen).to(DEVICE, memory_format=torch.channels_last),
                                  True), (torch.randn(B, C, H, W, generator=gen).to(DEVICE), False)):
        image.requires_grad_()
        out = depthwise_conv2d(image, weight, impl='triton')
        (grad, ) = torch.autograd.grad(out, image, torch.ones_like(out))
        assert grad.is_contiguous(memory_format=torch.channels_last), channels_last


@pytest.mark.parametrize('impl', ['triton', 'torch'])
def test_residual_is_added_in_its_layout(impl):
    """``residual + conv(x)``: an attention core's per-head output (B, G, C, H, W) seen in its tokens' layout
    (B, H, W, G, C), as the Pola and FLatten value terms pass it, with the values seen in their projection.
    Against the float64 library convolution plus the residual: the output and the gradients of the projection,
    weight, bias and residual (the output's gradient itself); the Triton output is in the residual's layout
    (merging the heads after it is a view), and in a dry run for an H100 the forward runs the convolution's
    kernel and no addition."""
    from mmpola.ops.triton_support import dry_run

    B, G, C, H, W, k = 2, 3, 20, 7, 9, 5
    gen = torch.Generator().manual_seed(0)
    projection = torch.randn(B, H * W, 4, G, C, generator=gen).to(DEVICE)
    core = torch.randn(B, H * W, G, C, generator=gen).to(DEVICE)
    weight = torch.randn(C, 1, k, k, generator=gen).to(DEVICE, memory_format=torch.channels_last)
    bias = torch.randn(C, generator=gen).to(DEVICE)
    grad = torch.randn(B, G, C, H, W, generator=gen).to(DEVICE)

    def maps(t):  # (B, H*W, G, C) tokens -> (B, G, C, H, W), a view
        return t.unflatten(1, (H, W)).permute(0, 3, 4, 1, 2)

    def run(fn, dtype):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (projection, weight, bias, core)]
        out = fn(maps(leaves[0][:, :, 2]), *leaves[1:3], maps(leaves[3]))
        out.backward(grad.to(dtype))
        return [out.detach()] + [t.grad for t in leaves]

    actual = run(lambda x, w, b, r: depthwise_conv2d(x, w, b, impl=impl, residual=r), torch.float32)
    expected = run(lambda x, w, b, r: r + library(x.flatten(0, 1), w, b).unflatten(0, (B, G)), torch.float64)
    for name, a, e in zip(('out', 'dprojection', 'dweight', 'dbias', 'dresidual'), actual, expected):
        assert a.shape == e.shape and relative_error(a, e) <= 1e-5, name
    if impl == 'triton':
        assert actual[0].permute(0, 3, 4, 1, 2).is_contiguous()  # the residual's (tokens') layout
        with dry_run(H100) as launches, DispatchedOps() as ops:
            depthwise_conv2d(maps(projection[:, :, 2]), weight, bias, impl=impl, residual=maps(core))
        assert len(launches) == 1 and 'add' not in ops.names, ops.names
        # a residual of another dtype: added after the kernel, in the promoted dtype
        out = depthwise_conv2d(maps(projection[:, :, 2]), weight, bias, impl=impl, residual=maps(core).double())
        assert out.dtype == torch.float64 and relative_error(out, expected[0]) <= 1e-5
    with pytest.raises(ValueError, match=r"takes a residual of the output's shape \(2, 3, 20, 7, 9\), got "
                       r"\(2, 3, 20, 7, 8\)"):
        depthwise_conv2d(maps(projection[:, :, 2]), weight, bias, impl=impl, residual=maps(core)[..., :8])


@pytest.mark.parametrize('impl', ['triton', 'torch'])
def test_residual_that_is_the_input(impl):
    """``x + conv(x)`` (``residual=x``: a block's positional convolution, PolaFormer++'s FFN) on a channels-last map:
    against the float64 ``x + conv(x)``, the output and the gradients of x (both of its uses), the weight and the
    bias; in a dry run for an H100 the Triton backward launches the input gradient's kernel and the weight
    gradient's and adds nothing after them (the input gradient's kernel adds the output's gradient, x's second
    use, where it writes)."""
    from mmpola.ops.triton_support import dry_run

    B, C, H, W, k = 2, 24, 6, 9, 3
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(B, H, W, C, generator=gen).permute(0, 3, 1, 2).to(DEVICE)  # channels-last
    weight = torch.randn(C, 1, k, k, generator=gen).to(DEVICE)
    bias = torch.randn(C, generator=gen).to(DEVICE)
    grad = torch.randn(B, C, H, W, generator=gen).to(DEVICE)

    def run(fn, dtype):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (x, weight, bias)]
        out = fn(*leaves)
        out.backward(grad.to(dtype))
        return [out.detach()] + [t.grad for t in leaves]

    actual = run(lambda x, w, b: depthwise_conv2d(x, w, b, impl=impl, residual=x), torch.float32)
    expected = run(lambda x, w, b: x + library(x, w, b), torch.float64)
    for name, a, e in zip(('out', 'dx', 'dweight', 'dbias'), actual, expected):
        assert a.shape == e.shape and relative_error(a, e) <= 1e-5, name
    if impl == 'triton':
        assert actual[0].is_contiguous(memory_format=torch.channels_last)
        leaves = [t.detach().requires_grad_() for t in (x, weight, bias)]
        with dry_run(H100) as launches:
            out = depthwise_conv2d(*leaves, impl=impl, residual=leaves[0])
            forward = len(launches)
            with DispatchedOps() as ops:
                out.backward(grad)
        assert forward == 1 and len(launches) == 3, [launch.kernel for launch in launches]
        assert 'add' not in ops.names, ops.names


def test_residual_that_is_a_float32_input_under_autocast():
    """A float32 stream's ``x + conv(x)`` under bf16 autocast (PolaFormer++'s positional convolution after the
    first block of a stage): the Triton path convolves x as it is, in float32, and writes the float32 sum in one
    kernel, against the float64 ``x + conv(x)``; in a dry run for an H100 neither pass dispatches a kernel of
    x's size around the launches (the library's path: x's bf16 copy, the convolution, the float32 sum and their
    gradients' cast and sum)."""
    from mmpola.ops.triton_support import dry_run

    B, C, H, W, k = 2, 24, 6, 9, 3
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(B, H, W, C, generator=gen).permute(0, 3, 1, 2).to(DEVICE)
    weight = torch.randn(C, 1, k, k, generator=gen).to(DEVICE)
    bias = torch.randn(C, generator=gen).to(DEVICE)
    grad = torch.randn(B, C, H, W, generator=gen).to(DEVICE)

    def run(fn, dtype, autocast):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (x, weight, bias)]
        with torch.autocast(DEVICE, torch.bfloat16, enabled=autocast):
            out = fn(*leaves)
        out.backward(grad.to(out.dtype))
        return [out.detach()] + [t.grad for t in leaves]

    actual = run(lambda x, w, b: depthwise_conv2d(x, w, b, impl='triton', residual=x), torch.float32, True)
    expected = run(lambda x, w, b: x + library(x, w, b), torch.float64, False)
    for name, a, e in zip(('out', 'dx', 'dweight', 'dbias'), actual, expected):
        assert a.dtype == torch.float32 and relative_error(a, e) <= 1e-5, name
    leaves = [t.detach().requires_grad_() for t in (x, weight, bias)]
    with dry_run(H100) as launches, torch.autocast(DEVICE, torch.bfloat16):
        with DispatchedOps() as forward:
            out = depthwise_conv2d(*leaves, impl='triton', residual=leaves[0])
        with DispatchedOps() as backward:
            torch.autograd.grad(out, leaves, grad)
    assert out.dtype == torch.float32 and len(launches) == 3
    assert forward.kernels(x.numel()) == [] and backward.kernels(x.numel()) == [], (forward.names, backward.names)


@pytest.mark.parametrize('impl', ['triton', 'torch'])
def test_residual_with_kernels_of_their_own_per_image(impl):
    """InLine's local residual: per-image kernels, the attention's (B, N, C) output as the residual map (a
    channels-last view of the tokens), the sum in the tokens' layout."""
    B, C, H, W = 2, 24, 5, 7
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(B, H, W, C, generator=gen).permute(0, 3, 1, 2).to(DEVICE)
    kernels = torch.randn(B, C, 3, 3, generator=gen).to(DEVICE)
    tokens = torch.randn(B, H * W, C, generator=gen).to(DEVICE)
    grad = torch.randn(B, C, H, W, generator=gen).to(DEVICE)

    def run(fn, dtype):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (x, kernels, tokens)]
        out = fn(leaves[0], leaves[1], leaves[2].transpose(1, 2).unflatten(2, (H, W)))
        out.backward(grad.to(dtype))
        return [out.detach()] + [t.grad for t in leaves]

    actual = run(lambda v, k, r: depthwise_conv2d(v, k, None, impl=impl, per_sample=True, residual=r), torch.float32)
    expected = run(lambda v, k, r: r + F.conv2d(v.reshape(1, B * C, H, W), k.reshape(B * C, 1, 3, 3), padding=1,
                                                groups=B * C).reshape(B, C, H, W), torch.float64)
    for name, a, e in zip(('out', 'dx', 'dkernels', 'dtokens'), actual, expected):
        assert relative_error(a, e) <= 1e-5, name
    if impl == 'triton':
        assert actual[0].flatten(2).transpose(1, 2).is_contiguous()
