# UperNet + InLine-DeiT-B (384 channels, pretrained at 448x448) on ADE20K, 512x512 crops, 160k iterations, 8 GPUs x 2
# images: ./upernet_inline-deit-s_8xb2-160k_ade20k-512x512.py (mmseg's DeiT UperNet recipe with MultiLevelNeck) with
# the base backbone (mmseg's DeiT-B recipe, vit_deit-b16_mln_upernet_8xb2-160k_ade20k-512x512.py, drop path 0.1).
# Every number and its source: docs/recipes.md. Backbone weights: the official InLine-DeiT-B ImageNet weights,
# downloaded from its release (mmpola/checkpoint/sources.py); offline: --cfg-options
# model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['./upernet_inline-deit-s_8xb2-160k_ade20k-512x512.py']

model = dict(
    backbone=dict(arch='base', drop_path_rate=0.1,
                  init_cfg=dict(type='Pretrained', checkpoint='https://cloud.tsinghua.edu.cn/f/10bdd726d4b0435eb34e/?dl=1')),
    # DeiT-B's width 384 at every level
    neck=dict(in_channels=[384, 384, 384, 384], out_channels=384),
    decode_head=dict(in_channels=[384, 384, 384, 384]),
    auxiliary_head=dict(in_channels=384))
