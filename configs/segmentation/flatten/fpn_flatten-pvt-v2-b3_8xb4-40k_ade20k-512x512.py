# Semantic FPN + FLatten-PVTv2-B3 on ADE20K, 512x512 crops, 40k iterations, 8 GPUs x 4 images:
# ./fpn_flatten-pvt-v2-b2_8xb4-40k_ade20k-512x512.py with the B3 backbone, drop path 0.1. Every number and its source:
# docs/recipes.md. Backbone weights: checkpoints/flatten_pvt_v2_b3.pth (the FLatten release publishes none; see the B2
# config).
_base_ = ['./fpn_flatten-pvt-v2-b2_8xb4-40k_ade20k-512x512.py']

model = dict(
    backbone=dict(arch='b3', drop_path_rate=0.1,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/flatten_pvt_v2_b3.pth')))
