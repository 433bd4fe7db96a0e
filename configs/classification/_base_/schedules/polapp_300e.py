# Official PolaFormer++ schedule (polaformer++/config.py defaults with cfgs/pola_b0..b3.yaml): AdamW (betas
# 0.9/0.999, eps 1e-8), lr 5e-4 per 512 images, weight decay 0.05, 20 warm-up epochs from 5e-7 (per 512),
# cosine to 1e-7 (per 512) at epoch 300, gradient norm clipped at 5.0. The b4 / b5 recipes override it.
#
# The lr is scaled linearly with the total batch (GPUs x batch per GPU) / 512, as the official
# main_ema.py always does (auto_scale_lr enabled); warm-up start and minimum are ratios of the lr.
# Everything but the cosine minimum is the Pola-Swin schedule. Weight decay: the official set (none
# for 1-D parameters and biases; PaCS's s1 / s2 and the layer scales gamma_1 / gamma_2 are decayed);
# cosine from the end of the warm-up: see pola-pvt_310e.py.
_base_ = ['./pola-swin_300e.py']

base_lr = 5e-4
warmup_epochs = 20
cosine_epochs = 300

param_scheduler = [
    dict(type='LinearLR', start_factor=5e-7 / base_lr, by_epoch=True, begin=0, end=warmup_epochs,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', T_max=cosine_epochs - warmup_epochs, eta_min_ratio=1e-7 / base_lr,
         by_epoch=True, begin=warmup_epochs, end=cosine_epochs, convert_to_iter_based=True),
]
