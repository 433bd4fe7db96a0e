# Mask R-CNN + FPN with Pola-PVT-T on COCO 2017, 1x schedule (12 epochs), 8 GPUs x 2 images.
#
# Detector, data pipeline (1333x800, flip), schedule and runtime are mmdet's
# mask-rcnn_r50_fpn_1x_coco; the optimizer follows mmdet's PVT recipe (AdamW, lr 1e-4,
# weight decay 1e-4) with a linear warm-up of 1000 iterations.
#
# Backbone weights: the ImageNet-1k Pola-PVT-T checkpoint at checkpoints/pola_pvt_tiny.pth
# (official PolaFormer release or our own classification run; the backbone's loader reads the
# official {'model': ...} container and mmengine checkpoints). Without it, train from random
# initialisation with --cfg-options model.backbone.init_cfg=None.
_base_ = [
    'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py',
    '../_base_/models/pola_pvt_tiny.py',
    './_base_/coco_tta.py',
    '../_base_/runtime.py',
]
# mmpola's atomic checkpoint saves (configs/_base_/runtime.py says why this is set here)
default_hooks = dict(checkpoint=dict(type='mmpola.SafeCheckpointHook'))

# the shared Pola-PVT-T backbone (arch tiny, drop path 0.1, init from checkpoints/pola_pvt_tiny.pth)
model = dict(
    backbone=dict(_delete_=True, **_base_.backbone),
    neck=dict(in_channels=_base_.backbone_out_channels))

# AdamW; no weight decay on norms, position parameters (PVT `pos_embed{i}`, Pola
# `positional_encoding`), Swin's relative position bias, and Pola's per-channel exponent
# (`attn.power`) and temperature (`attn.scale`) logits: the shared `backbone_no_decay_keys`
# (mmengine matches them as substrings of parameter names; 'attn.power' / 'attn.scale' match
# nothing else).
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=1e-4),
    paramwise_cfg=dict(custom_keys=_base_.backbone_no_decay_keys))

max_epochs = 12
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[8, 11], gamma=0.1),
]

# 8 GPUs x 2 images; --auto-scale-lr rescales the lr for another total batch size.
train_dataloader = dict(batch_size=2)
auto_scale_lr = dict(enable=False, base_batch_size=16)

# mmdet's CocoMetric, also for annotation files without `info`; `--tta`: horizontal flip
# (_base_/coco_tta.py)
