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
_base_ = [
    'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py',
    '../_base_/models/pola_swin_tiny.py',
    './_base_/coco_tta_ms.py',
    '../_base_/runtime.py',
]
# mmpola's atomic checkpoint saves (configs/_base_/runtime.py says why this is set here)
default_hooks = dict(checkpoint=dict(type='mmpola.SafeCheckpointHook'))
# test images in the form the model takes (3 channels, 0..255), also the arrays given to DetInferencer:
# mmpola's CheckImage right after loading (mmpola/datasets/transforms.py)
test_pipeline = [_base_.test_pipeline[0], dict(type='CheckImage'), *_base_.test_pipeline[1:]]
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader

_base_.pop('pretrained')  # mmdet's Swin checkpoint URL: not this model's weights

# the shared Pola-Swin-T backbone moves into the model (pop: the dumped config holds it once)
model = dict(
    backbone=dict(_base_.pop('backbone'), _delete_=True, drop_path_rate=0.1),
    neck=dict(in_channels=_base_.pop('backbone_out_channels')))

max_epochs = 12
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[8, 11], gamma=0.1),
]

# 8 GPUs x 2 images; --auto-scale-lr rescales the lr for another total batch size.
# training images loaded by mmpola's LoadCheckedImage: mmcv's LoadImageFromFile that refuses a JPEG whose
# body is damaged, naming the file (mmpola/datasets/decoding.py)
train_pipeline = [dict(_base_.train_pipeline[0], type='LoadCheckedImage'), *_base_.train_pipeline[1:]]
train_dataloader = dict(batch_size=2, dataset=dict(pipeline=train_pipeline))
auto_scale_lr = dict(enable=False, base_batch_size=16)

# `--tta`: flips at three scales
# (_base_/coco_tta_ms.py)
