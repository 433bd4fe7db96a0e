# Mask R-CNN + FPN with FLatten-PVTv2-B2 on COCO 2017, 1x schedule (12 epochs), 8 GPUs x 2 images: the PVTv2
# recipe (whai362/PVT detection/configs/mask_rcnn_pvt_v2_b2_fpn_1x_coco.py), which the FLatten paper follows
# (its repository ships no detection configs). Every number and its source: docs/recipes.md.
#
# Detector, data (1333x800, flip) and schedule (500 warm-up iterations, steps at epochs 8 and 11) are
# mmdet's mask-rcnn_r50_fpn_1x_coco, which match PVTv2's; the optimizer is PVTv2's: AdamW lr 2e-4, weight
# decay 1e-4 on every parameter; drop path 0.1 as PVTv2's detection backbone (detection/pvt_v2.py).
#
# Backbone weights: the FLatten release publishes no B2 ImageNet weights; train them with
# configs/classification/flatten/flatten-pvt-v2-b2_8xb128_in1k.py and put the checkpoint at
# checkpoints/flatten_pvt_v2_b2.pth, or train from random initialisation with
# --cfg-options model.backbone.init_cfg=None.
_base_ = [
    'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py',
    '../../_base_/models/flatten_pvt_v2_b2.py',
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

# the shared FLatten-PVTv2-B2 backbone moves into the model (pop: the dumped config holds it once)
model = dict(
    backbone=dict(_base_.pop('backbone'), _delete_=True, drop_path_rate=0.1),
    neck=dict(in_channels=_base_.pop('backbone_out_channels')))

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
