"""Official ImageNet checkpoints through the tools: ``tools/test.py CONFIG OFFICIAL.pth`` loads them."""
import os.path as osp

import pytest
import torch

from tests.fixtures.paths import CONFIGS
from tests.fixtures.tools import load_tool, own_run

CONFIG_DIR = osp.join(CONFIGS, 'classification')
TOL = 1e-5


@pytest.mark.parametrize('family', ['pvt', 'swin'])
def test_tools_test_loads_official_checkpoint(golden, tiny_imagenet, tmp_path, family):
    """tools/test.py CONFIG OFFICIAL.pth: the Runner's load_from path (mmengine hands over the
    whole {'model': ..., 'config': ...} container) loads the official weights: official logits."""
    test_tool = load_tool('test')
    from mmpola.models.classifier import official_kwargs_to_classifier_kwargs
    expected, ckpt = golden[family]
    kwargs = official_kwargs_to_classifier_kwargs(expected['constructor'])
    config = tmp_path / 'mini.py'
    config.write_text(
        f"_base_ = [{osp.join(CONFIG_DIR, f'pola-{family}-t_8xb128_in1k.py')!r}]\n"
        f"model = dict(arch=dict(_delete_=True, **{kwargs.pop('arch')!r}), **{kwargs!r})\n"
        f"test_dataloader = dict(num_workers=0, persistent_workers=False, "
        f"dataset=dict(data_root={tiny_imagenet!r}))\n")
    args = test_tool.parse_args(own_run([str(config), ckpt, '--work-dir', str(tmp_path / 'work')]))
    runner = test_tool.build_runner(args)
    runner.load_or_resume()
    model = runner.model.eval()
    with torch.no_grad():
        logits = model(expected['input'], mode='tensor')
    assert (logits - expected['logits']).abs().max() <= TOL
