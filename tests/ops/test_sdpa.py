"""mmpola.ops.sdpa: torch's scaled_dot_product_attention with cuDNN's attention left out on CUDA under 'auto'
(it builds a graph for every new input size), torch's own choice under MMPOLA_SDPA=torch, on other devices and
while a tracer records; the switch is set back after every call, also when the call raises, and a user's own
setting is kept."""
import pathlib

import pytest
import torch
import torch.nn.functional as F

from mmpola.ops import SDPA_IMPLS, scaled_dot_product_attention, sdpa_impl
from mmpola.ops.dispatch import AttnImplUnavailable

REPO = pathlib.Path(__file__).resolve().parents[2]


class _CudaClaiming(torch.Tensor):
    """A CPU tensor that says it is on CUDA: what the wrapper asks before it chooses (torch's function is
    replaced by a spy in these tests, so nothing runs on a device)."""

    @property
    def is_cuda(self):
        return True


@pytest.fixture
def cudnn_seen(monkeypatch):
    """Whether cuDNN's attention was enabled inside each F.scaled_dot_product_attention call."""
    seen = []
    original = F.scaled_dot_product_attention

    def spy(q, k, v, **kwargs):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        plain = (t.as_subclass(torch.Tensor) if isinstance(t, _CudaClaiming) else t for t in (q, k, v))
        return original(*plain, **kwargs)

    monkeypatch.setattr(F, 'scaled_dot_product_attention', spy)
    monkeypatch.delenv('MMPOLA_SDPA', raising=False)
    assert torch.backends.cuda.cudnn_sdp_enabled()
    yield seen
    assert torch.backends.cuda.cudnn_sdp_enabled()  # every test leaves torch's switch as it found it


def _operands(cuda=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 3, 10, 8, generator=g) for _ in range(3))
    mask = torch.randn(1, 3, 10, 10, generator=g)
    if cuda:
        q = q.as_subclass(_CudaClaiming)
    return q, k, v, mask


def test_on_the_cpu_it_is_torch_s_function_and_leaves_cudnn_alone(cudnn_seen):
    q, k, v, mask = _operands()
    out = scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3))
    assert cudnn_seen == [True, True]


