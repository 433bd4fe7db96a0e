# UperNet + InLine-DeiT-T (192 channels, pretrained at 224x224) on ADE20K, 512x512 crops, 160k iterations, 8 GPUs x 2
# images: ./upernet_inline-deit-s_8xb2-160k_ade20k-512x512.py (mmseg's DeiT UperNet recipe with MultiLevelNeck) with
# the tiny backbone (mmseg has no DeiT-T UperNet; drop path 0.1 as its DeiT-S and DeiT-B ones). Every number and its
# source: docs/recipes.md. Backbone weights: the official InLine-DeiT-T ImageNet weights, downloaded from its release
# (mmpola/checkpoint/sources.py); offline: --cfg-options model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['./upernet_inline-deit-s_8xb2-160k_ade20k-512x512.py']

model = dict(
    backbone=dict(arch='tiny', drop_path_rate=0.1,
                  init_cfg=dict(type='Pretrained', checkpoint='https://cloud.tsinghua.edu.cn/f/1d6b8191ad6d4114b291/?dl=1')),
    # DeiT-T's width 192 at every level
    neck=dict(in_channels=[192, 192, 192, 192], out_channels=192),
    decode_head=dict(in_channels=[192, 192, 192, 192]),
    auxiliary_head=dict(in_channels=192))
