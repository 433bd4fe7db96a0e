# UperNet + InLine-Swin-T on ADE20K, 512x512 crops, 160k iterations: ../upernet_pola-swin-t_8xb2-160k_ade20k-512x512.py
# with the injective linear attention of InLine (NeurIPS 2024) in the backbone, everything else identical.
# Backbone weights: the official InLine-Swin-T ImageNet weights, downloaded from
# its release (mmpola/checkpoint/sources.py); offline: --cfg-options model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['../upernet_pola-swin-t_8xb2-160k_ade20k-512x512.py']

model = dict(backbone=dict(
    type='InLineSwin',
    init_cfg=dict(checkpoint='https://cloud.tsinghua.edu.cn/f/32810869fcc34410966b/?dl=1')))
