# RetinaNet + FPN with Pola-Swin-T on COCO 2017, 1x schedule (12 epochs), 8 GPUs x 2 images. No
# official repository ships a Swin RetinaNet; this recipe is an mmpola choice (docs/recipes.md):
# detector, data and schedule are mmdet's port (retinanet_swin-t-p4-w7_fpn_1x_coco: 1333x800 + flip,
# 500 warm-up iterations, steps at epochs 8 and 11, drop path 0.2), with the backbone returning stages
# 2-4 only (Swin's per-output norms would leave an unused stage-1 norm under DDP otherwise) and the
# FPN starting at level 0 with two extra levels. The optimizer is the Swin detection recipe of our
# Mask R-CNN configs (AdamW lr 1e-4, weight decay 0.05 without decay on norms, absolute position
# embeddings and relative position bias tables) instead of that config's SGD, which is tuned for
# ResNets.
#
# Backbone weights: checkpoints/pola_swin_tiny.pth (see mask-rcnn_pola-swin-t_fpn_ms-crop-1x_coco.py).
_base_ = [
    'mmdet::swin/retinanet_swin-t-p4-w7_fpn_1x_coco.py',
    '../_base_/models/pola_swin_tiny.py',
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

model = dict(
    backbone=dict(_base_.pop('backbone'), _delete_=True, drop_path_rate=0.2, out_indices=(1, 2, 3)),
    neck=dict(in_channels=_base_.pop('backbone_out_channels')[1:], start_level=0, num_outs=5))

# the optimizer steps the parameter groups of equal options as one group, not one group per parameter
# (mmpola.runtime.param_groups: the same updates)
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    constructor='mmpola.MergedGroupsOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05, fused=True),
    paramwise_cfg=dict(custom_keys={
        'absolute_pos_embed': dict(decay_mult=0.),
        'relative_position_bias_table': dict(decay_mult=0.),
        'norm': dict(decay_mult=0.)}))

# training images loaded by mmpola's LoadCheckedImage: mmcv's LoadImageFromFile that refuses a JPEG whose
# body is damaged, naming the file (mmpola/datasets/decoding.py)
train_pipeline = [dict(_base_.train_pipeline[0], type='LoadCheckedImage'), *_base_.train_pipeline[1:]]
train_dataloader = dict(batch_size=2, dataset=dict(pipeline=train_pipeline))
auto_scale_lr = dict(enable=False, base_batch_size=16)

# `--tta`: horizontal flip
# (_base_/coco_tta.py)
