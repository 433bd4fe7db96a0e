# UperNet on ADE20K, 160k iterations with FLatten-Swin-S: ../upernet_pola-swin-s_8xb2-160k_ade20k-512x512.py with the
# focused linear attention of FLatten Transformer (ICCV 2023) in the backbone, everything else identical, so the two
# compare the attention alone. Every number and its source: docs/recipes.md. Backbone weights: the official
# FLatten-Swin-S ImageNet weights, downloaded from its release (mmpola/checkpoint/sources.py); offline: --cfg-options
# model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['../upernet_pola-swin-s_8xb2-160k_ade20k-512x512.py']

model = dict(backbone=dict(
    type='FLattenSwin',
    init_cfg=dict(type='Pretrained', checkpoint='https://cloud.tsinghua.edu.cn/f/94188e52af354bf4a88b/?dl=1')))
