"""The dense forward (docs/design.md, "Dense forward") of the PVT and Swin architectures (presets PolaPVT /
PolaSwin): any input size, gradients, freezing, checkpointing, output norms, the attention's resized
positional encoding, registries, argument errors, bf16 autocast. What one architecture alone does is in
its own file (test_pvt.py, test_swin.py); the other architectures' dense contract is in test_base.py."""
import copy
import importlib

import pytest
import torch

from mmpola.models import FLattenCSWin, FLattenPVT, PolaAttention, PolaPVT, PolaSwin, PVTBackbone
from tests.fixtures.backbones import TINY_CSWIN, TINY_PVT, TINY_SWIN, compiled_and_eager_steps, expected_stage_sizes
from tests.fixtures.ops import saved_for_backward

SIZES = [(800, 1216), (513, 677), (64, 64), (32, 480)]


@pytest.fixture(scope='module')
def loaded_minis(golden, mini_kwargs):
    """The golden mini backbones with the official weights, in eval mode."""
    models = {}
    for family, cls in (('pvt', PolaPVT), ('swin', PolaSwin)):
        expected, ckpt = golden[family]
        model = cls(**mini_kwargs(family, expected['constructor']),
                    init_cfg=dict(type='Pretrained', checkpoint=ckpt))
        model.init_weights()
        models[family] = model.eval()
    return models


@pytest.mark.parametrize('size', SIZES, ids=lambda s: f'{s[0]}x{s[1]}')
@pytest.mark.parametrize('family', ['pvt', 'swin'])
def test_any_input_size(loaded_minis, family, size):
    model = loaded_minis[family]
    with torch.no_grad():
        outs = model(torch.randn(1, 3, *size))
    assert len(outs) == 4
    for out, channels, hw in zip(outs, model.embed_dims, expected_stage_sizes(family, *size)):
        assert out.shape == (1, channels, *hw)
        assert out.is_contiguous()
        assert torch.isfinite(out).all()


def test_ade_whole_image_sizes_spec_example():
    """ADE20K whole-image test sizes: 512x683 -> PVT 128x170, 64x85, 32x42, 16x21; Swin 128x171, 64x86, 32x43, 16x22."""
    assert expected_stage_sizes('pvt', 512, 683) == [(128, 170), (64, 85), (32, 42), (16, 21)]
    assert expected_stage_sizes('swin', 512, 683) == [(128, 171), (64, 86), (32, 43), (16, 22)]
    model = PolaSwin(arch=TINY_SWIN).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 512, 683))
    assert [tuple(o.shape[-2:]) for o in outs] == expected_stage_sizes('swin', 512, 683)


@pytest.mark.parametrize('cls,arch', [(PolaPVT, TINY_PVT), (PolaSwin, TINY_SWIN)])
def test_backward_reaches_every_parameter(cls, arch):
    model = cls(arch=arch, drop_path_rate=0.1)
    model.train()
    outs = model(torch.randn(2, 3, 64, 96))
    sum(o.float().pow(2).mean() for o in outs).backward()
    no_grad = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not no_grad, f'parameters without gradient (DDP would fail): {no_grad}'
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize('cls,arch,frozen,frozen_names,trainable_names', [
    (PolaPVT, TINY_PVT, 0, ['patch_embed1.proj.weight', 'pos_embed1'], ['block1.0.attn.qg.weight']),
    (PolaPVT, TINY_PVT, 2, ['pos_embed2', 'block2.0.attn.power', 'patch_embed2.norm.weight'],
     ['patch_embed3.proj.weight', 'block3.0.mlp.fc1.weight']),
    (PolaSwin, TINY_SWIN, 1, ['patch_embed.proj.weight', 'layers.0.blocks.0.attn.qkvg.weight',
                              'layers.0.downsample.reduction.weight', 'norm0.weight'],
     ['layers.1.blocks.0.attn.positional_encoding', 'norm1.weight']),
])
def test_frozen_stages_survive_train_and_step(cls, arch, frozen, frozen_names, trainable_names):
    torch.manual_seed(0)  # stochastic depth of a batch of 1 may drop a whole block
    model = cls(arch=arch, frozen_stages=frozen, drop_path_rate=0.1)
    model.train()
    params = dict(model.named_parameters())
    before = {n: p.detach().clone() for n, p in params.items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)
    outs = model(torch.randn(1, 3, 64, 64))
    sum(o.pow(2).mean() for o in outs).backward()
    optimizer.step()
    for name in frozen_names:
        assert not params[name].requires_grad, name
        assert torch.equal(params[name], before[name]), name
    for name in trainable_names:
        assert not torch.equal(params[name], before[name]), name
    frozen_module = model.patch_embed1 if cls is PolaPVT else model.layers[0]
    assert not frozen_module.training  # stays in eval mode through train()


