# Official Pola-PVT schedule (FLatten/PolaFormer pola_pvt_*.yaml): AdamW (betas 0.9/0.999, eps 1e-8),
# lr 5e-4 per 512 images, weight decay 0.05, 5 warm-up epochs from 1e-6 (per 512), cosine to
# 1e-5 (per 512) at epoch 300, then 10 cool-down epochs at the minimum (310 in all).
#
# The lr is scaled linearly with the total batch (GPUs x batch per GPU) / 512, as the official
# main.py always does (auto_scale_lr enabled); warm-up start and minimum are ratios of the lr,
# so they scale with it.
#
# One deviation: the official Swin-lineage scheduler (timm CosineLRScheduler over all steps, the
# warm-up overriding its start; PolaFormer's config.py has no WARMUP_PREFIX) runs the cosine
# from step 0; mmengine's LinearLR + CosineAnnealingLR(begin=warm-up) (as
# mmpretrain's Swin recipe) starts the cosine after the warm-up. Same peak, same minimum at epoch
# 300; in between the lr is at most 1.5% (PVT, 5 warm-up epochs) / 6.3% (Swin, 20) of the peak
# higher.
#
# Weight decay as the official set_weight_decay: none for 1-D parameters (norms, biases) and
# Swin's relative_position_bias_table / absolute_pos_embed; Pola's power, scale,
# positional_encoding and PVT's pos_embed{i} ARE decayed (as the official training configuration).
base_lr = 5e-4
warmup_epochs = 5
cosine_epochs = 300
max_epochs = 310

# the optimizer steps the parameter groups of equal options as one group, not one group per parameter
# (mmpola.runtime.param_groups: the same updates)
optim_wrapper = dict(
    type='OptimWrapper',
    constructor='mmpola.MergedGroupsOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=base_lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.05, fused=True),
    paramwise_cfg=dict(
        flat_decay_mult=0.0,
        custom_keys={
            'relative_position_bias_table': dict(decay_mult=0.0),
            'absolute_pos_embed': dict(decay_mult=0.0),
        }))

param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6 / base_lr, by_epoch=True, begin=0, end=warmup_epochs,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', T_max=cosine_epochs - warmup_epochs, eta_min_ratio=1e-5 / base_lr,
         by_epoch=True, begin=warmup_epochs, end=cosine_epochs, convert_to_iter_based=True),
]

train_cfg = dict(by_epoch=True, max_epochs=max_epochs, val_interval=1)
val_cfg = dict()
test_cfg = dict()

auto_scale_lr = dict(enable=True, base_batch_size=512)
