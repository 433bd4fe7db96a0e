# Mask R-CNN with InLine-DeiT-S on COCO 2017, 1x schedule (12 epochs), 8 GPUs x 2 images. LeapLabTHU/InLine
# ships no detection for its DeiT models; mmpola's recipe: PVT's Mask R-CNN 1x (AdamW lr 2e-4, weight decay
# 1e-4 on every parameter, 500 warm-up iterations, steps at epochs 8 and 11, 1333x800 + flip, as
# ../mask-rcnn_pola-pvt-t_fpn_1x_coco.py), with ViTDet's simple feature pyramid (mmpola's
# SimpleFeaturePyramid) as the neck: the plain ViT returns stride-16 maps only, the neck makes strides 4-64
# of the last one. Drop path 0.1 as mmseg's DeiT-S UperNet. Every number and its source: docs/recipes.md.
#
# Backbone weights: the official InLine-DeiT-S ImageNet weights (at 288x288), downloaded from its release
# (mmpola/checkpoint/sources.py); offline: --cfg-options model.backbone.init_cfg.checkpoint=PATH.
_base_ = [
    'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py',
    '../../_base_/models/inline_deit_small.py',
    '../_base_/coco_tta.py',
    '../../_base_/runtime.py',
]
# mmpola's atomic checkpoint saves (configs/_base_/runtime.py says why this is set here)
default_hooks = dict(checkpoint=dict(type='mmpola.SafeCheckpointHook'))
# test images in the form the model takes (3 channels, 0..255), also the arrays given to DetInferencer:
# mmpola's CheckImage right after loading (mmpola/datasets/transforms.py)
test_pipeline = [_base_.test_pipeline[0], dict(type='CheckImage'), *_base_.test_pipeline[1:]]
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader

# the shared backbone moves into the model (pop: the dumped config holds it once); the neck reads the
# last map (320 channels) and makes four levels of 320 / 4, 320 / 2, 320 and 320 channels
width = _base_.pop('backbone_out_channels')[-1]
model = dict(
    backbone=dict(_base_.pop('backbone'), _delete_=True, drop_path_rate=0.1),
    neck=dict(_delete_=True, type='SimpleFeaturePyramid', backbone_channel=width,
              in_channels=[width // 4, width // 2, width, width], out_channels=256, num_outs=5))
del width  # a helper, not a setting of the run

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=2e-4, betas=(0.9, 0.999), weight_decay=1e-4, fused=True))

# 8 GPUs x 2 images; --auto-scale-lr rescales the lr for another total batch size.
# training images loaded by mmpola's LoadCheckedImage: mmcv's LoadImageFromFile that refuses a JPEG whose
# body is damaged, naming the file (mmpola/datasets/decoding.py)
train_pipeline = [dict(_base_.train_pipeline[0], type='LoadCheckedImage'), *_base_.train_pipeline[1:]]
train_dataloader = dict(batch_size=2, dataset=dict(pipeline=train_pipeline))
auto_scale_lr = dict(enable=False, base_batch_size=16)

# `--tta`: horizontal flip
# (_base_/coco_tta.py)
