# Semantic FPN on ADE20K, 40k iterations with InLine-PVT-L: ../fpn_pola-pvt-l_8xb4-40k_ade20k-512x512.py with the
# injective linear attention of InLine (NeurIPS 2024) in the backbone, everything else identical, so the two compare
# the attention alone. Every number and its source: docs/recipes.md. Backbone weights: the official InLine-PVT-L
# ImageNet weights, downloaded from its release (mmpola/checkpoint/sources.py); offline: --cfg-options
# model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['../fpn_pola-pvt-l_8xb4-40k_ade20k-512x512.py']

model = dict(backbone=dict(
    type='InLinePVT',
    init_cfg=dict(type='Pretrained', checkpoint='https://cloud.tsinghua.edu.cn/f/efd91318ba964f01b288/?dl=1')))
