# UperNet on ADE20K, 160k iterations with InLine-CSWin-B:
# ../flatten/upernet_flatten-cswin-b_8xb2-160k_ade20k-512x512.py
# with the injective linear attention of InLine (NeurIPS 2024) in stages 1-2 of the backbone (the released
# layout 'IISS'), everything else identical. Every number and its source: docs/recipes.md.
#
# Backbone weights: the official InLine-CSWin-B ImageNet weights, downloaded from its release
# (mmpola/checkpoint/sources.py); offline: --cfg-options model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['../flatten/upernet_flatten-cswin-b_8xb2-160k_ade20k-512x512.py']

model = dict(backbone=dict(
    type='InLineCSWin',
    init_cfg=dict(checkpoint='https://cloud.tsinghua.edu.cn/f/91e17121df284ae38521/?dl=1')))
