"""Every detection config builds, computes its losses (with a backward pass) and predicts on a
small input; the recipes hold the numbers the configs promise (schedule, no-decay keys, init)."""
import copy
import glob
import os.path as osp

import mmdet  # noqa: E402,F401  (required: a broken install fails here)
import pytest
import torch

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DETECTION_CONFIGS = sorted(glob.glob(osp.join(REPO, 'configs', 'detection', '*_pola-*.py')))
DEMO_CONFIGS = sorted(glob.glob(osp.join(REPO, 'configs', 'demo', '*coco*.py')))
NO_DECAY_KEYS = {'norm', 'pos_embed', 'positional_encoding', 'relative_position_bias_table', 'attn.power',
                 'attn.scale'}


def _load(path):
    from mmengine.config import Config
    from mmengine.registry import init_default_scope

    import mmpola  # noqa: F401
    cfg = Config.fromfile(path)
    init_default_scope(cfg.default_scope)
    return cfg


def _build_detector(cfg):
    from mmdet.registry import MODELS
    model_cfg = copy.deepcopy(cfg.model)
    model_cfg.backbone.init_cfg = None  # tests never need the ImageNet checkpoint
    # one process: SyncBN (cascade box heads) becomes BN, as tools/train.py does
    from mmpola.engine import replace_sync_bn
    replace_sync_bn(model_cfg)
    model = MODELS.build(model_cfg)
    model.init_weights()
    return model


def _num_classes(cfg):
    head = cfg.model.get('bbox_head') or cfg.model.roi_head.bbox_head
    return (head[0] if isinstance(head, list) else head).num_classes


def _names(paths):
    return [osp.basename(p)[:-3] for p in paths]


def test_the_configs_the_issue_lists_exist():
    names = set(_names(DETECTION_CONFIGS))
    for algo, backbones, schedule in (
            ('retinanet', ('pvt-t', 'pvt-s', 'swin-t'), '1x'),
            ('mask-rcnn', ('pvt-t', 'pvt-s', 'swin-t', 'swin-s'), '1x'),
            ('mask-rcnn', ('pvt-s', 'swin-t', 'swin-s'), 'ms-crop-3x'),
            ('cascade-mask-rcnn', ('swin-t', 'swin-s'), 'ms-crop-3x')):
        for backbone in backbones:
            assert f'{algo}_pola-{backbone}_fpn_{schedule}_coco' in names


def check_trains_one_step_and_predicts(path):
    """Build the config's detector, one training step on one small image (sides not multiples of 32:
    the only thing shrunk) with a gradient for every parameter, then a prediction. Shared by the
    config tests of every backbone; returns (config, model, optim wrapper)."""
    from mmdet.testing import demo_mm_inputs
    from mmengine.optim import build_optim_wrapper

    cfg = _load(path)
    torch.manual_seed(0)
    model = _build_detector(cfg)
    with_mask = 'mask_head' in cfg.model.get('roi_head', {})
    data = demo_mm_inputs(1, [[3, 56, 72]], num_items=[3], num_classes=_num_classes(cfg), with_mask=with_mask)

    optim_wrapper = build_optim_wrapper(model, copy.deepcopy(cfg.optim_wrapper))
    model.train()
    batch = model.data_preprocessor(copy.deepcopy(data), True)
    losses = model(**batch, mode='loss')
    loss, log_vars = model.parse_losses(losses)
    assert torch.isfinite(loss), log_vars
    optim_wrapper.backward(loss)
    # every parameter takes part in the loss: multi-GPU training runs DDP without
    # find_unused_parameters (e.g. no output norm for a stage the FPN does not read)
    unused = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not unused, unused
    optim_wrapper.step()
    if with_mask:
        assert 'loss_mask' in log_vars or any(k.endswith('loss_mask') for k in log_vars)

    model.eval()
    with torch.no_grad():
        batch = model.data_preprocessor(copy.deepcopy(data), False)
        results = model(**batch, mode='predict')
    assert len(results) == 1
    pred = results[0].pred_instances
    assert pred.bboxes.shape[-1] == 4 and len(pred.scores) == len(pred.labels) == len(pred.bboxes)
    if with_mask:
        assert pred.masks.shape[1:] == (56, 72)
    return cfg, model, optim_wrapper


