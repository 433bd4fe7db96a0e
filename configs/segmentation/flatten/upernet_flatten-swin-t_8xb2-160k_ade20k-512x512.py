# UperNet + FLatten-Swin-T on ADE20K, 512x512 crops, 160k iterations: ../upernet_pola-swin-t_8xb2-160k_ade20k-512x512.py
# with the focused linear attention of FLatten Transformer (ICCV 2023) in the backbone, everything else identical.
# Backbone weights: the official FLatten-Swin-T ImageNet weights, downloaded from
# its release (mmpola/checkpoint/sources.py); offline: --cfg-options model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['../upernet_pola-swin-t_8xb2-160k_ade20k-512x512.py']

model = dict(backbone=dict(
    type='FLattenSwin',
    init_cfg=dict(checkpoint='https://cloud.tsinghua.edu.cn/f/e1518e76703e4e57a7f2/?dl=1')))
