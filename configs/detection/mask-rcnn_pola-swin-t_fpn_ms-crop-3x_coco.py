# Mask R-CNN + FPN with Pola-Swin-T on COCO 2017, 3x schedule (36 epochs, steps at 27 and 33) with
# multi-scale training and random crops, 8 GPUs x 2 images: the Swin recipe
# (Swin-Transformer-Object-Detection configs/swin/mask_rcnn_swin_tiny_patch4_window7_mstrain_480-800_adamw_3x_coco.py),
# as ported by mmdet (mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco) with Swin's 500 warm-up iterations
# (mmdet's port has 1000). Every number and its source: docs/recipes.md.
#
# Backbone weights: checkpoints/pola_swin_tiny.pth (see mask-rcnn_pola-swin-t_fpn_ms-crop-1x_coco.py).
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
    backbone=dict(_base_.pop('backbone'), _delete_=True, drop_path_rate=0.2),
    neck=dict(in_channels=_base_.pop('backbone_out_channels')))

param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=36, by_epoch=True, milestones=[27, 33], gamma=0.1),
]

# training images loaded by mmpola's LoadCheckedImage: mmcv's LoadImageFromFile that refuses a JPEG whose
# body is damaged, naming the file (mmpola/datasets/decoding.py)
train_pipeline = [dict(_base_.train_pipeline[0], type='LoadCheckedImage'), *_base_.train_pipeline[1:]]
train_dataloader = dict(batch_size=2, dataset=dict(pipeline=train_pipeline))
auto_scale_lr = dict(enable=False, base_batch_size=16)

# `--tta`: flips at three scales
# (_base_/coco_tta_ms.py)
