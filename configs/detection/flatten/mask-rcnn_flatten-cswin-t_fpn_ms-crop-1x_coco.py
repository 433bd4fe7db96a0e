# Mask R-CNN + FPN with FLatten-CSWin-T on COCO 2017, 1x schedule (12 epochs) with multi-scale training and
# random crops, 8 GPUs x 2 images. microsoft/CSWin-Transformer publishes no detection configs (its README
# reports Mask R-CNN 3x results, compared with Swin's), so this is Swin's Mask R-CNN recipe
# (SwinTransformer/Swin-Transformer-Object-Detection
# configs/swin/mask_rcnn_swin_tiny_patch4_window7_mstrain_480-800_adamw_1x_coco.py, the recipe of mmpola's
# ../mask-rcnn_pola-swin-t_fpn_ms-crop-1x_coco.py) with the CSWin-T backbone with the focused linear attention
# of FLatten Transformer (ICCV 2023) in stages 1-2, drop path 0.1 as Swin-T's; the backbone's output norms
# norm1..norm4 are the official dense CSWin's. Every number and its source: docs/recipes.md.
#
# Backbone weights: the official FLatten-CSWin-T ImageNet weights, downloaded from its release
# (mmpola/checkpoint/sources.py); offline: --cfg-options model.backbone.init_cfg.checkpoint=PATH.
_base_ = [
    'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py',
    '../../_base_/models/flatten_cswin_tiny.py',
    '../_base_/coco_tta_ms.py',
    '../../_base_/runtime.py',
]
# mmpola's atomic checkpoint saves (configs/_base_/runtime.py says why this is set here)
default_hooks = dict(checkpoint=dict(type='mmpola.SafeCheckpointHook'))
# test images in the form the model takes (3 channels, 0..255), also the arrays given to DetInferencer:
# mmpola's CheckImage right after loading (mmpola/datasets/transforms.py)
test_pipeline = [_base_.test_pipeline[0], dict(type='CheckImage'), *_base_.test_pipeline[1:]]
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader

_base_.pop('pretrained')  # mmdet's Swin checkpoint URL: not this model's weights

# the shared FLatten-CSWin-T backbone moves into the model (pop: the dumped config holds it once)
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
