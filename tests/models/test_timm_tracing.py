"""timm's traced and feature-extraction checks (tests/test_models.py of the timm repository) for one
entry of each architecture and attention kind: forward_intermediates and features_only, torch.fx
tracing forward and backward, fx feature extraction at the ``feature_info`` modules; torch.compile
and torch.export of one entry of each architecture. The other entries of an architecture and kind
differ only in their sizes; test_timm_conventions.py checks every entry's API."""
import warnings

import pytest
import timm
import torch
from timm.models import FeatureInfo
from timm.models._features import FeatureGetterNet

from tests.fixtures.backbones import compiled_and_eager_steps
from tests.fixtures.timm_checks import (
    TARGET_FFEAT_SIZE,
    TARGET_FX_SIZE,
    check_maps,
    copy_entry,
    fx_model,
    input_size,
    one_per_architecture,
    representatives,
)


@pytest.fixture(scope='module', params=representatives())
def entry(request):
    """The entry built once with ``timm.create_model`` (eval mode); tests that change it copy it."""
    torch.manual_seed(0)
    return timm.create_model(request.param).eval()


def test_forward_intermediates_and_features_only(entry):
    """timm's test_model_forward_intermediates and test_model_forward_(intermediates_)features."""
    model = copy_entry(entry)
    info = FeatureInfo(model.feature_info, len(model.feature_info))
    assert len(info.channels()) >= 3
    assert info.reduction() == [model.backbone.stage_stride(i) for i in range(len(info.reduction()))]
    assert set(info.reduction()) <= {4, 8, 16, 32}
    size = input_size(model, TARGET_FFEAT_SIZE)
    x = torch.randn(1, *size)
    with torch.no_grad():
        final, maps = model.forward_intermediates(x, output_fmt='NCHW')
        check_maps(maps, info, size, 1)
        assert torch.allclose(final, model.forward_features(x))
        last_two = model.forward_intermediates(x, indices=2, stop_early=True, intermediates_only=True)
        assert [m.shape for m in last_two] == [m.shape for m in maps[-2:]]
        model.set_grad_checkpointing()
        assert torch.allclose(model.forward_intermediates(x)[0], final, rtol=1e-4, atol=1e-5)

    with torch.device('meta'):  # the entry's features_only model: timm's FeatureGetterNet, no classifier
        created = timm.create_model(model.pretrained_cfg['architecture'], features_only=True)
    assert isinstance(created, FeatureGetterNet)
    assert not any(k.startswith(('model.head.', 'model.norm.')) for k in created.state_dict())
    # the pyramid stages; a ViT's last block of each quarter (2, 5, 8, 11)
    assert list(created.out_indices) == list(model.backbone.default_out_indices(len(info.channels())))
    features = FeatureGetterNet(model, out_indices=created.out_indices).eval()  # the same on real weights
    assert features.feature_info.channels() == [info.channels()[i] for i in created.out_indices]
    assert features.feature_info.reduction() == [info.reduction()[i] for i in created.out_indices]
    with torch.no_grad():
        feature_maps = features(x)
    check_maps(feature_maps, features.feature_info, size, 1)
    assert all(torch.allclose(a, maps[i]) for a, i in zip(feature_maps, created.out_indices))


def test_fx_forward_matches_eager(entry):
    """timm's test_model_forward_fx: symbolic tracing with timm's leaf modules reproduces forward."""
    model = entry
    x = torch.randn(1, *input_size(model, TARGET_FX_SIZE))
    with torch.inference_mode():
        outputs = model(x)
        fx_outputs = torch.cat(tuple(fx_model(model)(x).values()))
    assert torch.equal(fx_outputs, outputs)


