# Mask R-CNN + FPN with Pola-Swin-T on COCO 2017, 1x schedule (12 epochs), 8 GPUs x 2 images.
#
# Everything but the backbone and the no-decay keys is mmdet's Swin-T recipe
# (mask-rcnn_swin-t-p4-w7_fpn_1x_coco: AdamW lr 1e-4, weight decay 0.05, warm-up 1000
# iterations, steps at epochs 8 and 11, 1333x800 + flip).
#
# Backbone weights: the ImageNet-1k Pola-Swin-T checkpoint at checkpoints/pola_swin_tiny.pth
# (official PolaFormer release or our own classification run). Without it, train from random
# initialisation with --cfg-options model.backbone.init_cfg=None.
_base_ = [
    'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py',
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

# mmdet's CocoMetric, also for annotation files without `info`; `--tta`: horizontal flip
# (_base_/coco_tta.py)