@pytest.mark.parametrize('recompute', ['torch', 'triton'])
def test_with_cp_gives_same_outputs_and_grads(recompute, monkeypatch):
    """Checkpointed blocks (recomputed in the backward) give the plain blocks' gradients, also with the linear
    layers that recompute their own input (MMPOLA_RECOMPUTE=triton; the kernels in the interpreter)."""
    monkeypatch.setenv('MMPOLA_RECOMPUTE', recompute)
    torch.manual_seed(0)
    plain = PolaSwin(arch=TINY_SWIN, drop_path_rate=0.)
    ckpt = copy.deepcopy(plain)
    ckpt.with_cp = True
    x = torch.randn(1, 3, 64, 64)
    for model in (plain, ckpt):
        model.train()
        sum(o.sum() for o in model(x)).backward()
    for (name, a), (_, b) in zip(plain.named_parameters(), ckpt.named_parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-5, rtol=1e-4), name
    pvt = PolaPVT(arch=TINY_PVT, with_cp=True)
    pvt.train()
    sum(o.sum() for o in pvt(torch.randn(1, 3, 64, 64))).backward()
    assert pvt.block4[0].attn.qg.weight.grad is not None


def _saved_and_grads(base, x, recompute, with_cp=False):
    """(bytes autograd keeps for the backward, parameter gradients) of a training step of a copy of ``base`` with
    ``recompute`` and ``with_cp`` set."""
    model = copy.deepcopy(base)
    model.recompute, model.with_cp = recompute, with_cp
    model.train()
    outs, saved = saved_for_backward(model, x)
    sum(o.sum() for o in outs).backward()
    return saved, [p.grad for p in model.parameters()]


def _assert_gradients_close(actual, expected):
    """Within 1e-5 + 1e-4 of the gradient's largest value: float32 sums over the whole network in another order
    (element-wise relative tolerances fail on the near-zero elements of such a sum, on some CPUs' kernels)."""
    error, scale = (actual - expected).abs().max().item(), expected.abs().max().item()
    assert error <= 1e-5 + 1e-4 * scale, (error, scale)


def test_a_backbone_s_recompute_argument_overrides_the_variable(monkeypatch):
    """``recompute='triton'`` in a config: the backbone's linear layers recompute their input (its forward keeps
    less for the backward) whatever MMPOLA_RECOMPUTE says, also in the forward that checkpointed blocks run again
    in the backward (the same gradients); ``recompute='torch'`` the other way round; ``'elementwise'`` keeps less
    than the library's layers and more than every kernel; anything else is a config error that names the choices
    (the kernels in the interpreter)."""
    from mmpola.models.checks import PolaConfigError
    torch.manual_seed(0)
    base = PolaPVT(arch=TINY_PVT, drop_path_rate=0.)
    x = torch.randn(1, 3, 64, 64)

    def run(recompute, with_cp=False):
        return _saved_and_grads(base, x, recompute, with_cp)

    monkeypatch.setenv('MMPOLA_RECOMPUTE', 'torch')
    plain_saved, plain_grads = run(None)
    for saved, grads in (run('triton'), run('triton', with_cp=True), run('elementwise')):
        for a, b in zip(grads, plain_grads):
            _assert_gradients_close(a, b)
    assert run('triton')[0] < run('elementwise')[0] < plain_saved
    monkeypatch.setenv('MMPOLA_RECOMPUTE', 'triton')
    assert run('torch')[0] == plain_saved and run(None)[0] == run('triton')[0]
    with pytest.raises(PolaConfigError, match="recompute must be one of 'auto', 'torch', 'triton', 'elementwise' or "
                       "None"):
        PolaPVT(arch=TINY_PVT, recompute='fused')


