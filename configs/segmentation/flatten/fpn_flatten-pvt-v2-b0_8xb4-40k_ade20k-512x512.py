# Semantic FPN + FLatten-PVTv2-B0 on ADE20K, 512x512 crops, 40k iterations, 8 GPUs x 4 images:
# ./fpn_flatten-pvt-v2-b2_8xb4-40k_ade20k-512x512.py with the B0 backbone, drop path 0.1. Every number and its source:
# docs/recipes.md. Backbone weights: the official FLatten-PVTv2-B0 ImageNet weights, downloaded from its release
# (mmpola/checkpoint/sources.py); offline: --cfg-options model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['./fpn_flatten-pvt-v2-b2_8xb4-40k_ade20k-512x512.py']

model = dict(
    backbone=dict(arch='b0', drop_path_rate=0.1,
                  init_cfg=dict(type='Pretrained', checkpoint='https://cloud.tsinghua.edu.cn/f/5d1f01532b104da28e7b/?dl=1')),
    neck=dict(in_channels=[32, 64, 160, 256]))  # B0's stage widths
