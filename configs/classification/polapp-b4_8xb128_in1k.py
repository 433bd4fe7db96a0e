# PolaFormer++-B4 (46.7 M backbone parameters): official ImageNet top-1 85.4.
# ImageNet-1k from scratch, 8 GPUs x 128 images, official recipe (polaformer++/cfgs/pola_b4.yaml on the
# config.py defaults, trained by main_ema.py with an EMA of decay 0.99982 whose weights are the released
# ones). Train / test:
#   tools/dist_train.sh configs/classification/polapp-b4_8xb128_in1k.py 8 [--amp]
#   tools/test.py configs/classification/polapp-b4_8xb128_in1k.py CHECKPOINT   (official PolaFormer++ files load as is)
# The checkpoint (EMA weights) feeds the dense configs' PolaPP backbone: init_cfg=dict(type='Pretrained', ...).
_base_ = ['./polapp-b0_8xb256_in1k.py']  # the official recipe; this size's own settings below

model = dict(arch='b4', drop_path_rate=0.4)
train_dataloader = dict(batch_size=128)

# cfgs/pola_b4.yaml: 5 warm-up epochs from 1e-7, cosine to 1e-5 (per 512) at epoch 300, then 10 cool-down
# epochs at the minimum; gradient norm clipped at 1.0
base_lr = 5e-4
optim_wrapper = dict(clip_grad=dict(max_norm=1.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-7 / base_lr, by_epoch=True, begin=0, end=5, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', T_max=300 - 5, eta_min_ratio=1e-5 / base_lr, by_epoch=True, begin=5, end=300,
         convert_to_iter_based=True),
]
train_cfg = dict(max_epochs=310)
