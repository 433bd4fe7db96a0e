# RetinaNet + FPN with Pola-PVT-T on COCO 2017, 1x schedule (12 epochs), 8 GPUs x 2 images: the PVT
# recipe (whai362/PVT detection/configs/retinanet_pvt_t_fpn_1x_coco.py), as ported by mmdet
# (retinanet_pvt-t_fpn_1x_coco: AdamW lr 1e-4, weight decay 1e-4 on every parameter, 500 warm-up
# iterations, steps at epochs 8 and 11; FPN from stage 2 on plus two extra levels, 1333x800 + flip).
# Every number and its source: docs/recipes.md.
#
# Backbone weights: checkpoints/pola_pvt_tiny.pth (see mask-rcnn_pola-pvt-t_fpn_1x_coco.py).
# Without it: --cfg-options model.backbone.init_cfg=None.
_base_ = [
    'mmdet::pvt/retinanet_pvt-t_fpn_1x_coco.py',
    '../_base_/models/pola_pvt_tiny.py',
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

# the shared Pola-PVT-T backbone moves into the model (pop: the dumped config holds it once)
model = dict(
    backbone=dict(_base_.pop('backbone'), _delete_=True, drop_path_rate=0.1),
    neck=dict(in_channels=_base_.pop('backbone_out_channels')))

optim_wrapper = dict(optimizer=dict(betas=(0.9, 0.999), fused=True))  # AdamW's fused step (docs/recipes.md)
# training images loaded by mmpola's LoadCheckedImage: mmcv's LoadImageFromFile that refuses a JPEG whose
# body is damaged, naming the file (mmpola/datasets/decoding.py)
train_pipeline = [dict(_base_.train_pipeline[0], type='LoadCheckedImage'), *_base_.train_pipeline[1:]]
train_dataloader = dict(batch_size=2, dataset=dict(pipeline=train_pipeline))
auto_scale_lr = dict(enable=False, base_batch_size=16)

# `--tta`: horizontal flip
# (_base_/coco_tta.py)