@pytest.mark.parametrize('path', DETECTION_CONFIGS + DEMO_CONFIGS, ids=_names(DETECTION_CONFIGS + DEMO_CONFIGS))
def test_config_trains_one_step_and_predicts(path):
    cfg, model, optim_wrapper = check_trains_one_step_and_predicts(path)
    # weight decay: none for norms, position parameters and Pola's power/scale logits; decayed
    # for everything else (e.g. every projection and conv weight)
    decay = cfg.optim_wrapper.optimizer.weight_decay
    params = dict(model.named_parameters())
    for group in optim_wrapper.optimizer.param_groups:
        for param in group['params']:
            name = next(n for n, p in params.items() if p is param)
            exempt = any(key in name for key in NO_DECAY_KEYS)
            assert group['weight_decay'] == (0 if exempt else decay), name
    names = params.keys()
    assert any(n.endswith('attn.power') for n in names) and any(n.endswith('attn.scale') for n in names)


@pytest.mark.parametrize('path', DETECTION_CONFIGS, ids=_names(DETECTION_CONFIGS))
def test_config_recipe(path):
    cfg = _load(path)
    name = osp.basename(path)
    backbone = cfg.model.backbone
    assert backbone.type in ('PolaPVT', 'PolaSwin')
    assert cfg.custom_imports.imports == ['mmpola']
    init = backbone.init_cfg
    assert init.type == 'Pretrained' and init.checkpoint.startswith('checkpoints/pola_')
    size = {'-t_': 'tiny', '-s_': 'small'}[next(k for k in ('-t_', '-s_') if k in name)]
    assert backbone.arch == size and init.checkpoint.endswith(f'_{size}.pth')

    optimizer = cfg.optim_wrapper.optimizer
    assert optimizer.type == 'AdamW' and optimizer.lr == 1e-4
    assert optimizer.weight_decay == (0.05 if backbone.type == 'PolaSwin' else 1e-4)
    assert NO_DECAY_KEYS <= set(cfg.optim_wrapper.paramwise_cfg.custom_keys)
    assert all(v == dict(decay_mult=0.) for v in cfg.optim_wrapper.paramwise_cfg.custom_keys.values())
    assert cfg.optim_wrapper.type == 'OptimWrapper'  # AMP with tools/train.py --amp
    assert cfg.auto_scale_lr == dict(enable=False, base_batch_size=16)
    assert cfg.train_dataloader.batch_size == 2

    warmup, steps = cfg.param_scheduler
    assert warmup.type == 'LinearLR' and not warmup.by_epoch
    assert steps.type == 'MultiStepLR'
    if '3x' in name:
        assert cfg.train_cfg.max_epochs == 36 and steps.milestones == [27, 33]
        assert 'RandomChoice' in [t.type for t in cfg.train_dataloader.dataset.pipeline]
    else:
        assert cfg.train_cfg.max_epochs == 12 and steps.milestones == [8, 11]
    low, high = {'tiny': (0.1, 0.2), 'small': (0.2, 0.3)}[size]
    assert low <= backbone.drop_path_rate <= high
    if name.startswith('cascade'):
        heads = cfg.model.roi_head.bbox_head
        assert len(heads) == 3 and all(h.type == 'Shared4Conv1FCBBoxHead' for h in heads)
        assert all(h.loss_bbox.type == 'GIoULoss' and h.reg_decoded_bbox for h in heads)
    channels = {'PolaPVT': [64, 128, 320, 512], 'PolaSwin': [96, 192, 384, 768]}[backbone.type]
    assert cfg.model.neck.in_channels == [channels[i] for i in backbone.out_indices]
