# Semantic FPN + FLatten-PVT-T on ADE20K, 512x512 crops, 40k iterations: ../fpn_pola-pvt-t_8xb4-40k_ade20k-512x512.py
# with the focused linear attention of FLatten Transformer (ICCV 2023) in the backbone, everything else identical.
# Backbone weights: the official FLatten-PVT-T ImageNet weights, downloaded from its release
# (mmpola/checkpoint/sources.py); offline: --cfg-options model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['../fpn_pola-pvt-t_8xb4-40k_ade20k-512x512.py']

model = dict(backbone=dict(
    type='FLattenPVT',
    init_cfg=dict(checkpoint='https://cloud.tsinghua.edu.cn/f/3ab1d773f19d45648690/?dl=1')))
