"""The PolaFormer++ segmentation configs (UperNet b2/b3, LightHamHead b2): each builds, trains one step on
the CPU (every parameter gets a gradient) and predicts at a size that is no multiple of the strides; the
recipes hold the official numbers."""
import glob
import os.path as osp

import pytest

from tests.fixtures.segmentation import REPO, check_trains_one_step_and_predicts, load_config

POLAPP_CONFIGS = sorted(glob.glob(osp.join(REPO, 'configs', 'segmentation', '*_polapp-*.py')))


def _names(paths):
    return [osp.basename(p)[:-3] for p in paths]


def test_the_listed_configs_exist():
    assert set(_names(POLAPP_CONFIGS)) == {
        'upernet_polapp-b2_8xb2-160k_ade20k-512x512', 'upernet_polapp-b3_8xb2-160k_ade20k-512x512',
        'segnext-ham_polapp-b2_2xb8-160k_ade20k-512x512'}


@pytest.mark.parametrize('path', POLAPP_CONFIGS, ids=_names(POLAPP_CONFIGS))
def test_config_trains_one_step_and_predicts(path):
    # predicted at the image's size (SegNeXt pads to 32 at test)
    check_trains_one_step_and_predicts(load_config(path), (64, 64), (96, 131))


@pytest.mark.parametrize('path', POLAPP_CONFIGS, ids=_names(POLAPP_CONFIGS))
def test_config_recipe(path):
    cfg = load_config(path)
    name = osp.basename(path)
    arch = 'b3' if '-b3_' in name else 'b2'
    backbone = cfg.model.backbone
    assert (backbone.type, backbone.arch) == ('PolaPP', arch)
    assert backbone.drop_path_rate == {'b2': 0.1, 'b3': 0.15}[arch]
    assert backbone.init_cfg == dict(type='Pretrained', checkpoint=f'checkpoints/polapp_{arch}.pth')
    channels = {'b2': [64, 128, 256, 512], 'b3': [64, 128, 320, 512]}[arch]
    head = cfg.model.decode_head
    out = [channels[i] for i in backbone.out_indices]
    optimizer = cfg.optim_wrapper.optimizer
    assert optimizer.type == 'AdamW' and optimizer.lr == 6e-5 and optimizer.weight_decay == 0.01
    keys = cfg.optim_wrapper.paramwise_cfg.custom_keys
    assert keys['norm'] == dict(decay_mult=0.)
    warmup, poly = cfg.param_scheduler
    assert (warmup.type, warmup.end, poly.type, poly.end, poly.power) == ('LinearLR', 1500, 'PolyLR', 160000, 1.0)
    assert cfg.train_cfg.max_iters == 160000
    if name.startswith('segnext-ham'):
        # official PolaPP-B2 config: LightHamHead on stages 2-4, 512 channels, NMF rank 16, GroupNorm,
        # 10x lr for the head; 8 images per GPU
        assert tuple(backbone.out_indices) == (1, 2, 3)
        assert head.type == 'LightHamHead' and head.in_channels == out == channels[1:]
        assert head.channels == head.ham_channels == 512 and head.ham_kwargs.MD_R == 16
        assert head.norm_cfg.type == 'GN' and keys['head'] == dict(lr_mult=10.)
        assert cfg.train_dataloader.batch_size == 8
    else:
        assert head.type == 'UPerHead' and head.in_channels == out == channels
        assert cfg.model.auxiliary_head.in_channels == channels[2]
        assert cfg.train_dataloader.batch_size == 2