@pytest.mark.parametrize('cls, arch', [(PolaPVT, TINY_PVT), (PolaSwin, TINY_SWIN)], ids=['pvt', 'swin'])
def test_a_recompute_per_stage_chooses_for_each_stage(monkeypatch, cls, arch):
    """``recompute`` with one value per stage (a config's list): each stage runs its own choice, None following the
    variable; what the stages keep adds up (the first stage with the kernels and the rest with the library's
    layers, and the other way round, keep together what the two choices keep for the whole backbone), the
    gradients are the library's, also with checkpointed blocks; a list of another length is a config error that
    says how many stages there are (the kernels in the interpreter)."""
    from mmpola.models.checks import PolaConfigError
    monkeypatch.setenv('MMPOLA_RECOMPUTE', 'torch')
    torch.manual_seed(0)
    base = cls(arch=arch, drop_path_rate=0.)
    x = torch.randn(1, 3, 64, 64)
    plain_saved, plain_grads = _saved_and_grads(base, x, None)
    kernels_saved = _saved_and_grads(base, x, 'triton')[0]
    first, first_grads = _saved_and_grads(base, x, ['triton', None, None, None])
    rest = _saved_and_grads(base, x, (None, 'triton', 'triton', 'triton'))[0]
    assert kernels_saved < first < plain_saved and kernels_saved < rest < plain_saved
    assert first + rest == plain_saved + kernels_saved
    for grads in (first_grads, _saved_and_grads(base, x, ('triton', None, None, None), with_cp=True)[1]):
        for a, b in zip(grads, plain_grads):
            _assert_gradients_close(a, b)
    assert cls(arch=arch, recompute=['triton', None, 'elementwise', 'torch']).recompute == (
        'triton', None, 'elementwise', 'torch')
    with pytest.raises(PolaConfigError, match=r"recompute takes one value for the whole backbone or a list of one "
                       r"per stage \(4 here\), got \['triton', None\]"):
        cls(arch=arch, recompute=['triton', None])
    with pytest.raises(PolaConfigError, match="recompute must be one of"):
        cls(arch=arch, recompute=['triton', None, None, 'fused'])


def test_out_indices_and_out_norm():
    model = PolaPVT(arch=TINY_PVT, out_indices=(1, 3), out_norm=True).eval()
    assert model.out_channels == [32, 64]
    assert hasattr(model, 'norm1') and hasattr(model, 'norm3') and not hasattr(model, 'norm0')
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 64, 64))
    assert [o.shape[1] for o in outs] == [32, 64]
    swin = PolaSwin(arch=TINY_SWIN, out_indices=(0,)).eval()
    with torch.no_grad():
        (out,) = swin(torch.randn(1, 3, 64, 64))
    assert out.shape == (1, 16, 16, 16)


