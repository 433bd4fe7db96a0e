# Mask R-CNN + FPN with PolaFormer++-B2 on COCO 2017, 3x multi-scale-crop schedule (36 epochs, steps at
# 27 and 33, 500 warm-up iterations), 8 GPUs x 2 images, as the official configs/PolaPP/maskrcnn_b2_3x.py:
# the Swin 3x pipeline (flip, then either a resize of the short side to 480..800 or a resize to 400..600, a
# 384x600 crop and a resize to 480..800), AdamW lr 1e-4, weight decay 0.05 without decay on norms,
# absolute position embeddings and relative position bias tables (fp16: tools/train.py --amp).
# The pipeline and optimizer are mmdet's Swin-T 3x config. Every number and its source: docs/recipes.md.
# Backbone weights: checkpoints/polapp_b2.pth.
_base_ = [
    'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py',
    '../_base_/models/polapp_b2.py',
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

model = dict(
    backbone=dict(_base_.pop('backbone'), _delete_=True, drop_path_rate=0.1),
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
