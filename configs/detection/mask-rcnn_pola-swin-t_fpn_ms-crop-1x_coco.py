# Mask R-CNN + FPN with Pola-Swin-T on COCO 2017, 1x schedule (12 epochs) with multi-scale training
# and random crops, 8 GPUs x 2 images: the Swin recipe (SwinTransformer/Swin-Transformer-Object-Detection
# configs/swin/mask_rcnn_swin_tiny_patch4_window7_mstrain_480-800_adamw_1x_coco.py), which the
# PolaFormer paper follows for its Swin backbones. Every number and its source: docs/recipes.md.
#
# Data pipeline and optimizer are mmdet's port of it (mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco: short
# side 480-800, or 400-600 then a 384x600 crop then 480-800, DETR style; AdamW lr 1e-4, weight decay
# 0.05 without decay on norms, absolute position embeddings and relative position bias tables); the
# schedule is Swin's 1x: 500 warm-up iterations, steps at epochs 8 and 11; drop path 0.1 as Swin-T 1x.
#
# Backbone weights: the ImageNet-1k Pola-Swin-T checkpoint at checkpoints/pola_swin_tiny.pth
# (official PolaFormer release or our own classification run). Without it, train from random
# initialisation with --cfg-options model.backbone.init_cfg=None.
_base_ = ['./_base_/mask-rcnn_fpn_ms-crop-3x.py', '../_base_/models/pola_swin_tiny.py']

# the shared Pola-Swin-T backbone moves into the model (pop: the dumped config holds it once)
model = dict(
    backbone=dict(_base_.pop('backbone'), _delete_=True, drop_path_rate=0.1),
    neck=dict(in_channels=_base_.pop('backbone_out_channels')))

# Swin's 1x schedule instead of the base's 3x
max_epochs = 12
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[8, 11], gamma=0.1),
]
