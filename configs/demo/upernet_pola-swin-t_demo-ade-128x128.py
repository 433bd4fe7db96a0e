# The segmentation demo: UperNet + Pola-Swin-T on the synthetic ADE20K-layout dataset
# data/demo_ade (tools/make_demo_ade.py: 200 + 50 outdoor scenes, 128 px high, 8 classes + "other"
# = label 0, ignored), sized to learn visibly in a few CPU minutes (tools/demo_segmentation.py).
# Same segmentor as configs/segmentation/upernet_pola-swin-t_8xb2-160k_ade20k-512x512.py with only
# what small images, few iterations and a CPU need changed:
#   * heads shrunk to 64 (UPerHead) / 32 (FCNHead) channels, plain BN;
#   * 96x96 crops of the images resized by 0.75-1.25, batch 4, 480 iterations (~10 epochs);
#   * the backbone starts from random weights (tools/demo_segmentation.py uses
#     checkpoints/pola_swin_tiny.pth when that file exists), hence the larger lr, no drop path.
_base_ = ['../segmentation/upernet_pola-swin-t_8xb2-160k_ade20k-512x512.py']

data_root = 'data/demo_ade'
data_hint = 'generate the demo dataset with: python tools/make_demo_ade.py'
# DEMO_ADE_CLASSES / DEMO_ADE_PALETTE of mmpola/datasets/demo_ade.py (a test keeps them in sync).
metainfo = dict(
    classes=('sky', 'building', 'tree', 'grass', 'road', 'water', 'person', 'car'),
    palette=[[70, 130, 180], [180, 120, 120], [4, 200, 3], [4, 250, 7], [140, 140, 140],
             [61, 230, 250], [150, 5, 61], [0, 102, 200]])
num_classes = 8
crop_size = (96, 96)
norm_cfg = dict(type='BN', requires_grad=True)

model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(drop_path_rate=0.0, init_cfg=None),
    decode_head=dict(channels=64, num_classes=num_classes, norm_cfg=norm_cfg),
    auxiliary_head=dict(channels=32, num_classes=num_classes, norm_cfg=norm_cfg))

train_pipeline = [
    dict(type='LoadCheckedImage'),  # a JPEG with a damaged body fails here, naming the file
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='CheckSegLabels', num_classes=num_classes),  # a bad label fails here, naming the file
    dict(type='RandomResize', scale=(256, 128), ratio_range=(0.75, 1.25), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='CheckImage'),  # 3 channels, 0..255, also for the arrays given to MMSegInferencer
    dict(type='Resize', scale=(256, 128), keep_ratio=True),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs'),
]
dataset = dict(
    type='BaseSegDataset',
    data_root=data_root,
    metainfo=metainfo,
    img_suffix='.jpg',
    seg_map_suffix='.png',
    reduce_zero_label=True)
train_dataloader = dict(
    batch_size=4,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        _delete_=True,
        data_prefix=dict(img_path='images/training', seg_map_path='annotations/training'),
        pipeline=train_pipeline,
        **dataset))
val_dataloader = dict(
    batch_size=1,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        _delete_=True,
        data_prefix=dict(img_path='images/validation', seg_map_path='annotations/validation'),
        pipeline=test_pipeline,
        **dataset))
test_dataloader = val_dataloader

# From scratch and short: a higher learning rate than the fine-tuning recipe, 5x more for the
# heads (AdamW moves a weight by ~lr per step, so the 0.01-std classifiers would otherwise need
# hundreds of steps to produce confident logits), and a short warm-up. No weight decay on norms, position
# parameters and Pola's exponent / temperature logits (this demo's own choice).
max_iters = 480
optim_wrapper = dict(
    optimizer=dict(lr=1e-3),
    paramwise_cfg=dict(custom_keys={
        'head': dict(lr_mult=5.),
        **{key: dict(decay_mult=0.) for key in ('norm', 'pos_embed', 'positional_encoding',
                                               'relative_position_bias_table', 'attn.power', 'attn.scale')}}))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=False, begin=0, end=40),
    dict(type='PolyLR', eta_min=0.0, power=1.0, by_epoch=False, begin=40, end=max_iters),
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters)
default_hooks = dict(
    logger=dict(interval=10),
    checkpoint=dict(interval=max_iters, max_keep_ckpts=1, save_optimizer=False))
auto_scale_lr = dict(enable=False, base_batch_size=4)
randomness = dict(seed=0)