def test_positional_encoding_resize_and_eval_cache():
    model = PolaPVT(arch=TINY_PVT).eval()
    attn = model.block1[0].attn
    assert isinstance(attn, PolaAttention)
    with torch.no_grad():
        attn.positional_encoding.normal_()
        first = attn.resized_positional_encoding((20, 30))
        assert first.shape == (1, 600, 16)
        assert attn.resized_positional_encoding((20, 30)) is first  # cached in eval mode
        assert attn.resized_positional_encoding((56, 56)) is attn.positional_encoding  # identity
        attn.positional_encoding.add_(1.0)  # e.g. load_state_dict: the cache must not go stale
        second = attn.resized_positional_encoding((20, 30))
    assert not torch.equal(first, second)
    with torch.no_grad():  # the keys' bias under autocast: the cast is cached with the resize, or alone
        half = attn.key_bias((20, 30), torch.bfloat16)
        assert half.dtype == torch.bfloat16 and torch.equal(half, second.to(torch.bfloat16))
        assert attn.key_bias((20, 30), torch.bfloat16) is half
        assert attn.key_bias((20, 30), torch.float32) is not half
        unresized = attn.key_bias((56, 56), torch.bfloat16)
        assert unresized.dtype == torch.bfloat16 and attn.key_bias((56, 56), torch.bfloat16) is unresized
    model.train()
    a = attn.resized_positional_encoding((20, 30))
    assert a.requires_grad and a is not attn.resized_positional_encoding((20, 30))
    b = attn.key_bias((20, 30), torch.bfloat16)
    assert b.requires_grad and b.dtype == torch.bfloat16 and b is not attn.key_bias((20, 30), torch.bfloat16)


@pytest.mark.parametrize('kwargs,match', [
    (dict(arch='huge'), "unknown arch 'huge'.*tiny, small"),
    (dict(arch=dict(embed_dims=[1])), 'needs exactly the keys'),
    (dict(out_indices=(0, 4)), 'out of range.*0..3'),
    (dict(frozen_stages=5), 'beyond the depth'),
    (dict(attn_type='LLXL'), 'attn_type'),
])
@pytest.mark.parametrize('cls', [PolaPVT, PolaSwin])
def test_constructor_errors(cls, kwargs, match):
    if cls is PolaSwin and kwargs.get('attn_type') == 'LLXL':
        match = 'L, S or M'
    with torch.device('meta'), pytest.raises(ValueError, match=match):
        cls(**kwargs)


@pytest.mark.parametrize('cls,arch', [(PolaPVT, TINY_PVT), (PolaSwin, TINY_SWIN)])
def test_input_errors(cls, arch):
    model = cls(arch=arch).eval()
    with pytest.raises(ValueError, match=r'input size 31x64 is smaller than the minimum 32x32'):
        model(torch.randn(1, 3, 31, 64))
    with pytest.raises(ValueError, match='4-D'):
        model(torch.randn(3, 64, 64))
    with pytest.raises(ValueError, match='3 input channels, got 1'):
        model(torch.randn(1, 1, 64, 64))


def test_init_without_checkpoint_keeps_official_init():
    model = PolaSwin(arch=TINY_SWIN)
    model.init_weights()
    attn = model.layers[0].blocks[0].attn
    assert torch.count_nonzero(attn.power) == 0 and torch.count_nonzero(attn.scale) == 0
    assert torch.count_nonzero(attn.positional_encoding) == 0
    assert model.layers[2].blocks[0].attn.relative_position_bias_table.std() > 0


def _registry_build(registry_module, cls_name, arch):
    registry = importlib.import_module(registry_module).MODELS
    model = registry.build(dict(type=cls_name, arch=arch))
    assert type(model).__name__ == cls_name
    return model


@pytest.mark.downstream
@pytest.mark.parametrize('registry_module', ['mmdet.registry', 'mmseg.registry'])
@pytest.mark.parametrize('cls_name,arch', [('PolaPVT', TINY_PVT), ('PolaSwin', TINY_SWIN)])
def test_builds_from_downstream_registries(registry_module, cls_name, arch):
    _registry_build(registry_module, cls_name, arch)


def test_builds_from_mmengine_root_registry():
    from mmengine.registry import MODELS
    assert isinstance(MODELS.build(dict(type='PolaPVT', arch=TINY_PVT)), PolaPVT)
    assert isinstance(MODELS.build(dict(type='PolaSwin', arch=TINY_SWIN)), PolaSwin)