@pytest.mark.parametrize('refuses', [True, False])
def test_bfloat16_on_a_cpu_whose_fused_kernel_refuses_it_runs_the_math_backend(monkeypatch, refuses):
    """Some torch builds fail every bfloat16 call of the fused CPU attention above a few dozen tokens (a CPU with
    AMX under a capped ATEN_CPU_CAPABILITY). One probe per process finds it; the calls then run torch's math
    backend, forward and backward, with the result torch's math backend gives; where the fused kernel runs, it
    runs. Here a stand-in for torch's function refuses (or not) as such a build does."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import mmpola.ops.sdpa as sdpa
    original, calls = F.scaled_dot_product_attention, []

    def stand_in(q, k, v, **kwargs):
        fused = torch.backends.cuda.flash_sdp_enabled()  # what sdpa_kernel(MATH) turns off, for the CPU too
        calls.append(fused)
        if refuses and fused and q.dtype == torch.bfloat16 and q.shape[-2] >= 64:
            raise RuntimeError('pack_vnni2 is only supported when avx512 is supported')
        with sdpa_kernel(SDPBackend.MATH):  # the values: the math backend's (this machine's may refuse itself)
            return original(q, k, v, **kwargs)

    monkeypatch.setattr(F, 'scaled_dot_product_attention', stand_in)
    monkeypatch.setattr(sdpa, '_CPU_BF16_FUSED', None)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 100, 16, generator=g).bfloat16().requires_grad_() for _ in range(3))
    state = torch.get_rng_state()
    with torch.inference_mode():  # the probe, asked here, runs its backward all the same
        scaled_dot_product_attention(q.detach(), k.detach(), v.detach())
    assert torch.equal(torch.get_rng_state(), state)  # nor does it draw from the process's generator
    for _ in range(2):
        out = scaled_dot_product_attention(q, k, v, scale=0.25)
        out.float().square().sum().backward()
    assert sdpa._CPU_BF16_FUSED is (not refuses)
    assert calls[0] and calls[1:] == [not refuses] * 3  # one probe, then each call
    with sdpa_kernel(SDPBackend.MATH):
        expected = original(q.detach(), k.detach(), v.detach(), scale=0.25)
    assert torch.equal(out.detach(), expected)
    grads = [t.grad for t in (q, k, v)]
    assert all(grad is not None and torch.isfinite(grad).all() for grad in grads)
    calls.clear()  # float32 inputs never ask
    scaled_dot_product_attention(*(t.detach().float() for t in (q, k, v)))
    assert calls == [True]


def test_auto_leaves_cudnn_out_on_cuda_tensors_and_sets_it_back(cudnn_seen):
    q, k, v, mask = _operands(cuda=True)
    out = scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, scale=0.3)
    plain = q.as_subclass(torch.Tensor)
    torch.testing.assert_close(out.as_subclass(torch.Tensor),
                               F.scaled_dot_product_attention(plain, k, v, attn_mask=mask, scale=0.3))
    assert cudnn_seen[0] is False and torch.backends.cuda.cudnn_sdp_enabled()


def test_torch_keeps_torch_s_choice_from_the_environment_or_the_argument(cudnn_seen, monkeypatch):
    q, k, v, _ = _operands(cuda=True)
    scaled_dot_product_attention(q, k, v, impl='torch')
    monkeypatch.setenv('MMPOLA_SDPA', ' Torch ')
    assert sdpa_impl() == 'torch'
    scaled_dot_product_attention(q, k, v)
    scaled_dot_product_attention(q, k, v, impl='auto')  # the argument over the environment
    assert cudnn_seen == [True, True, False]


def test_the_switch_is_set_back_when_the_call_raises(monkeypatch, cudnn_seen):
    q, k, v, _ = _operands(cuda=True)

    def failing(*args, **kwargs):
        cudnn_seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        raise RuntimeError('no kernel')

    monkeypatch.setattr(F, 'scaled_dot_product_attention', failing)
    with pytest.raises(RuntimeError, match='no kernel'):
        scaled_dot_product_attention(q, k, v)
    assert cudnn_seen == [False] and torch.backends.cuda.cudnn_sdp_enabled()


def test_a_user_who_turned_cudnn_off_keeps_it_off(cudnn_seen):
    q, k, v, _ = _operands(cuda=True)
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        scaled_dot_product_attention(q, k, v)
        scaled_dot_product_attention(q, k, v, impl='torch')
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(True)
    assert cudnn_seen == [False, False]


def test_while_a_tracer_records_torch_chooses(cudnn_seen, monkeypatch):
    """torch.compile / torch.export record torch's function into their graph, which chooses its backend when it
    runs: no process-wide switch is flipped while they trace."""
    q, k, v, _ = _operands(cuda=True)
    monkeypatch.setattr(torch.compiler, 'is_compiling', lambda: True)
    scaled_dot_product_attention(q, k, v)
    assert cudnn_seen == [True]


def test_an_unknown_implementation_is_one_clear_error(monkeypatch):
    q, k, v, _ = _operands(cuda=True)
    monkeypatch.setenv('MMPOLA_SDPA', 'cudnn')
    with pytest.raises(AttnImplUnavailable, match=r"MMPOLA_SDPA='cudnn' is not an implementation .* auto, torch"):
        scaled_dot_product_attention(q, k, v)
    with pytest.raises(ValueError, match='impl must be one of auto, torch'):
        scaled_dot_product_attention(q, k, v, impl='flash')
    assert SDPA_IMPLS == ('auto', 'torch')


def test_the_models_call_torch_s_attention_through_this_function_only():
    """One place chooses the backends: no other file of the package calls torch's function itself."""
    callers = [str(path.relative_to(REPO)) for path in (REPO / 'mmpola').rglob('*.py')
               if path.name != 'sdpa.py' and 'F.scaled_dot_product_attention(' in path.read_text()]
    assert callers == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA GPU')
@pytest.mark.parametrize('impl', ['auto', 'torch'])
@pytest.mark.parametrize('case', ['keys', 'masked'])
def test_on_a_gpu_auto_runs_a_backend_other_than_cudnn_s_and_both_agree(impl, case):
    """What torch would send to cuDNN's attention first on compute capability 9.0 / 10.0, under fp16: attention
    without a mask (PVT's spatial reduction, CSWin's stripes, PolaFormer++'s RoPE softmax in training: 80 queries,
    56 keys, head dim 64) and a Swin window's with its mask, which needs no gradient (evaluation: 49 tokens, head dim
    32). 'auto' runs no cuDNN attention (the backward's node names the forward's backend), and both implementations
    match the explicit formula in float32."""
    g = torch.Generator(device='cuda').manual_seed(0)
    n, m, d = (49, 49, 32) if case == 'masked' else (80, 56, 64)
    q = torch.randn(16, 3, n, d, device='cuda', generator=g).half().requires_grad_()
    k, v = (torch.randn(16, 3, m, d, device='cuda', generator=g).half().requires_grad_() for _ in range(2))
    mask = (torch.randn(1, 3, n, m, device='cuda', generator=g) * 3).half() if case == 'masked' else None
    out = scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=d ** -0.5, impl=impl)
    backend = type(out.grad_fn).__name__
    print(f'{case}, {impl}: {backend}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}')
    if impl == 'auto':
        assert 'Cudnn' not in backend, backend
    out.float().square().sum().backward()
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    scores = (leaves[0] @ leaves[1].transpose(-2, -1)) * d ** -0.5
    expected = (scores if mask is None else scores + mask.float()).softmax(-1) @ leaves[2]
    expected.square().sum().backward()
    torch.testing.assert_close(out.float(), expected, atol=2e-3, rtol=2e-3)
    for tensor, leaf in zip((q, k, v), leaves):
        torch.testing.assert_close(tensor.grad.float(), leaf.grad, atol=2e-2, rtol=2e-2)
