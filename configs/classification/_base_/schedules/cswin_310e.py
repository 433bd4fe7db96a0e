# Official CSWin schedule of the FLatten and InLine releases (cfgs/{flatten,inline}_cswin_{t,s,b}.yaml on
# config.py, trained by main_ema.py): AdamW (betas 0.9/0.999, eps 1e-8), lr 5e-4 per 512 images, weight decay
# 0.05 (B: 0.1, set by its config), 20 warm-up epochs from 1e-6 (per 512), cosine to 1e-5 (per 512) at epoch
# 300, then 10 cool-down epochs at the minimum (main_ema.py trains EPOCHS + COOLDOWN_EPOCHS: 310 in all), no
# gradient clipping (CLIP_GRAD: None). The EMA of the weights is set by each config (its decay differs).
#
# Everything else, the per-512 lr scaling and the weight-decay groups (none for 1-D parameters; CSWin's
# no_weight_decay names no parameter it has), is pola-pvt_310e.py, whose cosine-after-warm-up deviation
# applies here too.
_base_ = ['./pola-pvt_310e.py']

base_lr = 5e-4
warmup_epochs = 20
cosine_epochs = 300

param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6 / base_lr, by_epoch=True, begin=0, end=warmup_epochs,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', T_max=cosine_epochs - warmup_epochs, eta_min_ratio=1e-5 / base_lr,
         by_epoch=True, begin=warmup_epochs, end=cosine_epochs, convert_to_iter_based=True),
]
