"""Every segmentation config builds, computes its losses (with an optimizer step) and predicts,
also on ADE's typical non-multiple whole-image size 512x683; the recipes hold the numbers the
configs promise (schedule, no-decay keys, init, heads, test modes)."""
import copy
import glob
import os.path as osp

import mmseg  # noqa: E402,F401  (required: a broken install fails here)
import pytest
import torch

from tests.fixtures.segmentation import REPO, build_segmentor, load_config, seg_batch

SEG_CONFIGS = sorted(glob.glob(osp.join(REPO, 'configs', 'segmentation', 'upernet_pola-*.py')))
DEMO_CONFIG = osp.join(REPO, 'configs', 'demo', 'upernet_pola-swin-t_demo-ade-128x128.py')
NO_DECAY_KEYS = {'norm', 'pos_embed', 'positional_encoding', 'relative_position_bias_table', 'attn.power',
                 'attn.scale'}
SIZES = {'-t_': 'tiny', '-s_': 'small', '-b_': 'base'}
CHANNELS = {('PolaSwin', 'tiny'): [96, 192, 384, 768], ('PolaSwin', 'small'): [96, 192, 384, 768],
            ('PolaSwin', 'base'): [128, 256, 512, 1024], ('PolaPVT', 'tiny'): [64, 128, 320, 512],
            ('PolaPVT', 'small'): [64, 128, 320, 512]}


def _names(paths):
    return [osp.basename(p)[:-3] for p in paths]


def _size(name):
    return next(size for key, size in SIZES.items() if key in name)


def test_the_configs_the_issue_lists_exist():
    names = set(_names(SEG_CONFIGS))
    for backbone in ('swin-t', 'swin-s', 'swin-b', 'pvt-t', 'pvt-s'):
        assert f'upernet_pola-{backbone}_8xb2-160k_ade20k-512x512' in names


@pytest.mark.parametrize('path', SEG_CONFIGS, ids=_names(SEG_CONFIGS))
def test_config_recipe(path):
    cfg = load_config(path)
    name = osp.basename(path)
    size = _size(name)
    backbone = cfg.model.backbone
    assert cfg.custom_imports.imports == ['mmpola'] and cfg.default_scope == 'mmseg'
    assert backbone.type == ('PolaSwin' if 'swin' in name else 'PolaPVT') and backbone.arch == size
    assert backbone.init_cfg == dict(type='Pretrained', checkpoint=f'checkpoints/pola_'
                                     f'{"swin" if "swin" in name else "pvt"}_{size}.pth')

    # AdamW 6e-5 / 0.01 without decay on norms, position parameters and Pola's power/scale
    assert cfg.optim_wrapper.type == 'OptimWrapper'  # AMP with tools/train.py --amp
    optimizer = cfg.optim_wrapper.optimizer
    assert optimizer.type == 'AdamW' and optimizer.lr == 6e-5 and optimizer.weight_decay == 0.01
    custom_keys = cfg.optim_wrapper.paramwise_cfg.custom_keys
    assert set(custom_keys) == NO_DECAY_KEYS and all(v == dict(decay_mult=0.) for v in custom_keys.values())

    # linear warm-up for 1500 iterations, then poly (power 1) to 0 at 160k; 8 GPUs x 2 images
    warmup, poly = cfg.param_scheduler
    assert warmup.type == 'LinearLR' and (warmup.begin, warmup.end) == (0, 1500) and not warmup.by_epoch
    assert poly.type == 'PolyLR' and (poly.begin, poly.end) == (1500, 160000) and not poly.by_epoch
    assert poly.power == 1.0 and poly.eta_min == 0
    assert cfg.train_cfg.type == 'IterBasedTrainLoop' and cfg.train_cfg.max_iters == 160000
    assert cfg.train_dataloader.batch_size == 2 and cfg.auto_scale_lr.base_batch_size == 16

    # ADE20K 512x512 crops, UperNet + auxiliary FCN head (weight 0.4), SyncBN heads, whole test
    assert cfg.train_dataloader.dataset.type == 'ADE20KDataset'
    crop = next(t for t in cfg.train_dataloader.dataset.pipeline if t.type == 'RandomCrop')
    assert tuple(crop.crop_size) == (512, 512) and tuple(cfg.model.data_preprocessor.size) == (512, 512)
    channels = CHANNELS[(backbone.type, size)]
    head, aux = cfg.model.decode_head, cfg.model.auxiliary_head
    assert head.type == 'UPerHead' and head.in_channels == channels and head.num_classes == 150
    assert aux.type == 'FCNHead' and aux.in_channels == channels[aux.in_index] and aux.num_classes == 150
    assert aux.loss_decode.loss_weight == 0.4
    assert head.norm_cfg.type == aux.norm_cfg.type == 'SyncBN'
    assert cfg.model.test_cfg.mode == 'whole'
    assert cfg.val_evaluator.type == 'IoUMetric' and cfg.val_evaluator.iou_metrics == ['mIoU']

    # multi-scale + flip test option (mmseg's SegTTAModel over the ADE tta_pipeline)
    assert cfg.tta_model.type == 'SegTTAModel'
    assert any(t.type == 'TestTimeAug' for t in cfg.tta_pipeline)


