# UperNet on ADE20K, 160k iterations with InLine-Swin-S: ../upernet_pola-swin-s_8xb2-160k_ade20k-512x512.py with the
# injective linear attention of InLine (NeurIPS 2024) in the backbone, everything else identical, so the two compare
# the attention alone. Every number and its source: docs/recipes.md. Backbone weights: the official InLine-Swin-S
# ImageNet weights, downloaded from its release (mmpola/checkpoint/sources.py); offline: --cfg-options
# model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['../upernet_pola-swin-s_8xb2-160k_ade20k-512x512.py']

model = dict(backbone=dict(
    type='InLineSwin',
    init_cfg=dict(type='Pretrained', checkpoint='https://cloud.tsinghua.edu.cn/f/e9657fd247c04c7cb1a1/?dl=1')))
