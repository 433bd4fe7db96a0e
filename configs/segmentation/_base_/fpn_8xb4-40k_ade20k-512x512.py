# The ADE20K Semantic FPN recipe shared by every fpn_* config: PVT's (whai362/PVT
# segmentation/configs/sem_fpn/PVT/fpn_pvt_s_ade20k_40k.py), which the PVT-based papers compare under.
# A leaf config adds one backbone base from configs/_base_/models and moves its backbone into the model.
#
# mmseg's FPN + FPNHead (_base_/models/fpn_r50.py: 256-channel FPN over the four stages, 128-channel
# head, dropout 0.1, SyncBN, no auxiliary head); ADE20K with random resize of (2048, 512) x [0.5, 2],
# 512x512 crops, flip and photometric distortion; AdamW lr 2e-4, weight decay 1e-4 on every parameter;
# poly decay (power 0.9) to 0 over 40k iterations without warm-up; 8 GPUs x 4 images. Every number and
# its source: docs/recipes.md.
#
# Testing: the whole image, short side resized to 512, then both sides resized to a multiple of 32
# (PVT's AlignResize; ./ade20k_align32.py).
_base_ = [
    'mmseg::_base_/models/fpn_r50.py',
    './ade20k_align32.py',
    'mmseg::_base_/default_runtime.py',
    'mmseg::_base_/schedules/schedule_40k.py',
    '../../_base_/runtime.py',
]
# mmpola's atomic checkpoint saves (configs/_base_/runtime.py says why this is set here)
default_hooks = dict(checkpoint=dict(type='mmpola.SafeCheckpointHook'))

_base_.pop('optimizer')  # mmseg's schedule base leaves its SGD settings in a top-level variable

model = dict(
    pretrained=None,  # mmseg's base names a ResNet checkpoint here; the backbone has its own init_cfg
    data_preprocessor=dict(size=(512, 512)),
    decode_head=dict(num_classes=150))

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=2e-4, betas=(0.9, 0.999), weight_decay=1e-4, fused=True))

param_scheduler = [dict(type='PolyLR', eta_min=0.0, power=0.9, by_epoch=False, begin=0, end=40000)]

# 8 GPUs x 4 images; --auto-scale-lr rescales the lr for another total batch size.
train_dataloader = dict(batch_size=4)
auto_scale_lr = dict(enable=False, base_batch_size=32)
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