@pytest.mark.parametrize('cls,arch', [(PolaPVT, TINY_PVT), (PolaSwin, TINY_SWIN)])
def test_bf16_autocast_cpu(cls, arch):
    """Mixed precision (CPU autocast bf16; the GPU fp16 checks live with the ops): finite outputs
    and gradients close to fp32, the Pola core running in its fp32 island."""
    torch.manual_seed(0)
    model = cls(arch=arch, drop_path_rate=0.).train()
    x = torch.randn(1, 3, 64, 96)
    ref = model(x)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        outs = model(x)
    sum(o.float().square().mean() for o in outs).backward()
    for out, r in zip(outs, ref):
        assert torch.isfinite(out).all()
        assert (out.float() - r).abs().max() <= 0.1 * r.abs().max()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_inductor_compiles_a_training_step_at_a_second_image_size():
    """torch.compile (inductor) of a training step as mmengine's ``compile=True`` runs a detector: the first image
    size with its sizes as constants, the second with the side that changed symbolic. The token grid's sizes are
    the image's floor-divided by the patch size, possibly zero for all inductor's sort of a kept view's strides
    knows (``16 * (H // 4) < 16`` has no truth value), and compiling stopped with a TypeError at the softmax's
    queries, the spatial reduction's input map and the depthwise convolution of the heads' values (their maps
    as channels-last images), each a view that the backward keeps: copies while torch.compile records. The
    first two stages only (``out_indices=(1,)``: inductor compiles no more than it needs), a softmax stage, which
    has the first two, and a Pola stage of two heads, at batch 2; the second size's step is eager's."""
    torch.manual_seed(0)
    model = PVTBackbone(arch=TINY_PVT, attn_type='SLSS', attn=dict(type='pola'), out_indices=(1, )).train()
    # the height changes: the second size's graph has it symbolic
    ((compiled_out, ), (eager_out, )), (grads, eager_grads) = compiled_and_eager_steps(
        model, torch.randn(2, 3, 96, 96), lambda outs: outs[0].mean(), before=[torch.randn(2, 3, 64, 96)],
        fullgraph=True)
    assert torch.allclose(compiled_out, eager_out, rtol=1e-4, atol=1e-5)
    assert grads.keys() == eager_grads.keys()
    assert all((grads[name] - eager_grads[name]).abs().max() <= 1e-4 * eager_grads[name].abs().max() + 1e-6
               for name in grads)


# a model per way the dense forward pads and crops a map (what makes graphs of their own under torch.compile if
# the sizes decide it), the image sizes that give their maps padding on every side, on none and on one, and
# torch.compile's ``dynamic``: Swin's windows (a Pola stage, then the patch merging, then shifted softmax windows
# of 7), CSWin's stripes of 2 (a FLatten stage, then softmax stripes), PVT's first two stages with symbolic sizes
# from the first call (``dynamic=True``; Pola's projections concatenated, kept by nothing while recording; FLatten's
# feature map, an autograd Function, with its constant)
DYNAMIC_SIZE_MODELS = {
    'swin-windows': (lambda: PolaSwin(arch=dict(embed_dims=16, depths=[1, 2, 1, 1], num_heads=[1, 2, 4, 8]),
                                      attn_type='LSSS', out_indices=(1, )),
                     [(120, 176), (112, 168), (124, 180), (136, 112)], None),
    'cswin-stripes': (lambda: FLattenCSWin(arch=TINY_CSWIN, attn_type='LSSS', out_indices=(1, )),
                      [(92, 108), (84, 100), (88, 76), (76, 92), (100, 84)], None),
    'pvt-pola': (lambda: PolaPVT(arch=TINY_PVT, out_indices=(1, )), [(64, 96), (96, 64), (80, 112), (128, 160)],
                 True),
    'pvt-flatten': (lambda: FLattenPVT(arch=TINY_PVT, out_indices=(1, )), [(64, 96), (96, 64), (80, 112)], True),
}


