"""A user's own attention kind: defined outside the package, registered with the documented
decorator, used from configs by the PVT and Swin architectures of real mmdet detectors (one
training step each), and the README's complete example, run as it is written."""
import os.path as osp
import re
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from mmpola.registry import ATTENTIONS
from tests.fixtures.detection import check_trains_one_step_and_predicts
from tests.fixtures.paths import REPO
from tests.fixtures.runs import DEMO_CONFIG

KIND = 'test_gated_linear'


@pytest.fixture(scope='module')
def user_kind():
    """A kind defined here, registered with ``@ATTENTIONS.register_module()``; removed afterwards."""

    @ATTENTIONS.register_module(name=KIND)
    class GatedLinearAttention(nn.Module):
        """ReLU-kernel linear attention with a learned output gate; ``gate_init``: its option."""

        def __init__(self, dim, num_heads, qkv_bias=True, proj_drop=0., gate_init=0.5):
            super().__init__()
            self.num_heads = num_heads
            self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
            self.gate = nn.Parameter(torch.full((dim,), float(gate_init)))
            self.proj = nn.Sequential(nn.Linear(dim, dim), nn.Dropout(proj_drop))
            self.calls = 0

        def forward(self, x, hw, **context):
            self.calls += 1
            B, N, C = x.shape
            assert N == hw[0] * hw[1]
            q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
            q, k = F.relu(q) + 1e-3, F.relu(k) + 1e-3
            out = q @ (k.transpose(-2, -1) @ v) / (q @ k.sum(2, keepdim=True).transpose(-2, -1))
            return self.proj(out.transpose(1, 2).reshape(B, N, C) * self.gate)

    yield GatedLinearAttention
    ATTENTIONS.module_dict.pop(KIND)


def _detector_config(tmp_path, name, backbone, channels):
    """The demo Mask R-CNN (small heads) with ``backbone`` (a tiny arch) swapped in, as a config file."""
    path = tmp_path / f'{name}.py'
    path.write_text(f'_base_ = [{DEMO_CONFIG!r}]\n'
                    f'model = dict(backbone=dict(_delete_=True, **{backbone!r}),\n'
                    f'             neck=dict(in_channels={channels!r}))\n')
    return str(path)


@pytest.mark.downstream
@pytest.mark.parametrize('backbone,channels', [
    (dict(type='PVTBackbone', arch=dict(embed_dims=[16, 32, 48, 64], num_heads=[1, 2, 3, 4], mlp_ratios=[2, 2, 2, 2],
                                        depths=[1, 1, 1, 1]), attn=dict(type=KIND, gate_init=0.25), attn_type='LLLS'),
     [16, 32, 48, 64]),
    (dict(type='SwinBackbone', arch=dict(embed_dims=16, depths=[1, 2, 1, 2], num_heads=[1, 2, 4, 8]),
          attn=dict(type=KIND, gate_init=0.25), attn_type='LLSS'), [16, 32, 64, 128]),
], ids=['pvt', 'swin'])
def test_detector_with_a_user_kind_trains_one_step(user_kind, tmp_path, backbone, channels):
    _, model, _ = check_trains_one_step_and_predicts(_detector_config(tmp_path, backbone['type'], backbone, channels))
    attns = [m for m in model.backbone.modules() if isinstance(m, user_kind)]
    assert attns and all(m.calls >= 2 for m in attns)  # the training step and the prediction
    assert all(torch.allclose(m.gate.detach(), torch.tensor(0.25), atol=0.05) for m in attns)  # its option
    assert {type(m).__name__ for m in model.backbone.modules()} & {'SpatialReductionAttention', 'WindowAttention'}


def test_user_kind_options_are_checked(user_kind):
    from mmpola.models import PVTBackbone
    arch = dict(embed_dims=[16, 32, 48, 64], num_heads=[1, 2, 3, 4], mlp_ratios=[2, 2, 2, 2], depths=[1, 1, 1, 1])
    with pytest.raises(ValueError, match=rf"{KIND}'\) has no option 'alpha'; its options: gate_init=0.5"):
        PVTBackbone(arch=arch, attn=dict(type=KIND, alpha=4.0))


def _readme_example():
    """The two python blocks of the README section on adding an attention kind."""
    with open(osp.join(REPO, 'README.md'), encoding='utf-8') as f:
        text = f.read()
    section = text.split('## Your own attention kind', 1)[1].split('\n## ', 1)[0]
    blocks = re.findall(r'```python\n(.*?)```', section, re.S)
    assert len(blocks) == 2, 'the README section shows the module file and the config'
    return blocks


def test_readme_example_runs_as_written(tmp_path, monkeypatch):
    from mmengine.config import Config
    from mmengine.registry import MODELS
    module, config = _readme_example()
    name = re.search(r'^# (\w+)\.py', module, re.M).group(1)
    (tmp_path / f'{name}.py').write_text(module)
    monkeypatch.syspath_prepend(str(tmp_path))
    kinds = set(ATTENTIONS.module_dict)
    try:
        cfg = Config.fromstring(config, '.py')  # custom_imports imports the user's file: it registers the kind
        new = set(ATTENTIONS.module_dict) - kinds
        assert len(new) == 1 and cfg.model.backbone.attn['type'] in new
        backbone = MODELS.build(cfg.model.backbone)
        outs = backbone(torch.randn(2, 3, 64, 96))
        sum(o.square().mean() for o in outs).backward()
        assert [o.shape[1] for o in outs] == backbone.embed_dims
        assert all(p.grad is not None for p in backbone.parameters())
    finally:
        for kind in set(ATTENTIONS.module_dict) - kinds:
            ATTENTIONS.module_dict.pop(kind)
        sys.modules.pop(name, None)
