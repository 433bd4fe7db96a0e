# Mask R-CNN + FPN on COCO 2017, the Swin 3x multi-scale-crop recipe (36 epochs, steps at 27 and 33, flip
# then either a resize of the short side to 480..800 or a resize to 400..600, a 384x600 crop and a resize to
# 480..800; AdamW lr 1e-4, weight decay 0.05 without decay on norms, absolute position embeddings and
# relative position bias tables), 8 GPUs x 2 images: mmdet's mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco
# with Swin's 500 warm-up iterations (mmdet's port has 1000), mmpola's run-time hooks and checks, and
# `--tta` as flips at three scales (coco_tta_ms.py). Every number and its source: docs/recipes.md.
#
# For any backbone: a task config inherits this file next to a backbone base and moves the backbone into the
# model (the drop path rate is the recipe's of that backbone):
#
#   _base_ = ['./_base_/mask-rcnn_fpn_ms-crop-3x.py', '../_base_/models/pola_swin_tiny.py']
#   model = dict(backbone=dict(_base_.pop('backbone'), _delete_=True, drop_path_rate=0.2),
#                neck=dict(in_channels=_base_.pop('backbone_out_channels')))
_base_ = [
    'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py',
    './coco_tta_ms.py',
    '../../_base_/runtime.py',
]
# mmpola's atomic checkpoint saves (configs/_base_/runtime.py says why this is set here)
default_hooks = dict(checkpoint=dict(type='mmpola.SafeCheckpointHook'))
# test images in the form the model takes (3 channels, 0..255), also the arrays given to DetInferencer:
# mmpola's CheckImage right after loading (mmpola/datasets/transforms.py)
test_pipeline = [_base_.test_pipeline[0], dict(type='CheckImage'), *_base_.test_pipeline[1:]]
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader

# mmdet's Swin recipe gives every parameter an optimizer group of its own (its paramwise_cfg); this
# constructor merges those of equal options: the same updates in a few groups (mmpola.runtime.param_groups)
optim_wrapper = dict(constructor='mmpola.MergedGroupsOptimWrapperConstructor',
                     optimizer=dict(fused=True))  # AdamW's fused step (docs/recipes.md)

_base_.pop('pretrained')  # mmdet's Swin checkpoint URL: not the task config's weights

param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=36, by_epoch=True, milestones=[27, 33], gamma=0.1),
]

# training images loaded by mmpola's LoadCheckedImage: mmcv's LoadImageFromFile that refuses a JPEG whose
# body is damaged, naming the file (mmpola/datasets/decoding.py)
train_pipeline = [dict(_base_.train_pipeline[0], type='LoadCheckedImage'), *_base_.train_pipeline[1:]]
# 8 GPUs x 2 images; --auto-scale-lr rescales the lr for another total batch size.
train_dataloader = dict(batch_size=2, dataset=dict(pipeline=train_pipeline))
auto_scale_lr = dict(enable=False, base_batch_size=16)
