# RetinaNet + FPN with Pola-Swin-T on COCO 2017, 1x schedule (12 epochs), 8 GPUs x 2 images.
#
# Detector and data are mmdet's Swin-T RetinaNet (retinanet_swin-t-p4-w7_fpn_1x_coco): the
# backbone returns stages 2-4 only (Swin's per-output norms would leave an unused stage-1 norm
# under DDP otherwise), FPN starts at level 0 and adds two extra levels. The optimizer is the Swin
# recipe of our Mask R-CNN configs (AdamW lr 1e-4, weight decay 0.05, warm-up 1000 iterations)
# instead of that config's SGD.
#
# Backbone weights: checkpoints/pola_swin_tiny.pth (see mask-rcnn_pola-swin-t_fpn_1x_coco.py).
_base_ = [
    'mmdet::swin/retinanet_swin-t-p4-w7_fpn_1x_coco.py',
    '../_base_/models/pola_swin_tiny.py',
    './_base_/coco_tta.py',
    '../_base_/runtime.py',
]
# mmpola's atomic checkpoint saves (configs/_base_/runtime.py says why this is set here)
default_hooks = dict(checkpoint=dict(type='mmpola.SafeCheckpointHook'))

model = dict(
    backbone=dict(_base_.backbone, _delete_=True, out_indices=(1, 2, 3)),
    neck=dict(in_channels=_base_.backbone_out_channels[1:], start_level=0, num_outs=5))

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(custom_keys=_base_.backbone_no_decay_keys))

max_epochs = 12
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[8, 11], gamma=0.1),
]

train_dataloader = dict(batch_size=2)
auto_scale_lr = dict(enable=False, base_batch_size=16)

# mmdet's CocoMetric, also for annotation files without `info`; `--tta`: horizontal flip
# (_base_/coco_tta.py)
