# The ADE20K UperNet recipe shared by every upernet_pola-* config; a leaf config adds one
# backbone base from configs/_base_/models and swaps it in.
#
# Everything is mmseg's Swin UperNet recipe, inherited from its Swin-T config: ADE20K (150
# classes) pipeline with random resize of (2048, 512) x [0.5, 2], 512x512 crops, flip and
# photometric distortion; UPerHead (512 channels) + auxiliary FCNHead on stage 3 (loss weight
# 0.4); SyncBN in both heads (tools/train.py and tools/test.py turn it into BN for a single
# process or on CPU); AdamW lr 6e-5, weight decay 0.01; 1500 iterations of linear warm-up, then
# poly (power 1) decay to 0 at 160k iterations; 8 GPUs x 2 images.
#
# Testing: the whole image, short side resized to 512 (e.g. 512x683), as in mmseg's model zoo.
# Other test modes, for any leaf config:
#   sliding window:  tools/test.py CONFIG CHECKPOINT --cfg-options model.test_cfg.mode=slide \
#                        model.test_cfg.crop_size="(512,512)" model.test_cfg.stride="(341,341)"
#   multi-scale + flip (mmseg's SegTTAModel over the inherited `tta_pipeline`: ratios 0.5 ...
#   1.75 of the image size, each also flipped):  tools/test.py CONFIG CHECKPOINT --tta
_base_ = ['mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py',
          '../../_base_/runtime.py']
# mmpola's atomic checkpoint saves (configs/_base_/runtime.py says why this is set here)
default_hooks = dict(checkpoint=dict(type='mmpola.SafeCheckpointHook'))

norm_cfg = dict(type='SyncBN', requires_grad=True)
model = dict(
    decode_head=dict(num_classes=150, norm_cfg=norm_cfg),
    auxiliary_head=dict(num_classes=150, norm_cfg=norm_cfg),
    test_cfg=dict(mode='whole'))

# No weight decay on norms and position parameters (the leaf configs add the backbone's own
# no-decay keys: Pola's `attn.power` / `attn.scale`, `positional_encoding`, `pos_embed`, ...).
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.)}))

param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, by_epoch=False, begin=1500, end=160000),
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=160000, val_interval=16000)

# mmseg's ADE20K training pipeline plus CheckSegLabels (mmpola.datasets.transforms): a map with a
# label the heads have no class for fails there, naming the file, instead of in the loss.
crop_size = (512, 512)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='CheckSegLabels', num_classes=150),
    dict(type='RandomResize', scale=(2048, 512), ratio_range=(0.5, 2.0), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs'),
]

# 8 GPUs x 2 images; --auto-scale-lr rescales the lr for another total batch size.
train_dataloader = dict(batch_size=2, dataset=dict(pipeline=train_pipeline))
auto_scale_lr = dict(enable=False, base_batch_size=16)
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
