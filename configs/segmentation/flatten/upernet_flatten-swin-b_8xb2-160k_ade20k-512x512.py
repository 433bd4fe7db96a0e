# UperNet on ADE20K, 160k iterations with FLatten-Swin-B: ../upernet_pola-swin-b_8xb2-160k_ade20k-512x512.py with the
# focused linear attention of FLatten Transformer (ICCV 2023) in the backbone, everything else identical, so the two
# compare the attention alone. Every number and its source: docs/recipes.md. Backbone weights: the official
# FLatten-Swin-B ImageNet weights, downloaded from its release (mmpola/checkpoint/sources.py); offline: --cfg-options
# model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['../upernet_pola-swin-b_8xb2-160k_ade20k-512x512.py']

model = dict(backbone=dict(
    type='FLattenSwin',
    init_cfg=dict(type='Pretrained', checkpoint='https://cloud.tsinghua.edu.cn/f/7a9e5186bad04e7fb3a9/?dl=1')))
