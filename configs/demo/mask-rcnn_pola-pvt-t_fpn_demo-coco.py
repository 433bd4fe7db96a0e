# The main demo: Mask R-CNN + FPN with Pola-PVT-T on the synthetic COCO-format dataset
# data/demo_coco (tools/make_demo_coco.py: circles, rectangles and triangles on textured noisy
# backgrounds, ~128 px images), sized to learn visibly in a few CPU minutes
# (tools/demo_detection.py). Same detector as configs/detection/mask-rcnn_pola-pvt-t_fpn_1x_coco.py
# with only what small images and a CPU need changed:
#   * heads shrunk: 64-channel FPN/RPN, 256-d box fc, 64-channel mask convs, 128 sampled RoIs,
#     300 proposals (a full-size Mask R-CNN step is ~10x slower here, dominated by the heads);
#   * anchors half the size (scale 4: 16-256 px) for objects of 10-60 px;
#   * the backbone starts from random weights (tools/demo_detection.py uses
#     checkpoints/pola_pvt_tiny.pth when that file exists), hence a larger lr.
_base_ = ['../detection/mask-rcnn_pola-pvt-t_fpn_1x_coco.py']

data_root = 'data/demo_coco/'
data_hint = 'generate the demo dataset with: python tools/make_demo_coco.py'
classes = ('circle', 'rectangle', 'triangle')
metainfo = dict(classes=classes, palette=[(220, 20, 60), (0, 128, 255), (60, 180, 75)])
image_scale = (128, 128)
fpn_channels = 64

model = dict(
    backbone=dict(drop_path_rate=0.0, init_cfg=None),
    neck=dict(out_channels=fpn_channels),
    rpn_head=dict(
        in_channels=fpn_channels,
        feat_channels=fpn_channels,
        anchor_generator=dict(scales=[4])),
    roi_head=dict(
        bbox_roi_extractor=dict(out_channels=fpn_channels),
        bbox_head=dict(in_channels=fpn_channels, fc_out_channels=256, num_classes=len(classes)),
        mask_roi_extractor=dict(out_channels=fpn_channels),
        mask_head=dict(in_channels=fpn_channels, conv_out_channels=fpn_channels, num_classes=len(classes))),
    train_cfg=dict(
        rpn_proposal=dict(nms_pre=1000, max_per_img=300),
        rcnn=dict(sampler=dict(num=128))),
    test_cfg=dict(
        rpn=dict(nms_pre=300, max_per_img=300),
        rcnn=dict(max_per_img=50)))

train_pipeline = [
    dict(type='LoadCheckedImage'),  # a JPEG with a damaged body fails here, naming the file
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=image_scale, keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='CheckImage'),  # 3 channels, 0..255, also for the arrays given to DetInferencer
    dict(type='Resize', scale=image_scale, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
train_dataloader = dict(
    batch_size=4,
    num_workers=1,
    dataset=dict(
        data_root=data_root,
        metainfo=metainfo,
        ann_file='annotations/instances_train.json',
        data_prefix=dict(img='train/'),
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=4,
    num_workers=1,
    dataset=dict(
        data_root=data_root,
        metainfo=metainfo,
        ann_file='annotations/instances_val.json',
        data_prefix=dict(img='val/'),
        pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json', metric=['bbox', 'segm'])
test_evaluator = val_evaluator
# --tta: both flips at three scales around the demo's test scale
tta_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(
        type='TestTimeAug',
        transforms=[
            [dict(type='Resize', scale=scale, keep_ratio=True) for scale in ((112, 112), (128, 128), (160, 160))],
            [dict(type='RandomFlip', prob=1.), dict(type='RandomFlip', prob=0.)],
            [dict(type='LoadAnnotations', with_bbox=True)],
            [dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor',
                                                   'flip', 'flip_direction'))],
        ]),
]

# 80 iterations per epoch (320 images, batch 4); validation only at the end (the demo also
# evaluates the untrained model before the first iteration).
max_epochs = 6
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
# AdamW lr 4e-4 (from scratch), weight decay 1e-4 except on norms, position parameters and Pola's
# exponent / temperature logits (this demo's own choice; the COCO recipe decays every parameter)
# the optimizer steps the parameter groups of equal options as one group, not one group per parameter
# (mmpola.runtime.param_groups: the same updates)
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    constructor='mmpola.MergedGroupsOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=4e-4, betas=(0.9, 0.999), weight_decay=1e-4, fused=True),
    paramwise_cfg=dict(custom_keys={key: dict(decay_mult=0.) for key in (
        'norm', 'pos_embed', 'positional_encoding', 'relative_position_bias_table', 'attn.power', 'attn.scale')}))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=50),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[5], gamma=0.1),
]
default_hooks = dict(
    logger=dict(interval=10),
    checkpoint=dict(interval=max_epochs, max_keep_ckpts=1))
auto_scale_lr = dict(enable=False, base_batch_size=4)
randomness = dict(seed=0)
