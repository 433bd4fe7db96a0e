# Semantic FPN on ADE20K, 40k iterations with InLine-PVT-M: ../fpn_pola-pvt-m_8xb4-40k_ade20k-512x512.py with the
# injective linear attention of InLine (NeurIPS 2024) in the backbone, everything else identical, so the two compare
# the attention alone. Every number and its source: docs/recipes.md. Backbone weights: the official InLine-PVT-M
# ImageNet weights, downloaded from its release (mmpola/checkpoint/sources.py); offline: --cfg-options
# model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['../fpn_pola-pvt-m_8xb4-40k_ade20k-512x512.py']

model = dict(backbone=dict(
    type='InLinePVT',
    init_cfg=dict(type='Pretrained', checkpoint='https://cloud.tsinghua.edu.cn/f/a72aec31e6084bc0a280/?dl=1')))