def _predict_shape(name):
    # ADE's whole-image test size (short side 512, 4:3) for the tiny models; the same odd kind at
    # half the size for the larger ones (their UperNet head alone costs ~0.3 TFLOP at 512x683)
    return (512, 683) if '-t_' in name else (256, 341)


@pytest.mark.parametrize('path', SEG_CONFIGS + [DEMO_CONFIG], ids=_names(SEG_CONFIGS + [DEMO_CONFIG]))
def test_config_trains_one_step_and_predicts(path):
    from mmengine.optim import build_optim_wrapper

    cfg = load_config(path)
    torch.manual_seed(0)
    model = build_segmentor(cfg.model)
    num_classes = cfg.model.decode_head.num_classes

    # the only thing shrunk: the training input (two 32 x 64 crops instead of 512 x 512; the
    # UperNet head's 2048 -> 512 3x3 bottleneck costs ~9 GFLOP per 1000 stride-4 pixels)
    model.data_preprocessor.size = (32, 64)
    data = seg_batch([(32, 64), (32, 64)], num_classes)
    optim_wrapper = build_optim_wrapper(model, copy.deepcopy(cfg.optim_wrapper))
    model.train()
    batch = model.data_preprocessor(copy.deepcopy(data), True)
    losses = model(**batch, mode='loss')
    assert {'decode.loss_ce', 'aux.loss_ce'} <= set(losses)
    loss, log_vars = model.parse_losses(losses)
    assert torch.isfinite(loss), log_vars
    before = {n: p.detach().clone() for n, p in model.backbone.named_parameters()}
    optim_wrapper.update_params(loss)
    changed = [n for n, p in model.backbone.named_parameters() if not torch.equal(p, before[n])]
    assert any('attn.power' in n for n in changed) and any('patch_embed' in n for n in changed)

    # weight decay: none for norms, position parameters and Pola's power/scale logits
    decay = cfg.optim_wrapper.optimizer.weight_decay
    params = {id(p): n for n, p in model.named_parameters()}
    for group in optim_wrapper.optimizer.param_groups:
        for param in group['params']:
            name = params[id(param)]
            assert group['weight_decay'] == (0 if any(k in name for k in NO_DECAY_KEYS) else decay), name

    # whole-image prediction at a size that is no multiple of the backbone strides
    height, width = _predict_shape(osp.basename(path)) if path != DEMO_CONFIG else (128, 171)
    model.eval()
    with torch.no_grad():
        batch = model.data_preprocessor(seg_batch([(height, width)], num_classes), False)
        assert tuple(batch['inputs'].shape[-2:]) == (height, width)  # no padding at test time
        results = model(**batch, mode='predict')
    pred = results[0].pred_sem_seg.data
    assert pred.shape == (1, height, width)
    assert 0 <= int(pred.min()) and int(pred.max()) < num_classes
    assert results[0].seg_logits.data.shape == (num_classes, height, width)


def test_slide_inference_covers_non_multiple_sizes():
    """The documented sliding-window test (crop 512, stride 341 on ADE), scaled down."""
    cfg = load_config(DEMO_CONFIG)
    cfg.model.test_cfg = dict(mode='slide', crop_size=(64, 64), stride=(43, 43))
    torch.manual_seed(0)
    model = build_segmentor(cfg.model).eval()
    with torch.no_grad():
        batch = model.data_preprocessor(seg_batch([(128, 171)], 8), False)
        slide = model(**batch, mode='predict')[0]
    assert slide.pred_sem_seg.data.shape == (1, 128, 171)
