# UperNet + FLatten-CSWin-B on ADE20K, 512x512 crops, 160k iterations, 8 GPUs x 2 images: CSWin's UperNet
# recipe (microsoft/CSWin-Transformer segmentation/configs/cswin/upernet_cswin_base.py: Swin's, drop path
# 0.6): ./upernet_flatten-cswin-t_8xb2-160k_ade20k-512x512.py with the CSWin-B backbone. Every number
# and its source: docs/recipes.md.
# Backbone weights: checkpoints/flatten_cswin_base.pth (the FLatten release publishes none; train them with
# configs/classification/flatten/), or --cfg-options model.backbone.init_cfg=None.
_base_ = ['./upernet_flatten-cswin-t_8xb2-160k_ade20k-512x512.py']

model = dict(
    backbone=dict(arch='base', drop_path_rate=0.6,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/flatten_cswin_base.pth')),
    decode_head=dict(in_channels=[96, 192, 384, 768]),  # CSWin-B's stage widths
    auxiliary_head=dict(in_channels=384))
