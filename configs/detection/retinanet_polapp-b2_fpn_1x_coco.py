# RetinaNet + FPN with PolaFormer++-B2 on COCO 2017, 1x schedule (12 epochs), 8 GPUs x 2 images, as the
# official configs/PolaPP/retinanet_b2_1x.py: AdamW lr 1e-4, weight decay 1e-4 on every parameter, 500
# warm-up iterations, steps at epochs 8 and 11 (the official run trained with fp16: tools/train.py --amp).
# The FPN reads stages 2-4 plus two extra levels from the last input (the official start_level=1 on four
# inputs): the backbone returns only those stages, so it has no unused output norm.
# The detector, data and schedule are mmdet's PVT-T RetinaNet recipe, which is the official one.
# Every number and its source: docs/recipes.md. Backbone weights: checkpoints/polapp_b2.pth.
_base_ = [
    'mmdet::pvt/retinanet_pvt-t_fpn_1x_coco.py',
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

model = dict(
    backbone=dict(_base_.pop('backbone'), _delete_=True, drop_path_rate=0.1, out_indices=(1, 2, 3)),
    neck=dict(in_channels=_base_.pop('backbone_out_channels')[1:], start_level=0, add_extra_convs='on_input',
              num_outs=5))

optim_wrapper = dict(optimizer=dict(betas=(0.9, 0.999), fused=True))  # AdamW's fused step (docs/recipes.md)
# training images loaded by mmpola's LoadCheckedImage: mmcv's LoadImageFromFile that refuses a JPEG whose
# body is damaged, naming the file (mmpola/datasets/decoding.py)
train_pipeline = [dict(_base_.train_pipeline[0], type='LoadCheckedImage'), *_base_.train_pipeline[1:]]
train_dataloader = dict(batch_size=2, dataset=dict(pipeline=train_pipeline))
auto_scale_lr = dict(enable=False, base_batch_size=16)

# `--tta`: horizontal flip
# (_base_/coco_tta.py)
