# LightHamHead (SegNeXt's Hamburger decoder) + PolaFormer++-B2 on ADE20K, 512x512 crops, 160k iterations,
# 8 GPUs x 8 images, as the official PolaFormer++ downstream/segmentation/configs/PolaPP/polapp_b2.py
# (launched by its run.sh on 8 GPUs with samples_per_gpu=8): the head reads stages 2-4 (512 channels, NMF
# rank 16, GroupNorm), AdamW lr 6e-5, weight decay 0.01 without decay on norms and `pos_block`, 10x lr for
# the head, 1500 warm-up iterations then poly to 0; the backbone's BatchNorm statistics stay frozen
# (norm_eval, the official segmentation backbone's train()); the whole image is tested resized to short
# side 512 and then to sides that are multiples of 32 (the official ResizeToMultiple), not padded. The
# head, optimizer and schedule are also mmseg's SegNeXt recipe
# (segnext_mscan-t_1xb16-adamw-160k_ade20k-512x512). Every number and its source: docs/recipes.md.
# The backbone returns only the stages the head reads (no unused output norm).
# ImageNet-1k weights at checkpoints/polapp_b2.pth (see configs/_base_/models/polapp_b2.py).
_base_ = [
    './_base_/ade20k_align32.py',
    'mmseg::_base_/default_runtime.py',
    'mmseg::_base_/schedules/schedule_160k.py',
    '../_base_/models/polapp_b2.py',
    '../_base_/runtime.py',
]
# mmpola's atomic checkpoint saves (configs/_base_/runtime.py says why this is set here)
default_hooks = dict(checkpoint=dict(type='mmpola.SafeCheckpointHook'))

_base_.pop('optimizer')  # mmseg's schedule base leaves its SGD settings in a top-level variable

# the shared PolaPP-B2 backbone moves into the model (pop: the dumped config holds it once)
model = dict(
    type='EncoderDecoder',
    data_preprocessor=dict(type='SegDataPreProcessor', mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375],
                           bgr_to_rgb=True, pad_val=0, seg_pad_val=255, size=(512, 512)),
    backbone=dict(_base_.pop('backbone'), drop_path_rate=0.1, norm_eval=True, out_indices=(1, 2, 3)),
    decode_head=dict(
        type='LightHamHead',
        in_channels=_base_.pop('backbone_out_channels')[1:],
        in_index=[0, 1, 2],
        channels=512,
        ham_channels=512,
        dropout_ratio=0.1,
        num_classes=150,
        norm_cfg=dict(type='GN', num_groups=32, requires_grad=True),
        align_corners=False,
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
        ham_kwargs=dict(MD_S=1, MD_R=16, train_steps=6, eval_steps=7, inv_t=100, rand_init=True)),
    train_cfg=dict(),
    test_cfg=dict(mode='whole'))

# the optimizer steps the parameter groups of equal options as one group, not one group per parameter
# (mmpola.runtime.param_groups: the same updates)
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    constructor='mmpola.MergedGroupsOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01, fused=True),
    paramwise_cfg=dict(custom_keys={
        'pos_block': dict(decay_mult=0.),
        'norm': dict(decay_mult=0.),
        'head': dict(lr_mult=10.)}))

param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, by_epoch=False, begin=1500, end=160000),
]

# 8 GPUs x 8 images; --auto-scale-lr rescales the lr for another total batch size.
train_dataloader = dict(batch_size=8)
auto_scale_lr = dict(enable=False, base_batch_size=64)
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
