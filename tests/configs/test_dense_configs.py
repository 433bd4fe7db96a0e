"""Every released backbone has its dense configs, and every dense config's neck and heads take the widths
its backbone returns.

The released models are the presets of mmpola.models.backbones.PRESETS at each size of their architecture
that has a timm entry (the sizes whose ImageNet models a release trained; the 384 fine-tunes share the
dense configs of their 224 model). Each needs a Mask R-CNN 1x config on COCO and a segmentation config on
ADE20K. The widths are checked on the loaded config and the backbone built on the meta device (no weights,
no forward), one build per backbone setting."""
import json
import os.path as osp

import pytest
import torch
from mmengine.registry import MODELS

from mmpola.models.backbones import PRESETS, backbone_class
from mmpola.models.timm_models import TIMM_ENTRIES
from tests.fixtures.recipes import load, shipped_configs

DENSE = [name for name in shipped_configs() if name.startswith(('detection', 'segmentation', 'demo'))
         and not name.startswith(osp.join('demo', 'pola-pvt_demo-imagenet'))]


def released_models():
    """(preset name, size) of every released backbone."""
    released = []
    for preset in PRESETS:
        sizes = backbone_class(preset.family, preset.attn).arch_settings
        trained = {e.arch for e in TIMM_ENTRIES.values() if (e.family, e.attn) == (preset.family, preset.attn)}
        released += [(preset.name, size) for size in sizes if size in trained and not size.endswith('_384')]
    return released


RELEASED = released_models()


def test_the_released_models_are_the_four_releases():
    """PolaFormer 7, FLatten 15, InLine 13, PolaFormer++ 6 (their README tables; docs/models.md)."""
    per_kind = {}
    for name, _ in RELEASED:
        kind = next(p.attn for p in PRESETS if p.name == name)
        per_kind[kind] = per_kind.get(kind, 0) + 1
    assert per_kind == {'pola': 7, 'flatten': 15, 'inline': 13, 'pacs': 6}


def _backbone_of(cfg):
    backbone = cfg.model.backbone
    cls = MODELS.get(backbone.type)
    return backbone.type, backbone.get('arch', next(iter(cls.arch_settings)))


def _is_mask_rcnn_1x(cfg):
    return cfg.model.type == 'MaskRCNN' and cfg.train_cfg.get('max_epochs') == 12


def test_every_released_model_has_a_mask_rcnn_1x_and_a_segmentation_config():
    detection, segmentation = set(), set()
    for name in DENSE:
        if name.startswith('demo'):
            continue
        cfg = load(name)
        if name.startswith('detection') and _is_mask_rcnn_1x(cfg):
            detection.add(_backbone_of(cfg))
        elif name.startswith('segmentation'):
            segmentation.add(_backbone_of(cfg))
    missing = [f'{model} {size}: ' + ' and '.join(task for task, have in (('Mask R-CNN 1x', detection),
                                                                            ('segmentation', segmentation))
                                                  if (model, size) not in have)
               for model, size in RELEASED if (model, size) not in detection & segmentation]
    assert not missing, 'released models without dense configs:\n' + '\n'.join(missing)


_OUT_CHANNELS = {}


def backbone_out_channels(backbone):
    """Channels of the maps the backbone returns (built on the meta device, once per setting)."""
    key = json.dumps(backbone, sort_keys=True, default=str)
    if key not in _OUT_CHANNELS:
        with torch.device('meta'):
            model = MODELS.build(dict(backbone, init_cfg=None))
        _OUT_CHANNELS[key] = list(model.out_channels)
    return _OUT_CHANNELS[key]


def _select(features, index):
    return [features[i] for i in index] if isinstance(index, (list, tuple)) else features[index]


def width_mismatches(cfg):
    """What of the neck and heads does not take the widths of the maps it is given."""
    model = cfg.model
    features = backbone_out_channels(model.backbone.to_dict())
    wrong = []

    def expect(what, stated, widths):
        stated = list(stated) if isinstance(stated, (list, tuple)) else stated
        if stated != widths:
            wrong.append(f'{what} is {stated}, the maps it takes have {widths}')

    neck = model.get('neck')
    if neck is not None:
        if neck.type == 'SimpleFeaturePyramid':
            c = features[-1]
            expect('neck.backbone_channel', neck.backbone_channel, c)
            expect('neck.in_channels', neck.in_channels, [c // 4, c // 2, c, c])
        else:  # FPN, MultiLevelNeck: one input per returned stage
            expect('neck.in_channels', neck.in_channels, features)
        features = [neck.out_channels] * neck.get('num_outs', len(features))
    for key in ('decode_head', 'auxiliary_head'):  # segmentors: each head reads in_index
        head = model.get(key)
        if head is not None:
            expect(f'{key}.in_channels', head.in_channels, _select(features, head.get('in_index', -1)))
    for key in ('rpn_head', 'bbox_head'):  # detectors: one width over all levels
        head = model.get(key)
        if head is not None:
            expect(f'{key}.in_channels', head.in_channels, features[0])
            assert len(set(features)) == 1
    return wrong


@pytest.mark.parametrize('name', DENSE)
def test_neck_and_heads_take_the_backbone_widths(name):
    wrong = width_mismatches(load(name))
    assert not wrong, f'{name}:\n' + '\n'.join(wrong)


def test_a_wrong_width_is_found():
    """The check itself: Pola-Swin-B's Mask R-CNN with Swin-T's widths in the neck."""
    cfg = load(osp.join('detection', 'mask-rcnn_pola-swin-b_fpn_ms-crop-1x_coco.py')).copy()
    cfg.model = cfg.model.copy()
    cfg.model.neck = dict(cfg.model.neck, in_channels=[96, 192, 384, 768])
    assert width_mismatches(cfg) == ['neck.in_channels is [96, 192, 384, 768], the maps it takes have '
                                     '[128, 256, 512, 1024]']


def test_training_images_are_loaded_by_the_decoding_check():
    """Every dense config's training data are loaded by LoadCheckedImage (a JPEG with a damaged body stops
    the run naming the file instead of being trained on as decoded); mmdet's and mmseg's inferencers look
    for LoadImageFromFile by name, so the test pipelines keep it."""
    from mmpola.runtime.preflight.datasets import leaf_datasets
    plain = []
    for name in DENSE:
        for dataset in leaf_datasets(load(name).train_dataloader.dataset):
            loader = dataset['pipeline'][0]['type']
            if loader != 'LoadCheckedImage':
                plain.append(f'{name}: {loader}')
    assert not plain, 'training pipelines that do not start with LoadCheckedImage:\n' + '\n'.join(plain)
