# PolaFormer++-B5 (93.6 M backbone parameters): official ImageNet top-1 85.6.
# ImageNet-1k from scratch, 8 GPUs x 64 images, official recipe (polaformer++/cfgs/pola_b5.yaml on the
# config.py defaults, trained by main_ema.py with an EMA of decay 0.99982 whose weights are the released
# ones). Train / test:
#   tools/dist_train.sh configs/classification/polapp-b5_8xb64_in1k.py 8 [--amp]
#   tools/test.py configs/classification/polapp-b5_8xb64_in1k.py CHECKPOINT   (official PolaFormer++ files load as is)
# The checkpoint (EMA weights) feeds the dense configs' PolaPP backbone: init_cfg=dict(type='Pretrained', ...).
_base_ = ['./polapp-b0_8xb256_in1k.py']  # the official recipe; this size's own settings below

model = dict(arch='b5', drop_path_rate=0.55)
train_dataloader = dict(batch_size=64)

# cfgs/pola_b5.yaml: lr 2e-5 (per 512), weight decay 1e-8, 1 warm-up epoch from 5e-7, cosine to 5e-6 (per
# 512) at epoch 300, then 5 cool-down epochs at the minimum; no gradient clipping
base_lr = 2e-5
# the optimizer steps the parameter groups of equal options as one group, not one group per parameter
# (mmpola.runtime.param_groups: the same updates)
optim_wrapper = dict(_delete_=True, type='OptimWrapper', constructor='mmpola.MergedGroupsOptimWrapperConstructor',
                     optimizer=dict(type='AdamW', lr=base_lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-8,
                                    fused=True),
                     paramwise_cfg=dict(flat_decay_mult=0.0, custom_keys={
                         'relative_position_bias_table': dict(decay_mult=0.0),
                         'absolute_pos_embed': dict(decay_mult=0.0)}))
param_scheduler = [
    dict(type='LinearLR', start_factor=5e-7 / base_lr, by_epoch=True, begin=0, end=1, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', T_max=300 - 1, eta_min_ratio=5e-6 / base_lr, by_epoch=True, begin=1, end=300,
         convert_to_iter_based=True),
]
train_cfg = dict(max_epochs=305)
