# Mask R-CNN + FPN with PolaFormer++-B2 on COCO 2017, 1x schedule (12 epochs), 8 GPUs x 2 images, as the
# official PolaFormer++ configs/PolaPP/maskrcnn_b2_1x.py: AdamW lr 1e-4, weight decay 0.05 without decay on
# norms, absolute position embeddings and relative position bias tables, 500 warm-up iterations, steps at
# epochs 8 and 11 (the official run trained with fp16: tools/train.py --amp). Every number and its source:
# docs/recipes.md.
# Detector, data (1333x800, flip) and runtime are mmdet's (via its Swin-T Mask R-CNN config, whose
# optimizer is the official one).
# Backbone weights: checkpoints/polapp_b2.pth (see configs/_base_/models/polapp_b2.py).
_base_ = [
    'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py',
    '../_base_/models/polapp_b2.py',
    './_base_/coco_tta.py',
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

# the shared PolaPP-B2 backbone moves into the model (pop: the dumped config holds it once)
model = dict(
    backbone=dict(_base_.pop('backbone'), _delete_=True, drop_path_rate=0.1),
    neck=dict(in_channels=_base_.pop('backbone_out_channels')))

param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=12, by_epoch=True, milestones=[8, 11], gamma=0.1),
]

# mmdet's Swin recipe gives every parameter an optimizer group of its own (its paramwise_cfg); this
# constructor merges those of equal options: the same updates in a few groups (mmpola.runtime.param_groups)
optim_wrapper = dict(constructor='mmpola.MergedGroupsOptimWrapperConstructor',
                     optimizer=dict(fused=True))  # AdamW's fused step (docs/recipes.md)

# training images loaded by mmpola's LoadCheckedImage: mmcv's LoadImageFromFile that refuses a JPEG whose
# body is damaged, naming the file (mmpola/datasets/decoding.py)
train_pipeline = [dict(_base_.train_pipeline[0], type='LoadCheckedImage'), *_base_.train_pipeline[1:]]
train_dataloader = dict(batch_size=2, dataset=dict(pipeline=train_pipeline))
auto_scale_lr = dict(enable=False, base_batch_size=16)

# `--tta`: horizontal flip
# (_base_/coco_tta.py)
