# The ADE20K UperNet recipe shared by every upernet_* config; a leaf config adds one backbone base
# from configs/_base_/models and moves its backbone into the model.
#
# Everything is Swin's UperNet recipe (SwinTransformer/Swin-Transformer-Semantic-Segmentation
# configs/swin/upernet_swin_tiny_patch4_window7_512x512_160k_ade20k.py, as ported by mmseg): ADE20K
# (150 classes) with random resize of (2048, 512) x [0.5, 2], 512x512 crops, flip and photometric
# distortion; UPerHead (512 channels) + auxiliary FCNHead (256 channels) on stage 3 (loss weight 0.4);
# SyncBN in both heads (tools/train.py and tools/test.py turn it into BN for a single process or on
# CPU); AdamW lr 6e-5, weight decay 0.01 without decay on norms, absolute position embeddings and
# relative position bias tables; 1500 iterations of linear warm-up, then poly (power 1) decay to 0 at
# 160k iterations; 8 GPUs x 2 images. Every number and its source: docs/recipes.md.
#
# Testing: the whole image, short side resized to 512 (e.g. 512x683), as in Swin's and mmseg's.
# Other test modes, for any leaf config:
#   sliding window:  tools/test.py CONFIG CHECKPOINT --cfg-options model.test_cfg.mode=slide \
#                        model.test_cfg.crop_size="(512,512)" model.test_cfg.stride="(341,341)"
#   multi-scale + flip (mmseg's SegTTAModel over the inherited `tta_pipeline`: ratios 0.5 ...
#   1.75 of the image size, each also flipped):  tools/test.py CONFIG CHECKPOINT --tta
_base_ = [
    'mmseg::_base_/models/upernet_swin.py',
    './ade20k.py',
    'mmseg::_base_/default_runtime.py',
    'mmseg::_base_/schedules/schedule_160k.py',
    '../../_base_/runtime.py',
]
# mmpola's atomic checkpoint saves (configs/_base_/runtime.py says why this is set here)
default_hooks = dict(checkpoint=dict(type='mmpola.SafeCheckpointHook'))

# mmseg's bases leave their Swin backbone norm and SGD optimizer in top-level variables: not this recipe's
_base_.pop('backbone_norm_cfg')
_base_.pop('optimizer')

model = dict(
    data_preprocessor=dict(size=(512, 512)),
    decode_head=dict(num_classes=150),
    auxiliary_head=dict(num_classes=150),
    test_cfg=dict(mode='whole'))

# the optimizer steps the parameter groups of equal options as one group, not one group per parameter
# (mmpola.runtime.param_groups: the same updates)
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    constructor='mmpola.MergedGroupsOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01, fused=True),
    paramwise_cfg=dict(custom_keys={
        'absolute_pos_embed': dict(decay_mult=0.),
        'relative_position_bias_table': dict(decay_mult=0.),
        'norm': dict(decay_mult=0.)}))

param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, by_epoch=False, begin=1500, end=160000),
]

# 8 GPUs x 2 images; --auto-scale-lr rescales the lr for another total batch size.
train_dataloader = dict(batch_size=2)
auto_scale_lr = dict(enable=False, base_batch_size=16)
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