@pytest.mark.parametrize('name', one_per_architecture())
def test_torch_compile_traces_one_graph(name, monkeypatch):
    """torch.compile of the whole model (timm's ``--torchcompile``, mmengine's ``compile=True``) in training
    traces it as one graph (``fullgraph=True`` fails at a graph break), whose forward and backward are the
    model's: to rounding, as the graph's convolutions and softmax attention may take contiguous copies of the
    views that eager hands them (:func:`mmpola.ops.dispatch.unviewed_when_compiling`), whose kernels round
    otherwise. Tracing mmpola's code warns of nothing (such as a cached function, whose cache Dynamo skips)."""
    torch.manual_seed(0)
    model = timm.create_model(name).train()
    x = torch.randn(2, *input_size(model, TARGET_FX_SIZE))
    monkeypatch.setattr(torch._dynamo.utils, 'warn_once_cache', set(), raising=False)  # Dynamo warns once a process
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        (compiled, eager), (grads, eager_grads) = compiled_and_eager_steps(model, x, torch.sum, backend='eager',
                                                                           fullgraph=True)
    ours = [str(w.message) for w in caught if 'mmpola' in f'{w.filename} {w.message}']
    assert not ours, ours
    assert torch.allclose(compiled, eager, rtol=1e-5, atol=1e-5)
    assert grads.keys() == eager_grads.keys() == {name for name, _ in model.named_parameters()}
    # to rounding: within each gradient's scale (sums of another order; some gradients are near zero)
    assert all((grads[name] - eager_grads[name]).abs().max() <= 1e-5 * eager_grads[name].abs().max() + 1e-5
               for name in grads)


@pytest.mark.parametrize('name', one_per_architecture())
def test_torch_export_matches_eager(name):
    """torch.export (what deployment tools and torch's dynamo ONNX exporter trace with) under no_grad, as an
    export for inference runs: the model's caches of tensors made from its parameters and buffers (resized
    encodings, concatenated weights, RoPE tables) keep nothing while it records, and the exported program gives
    the model's logits."""
    torch.manual_seed(0)
    model = timm.create_model(name).eval()
    x = torch.randn(1, *input_size(model, TARGET_FX_SIZE))
    with torch.no_grad():
        exported = torch.export.export(model, (x, ))
        assert torch.allclose(exported.module()(x), model(x), rtol=1e-5, atol=1e-6)


def test_fx_features_of_feature_info_modules(entry):
    """timm's fx feature extraction (timm.models.create_feature_extractor): each ``feature_info``
    module names a traceable node with that stage's features ((B, H*W, C) tokens for the PVT / Swin /
    CSWin families, with the class token first for the ViT; NCHW maps for PolaFormer++, whose blocks
    work on maps)."""
    model = entry
    modules = [info['module'] for info in model.feature_info]
    for module in modules:
        model.get_submodule(module)
    extractor = timm.models.create_feature_extractor(model, modules + [model.pretrained_cfg['classifier']])
    x = torch.randn(1, *input_size(model, TARGET_FX_SIZE))
    prefix = model.backbone.num_prefix_tokens
    with torch.inference_mode():
        outputs = extractor(x)
        _, maps = model.forward_intermediates(x)
        logits = model(x)
    for module, stage_map in zip(modules, maps):
        node = outputs[module]
        if node.dim() == 3:
            node, stage_map = node[:, prefix:], stage_map.flatten(2).transpose(1, 2)
        assert torch.equal(node, stage_map), module
    # PolaFormer++'s head is a 1x1 conv on the pooled (B, P, 1, 1) map
    assert torch.equal(outputs[model.pretrained_cfg['classifier']].reshape(logits.shape), logits)


def test_fx_backward_reaches_every_parameter(entry):
    """timm's test_model_backward_fx."""
    model = copy_entry(entry, num_classes=42).train()
    num_params = sum(p.numel() for p in model.parameters())
    traced = fx_model(model, train=True)
    outputs = torch.cat(tuple(traced(torch.randn(2, *input_size(model, TARGET_FX_SIZE))).values()))
    outputs.mean().backward()
    missing = [n for n, p in traced.named_parameters() if p.grad is None]
    assert missing == [], f'no gradient for {missing}'
    assert sum(p.grad.numel() for p in traced.parameters()) == num_params
    assert outputs.shape[-1] == 42 and not torch.isnan(outputs).any()
