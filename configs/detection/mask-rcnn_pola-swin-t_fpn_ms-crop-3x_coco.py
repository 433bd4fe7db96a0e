# Mask R-CNN + FPN with Pola-Swin-T on COCO 2017, 3x schedule (36 epochs, steps at 27 and 33)
# with multi-scale training and random crops, 8 GPUs x 2 images.
#
# Everything but the backbone and the no-decay keys is mmdet's Swin-T 3x recipe
# (mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco: short side 480-800, or 400-600 then a
# 384-600 crop then 480-800, DETR style; AdamW lr 1e-4, weight decay 0.05, warm-up 1000 iterations).
#
# Backbone weights: checkpoints/pola_swin_tiny.pth (see mask-rcnn_pola-swin-t_fpn_1x_coco.py).
_base_ = [
    'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py',
    '../_base_/models/pola_swin_tiny.py',
    './_base_/coco_tta.py',
    '../_base_/runtime.py',
]
# mmpola's atomic checkpoint saves (configs/_base_/runtime.py says why this is set here)
default_hooks = dict(checkpoint=dict(type='mmpola.SafeCheckpointHook'))

# the shared Pola-Swin-T backbone (arch tiny, drop path 0.2, init from checkpoints/pola_swin_tiny.pth)
model = dict(
    backbone=dict(_delete_=True, **_base_.backbone),
    neck=dict(in_channels=_base_.backbone_out_channels))

# No weight decay on norms, position parameters, the relative position bias of the softmax
# stages and Pola's `attn.power` / `attn.scale` logits (the shared `backbone_no_decay_keys`).
optim_wrapper = dict(paramwise_cfg=dict(_delete_=True, custom_keys=_base_.backbone_no_decay_keys))

train_dataloader = dict(batch_size=2)
auto_scale_lr = dict(enable=False, base_batch_size=16)

# mmdet's CocoMetric, also for annotation files without `info`; `--tta`: flips at three scales
# (_base_/coco_tta.py)
tta_pipeline = _base_.tta_ms_pipeline