@pytest.mark.parametrize('name', DYNAMIC_SIZE_MODELS)
def test_compiled_training_step_serves_new_image_sizes(name):
    """torch.compile of a training step as mmengine's ``compile=True`` runs a detector (``dynamic=None``): the
    first image size is compiled with its sizes as constants, the second with symbolic ones, and that graph
    serves every later size (with ``dynamic=True`` the first graph does). Nothing of the dense forward asks the
    sizes a question whose answer changes with them: whether a map needs padding to whole windows or stripes
    (while compiling it is always padded, by zero where it fits), whether the crop back cut anything (picked by
    index), a remainder (the padded sides are multiples), or whether a cache of the concatenated projections
    holds an entry (it is not read while recording). ``aot_eager`` traces the backward too, whose guards are the
    graph's. Outputs and gradients at the last size are eager's."""
    build, sizes, dynamic = DYNAMIC_SIZE_MODELS[name]
    torch.manual_seed(0)
    model = build().train()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.backends.debugging.aot_eager(gm, example_inputs)

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    symbolic_from = 0 if dynamic else 1  # the call whose graph has symbolic sizes
    for i, size in enumerate(sizes):
        x = torch.randn(2, 3, *size)
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        out, = compiled(x)
        out.square().mean().backward()
        if i == symbolic_from:
            serving = len(graphs)
        assert i <= symbolic_from or len(graphs) == serving, (size, len(graphs), serving)
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    eager, = model(x)
    eager.square().mean().backward()
    assert torch.allclose(out, eager, rtol=1e-5, atol=1e-6)
    assert grads.keys() == {n for n, p in model.named_parameters() if p.grad is not None}
    assert all((grads[n] - p.grad).abs().max() <= 1e-5 * p.grad.abs().max() + 1e-7
               for n, p in model.named_parameters() if p.grad is not None)


@pytest.mark.parametrize('evaluated', ['before the training forward', 'between backward and step'])
@pytest.mark.parametrize('fused,compiled', [(False, False), (True, False), (True, True)])
def test_evaluation_after_an_optimizer_step_uses_the_updated_weights(fused, compiled, evaluated):
    """What evaluation keeps of the parameters (the concatenated projections, the resized encodings) is not reused
    after an optimizer step, even where no training forward came between the evaluation and the step: the fused
    AdamW updates the parameters without changing their versions. Also with a training step compiled by
    torch.compile (mmengine's ``compile=True`` compiles the training step, not evaluation)."""
    torch.manual_seed(0)
    model = PolaPVT(arch=TINY_PVT)
    x = torch.randn(1, 3, 64, 96)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused)
    if evaluated == 'before the training forward':
        with torch.no_grad():
            model.eval()(x)  # fills the caches
    model.train()
    torch._dynamo.reset()
    step = torch.compile(model, backend='eager') if compiled else model
    sum(o.mean() for o in step(x)).backward()
    if evaluated == 'between backward and step':
        with torch.no_grad():
            model.eval()(x)
        model.train()
    optimizer.step()
    with torch.no_grad():
        kept = model.eval()(x)
        fresh = copy.deepcopy(model).eval()(x)  # a copy keeps nothing
    assert all(torch.equal(a, b) for a, b in zip(kept, fresh))


def test_a_compiled_training_step_reads_no_kept_tensors():
    """torch.compile's graph of a training step does not read what evaluation keeps (the concatenated projections'
    dictionary, weakly keyed): guards on its keys would fail once a key is collected, and would compile again."""
    torch.manual_seed(0)
    model = PolaPVT(arch=TINY_PVT)
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        model.eval()(x)  # fills the caches
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model.train())(x)
    names = [guard.name for guard in explained.out_guards]
    assert names and not any('_CONCATENATED' in name for name in names)
