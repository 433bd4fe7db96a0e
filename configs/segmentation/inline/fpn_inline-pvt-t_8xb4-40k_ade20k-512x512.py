# Semantic FPN + InLine-PVT-T on ADE20K, 512x512 crops, 40k iterations: ../fpn_pola-pvt-t_8xb4-40k_ade20k-512x512.py
# with the injective linear attention of InLine (NeurIPS 2024) in the backbone, everything else identical.
# Backbone weights: the official InLine-PVT-T ImageNet weights, downloaded from its release
# (mmpola/checkpoint/sources.py); offline: --cfg-options model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['../fpn_pola-pvt-t_8xb4-40k_ade20k-512x512.py']

model = dict(backbone=dict(
    type='InLinePVT',
    init_cfg=dict(checkpoint='https://cloud.tsinghua.edu.cn/f/90ac52b1555b401eb5e6/?dl=1')))
