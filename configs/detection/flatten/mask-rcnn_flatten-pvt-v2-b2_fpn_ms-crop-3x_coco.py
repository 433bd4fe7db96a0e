# Mask R-CNN + FPN with FLatten-PVTv2-B2 on COCO 2017, 3x multi-scale-crop schedule (36 epochs, steps at 27
# and 33), 8 GPUs x 2 images: PVTv2-B2's 3x recipe (whai362/PVT
# detection/configs/mask_rcnn_pvt_v2_b2_fpn_3x_mstrain.py: AdamW lr 1e-4, weight decay 0.05 without
# decay on norms, position embeddings and relative position bias, 500 warm-up iterations, the
# DETR-style multi-scale + crop pipeline), which is mmdet's Swin-T 3x config apart from the warm-up.
# Every number and its source: docs/recipes.md.
# Backbone weights: checkpoints/flatten_pvt_v2_b2.pth (see mask-rcnn_flatten-pvt-v2-b2_fpn_1x_coco.py).
_base_ = [
    'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py',
    '../../_base_/models/flatten_pvt_v2_b2.py',
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
