# UperNet + FLatten-CSWin-S on ADE20K, 512x512 crops, 160k iterations, 8 GPUs x 2 images: CSWin's UperNet
# recipe (microsoft/CSWin-Transformer segmentation/configs/cswin/upernet_cswin_small.py: Swin's, drop path
# 0.4): ./upernet_flatten-cswin-t_8xb2-160k_ade20k-512x512.py with the CSWin-S backbone. Every number
# and its source: docs/recipes.md.
# Backbone weights: checkpoints/flatten_cswin_small.pth (the FLatten release publishes none; train them with
# configs/classification/flatten/), or --cfg-options model.backbone.init_cfg=None.
_base_ = ['./upernet_flatten-cswin-t_8xb2-160k_ade20k-512x512.py']

model = dict(
    backbone=dict(arch='small', drop_path_rate=0.4,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/flatten_cswin_small.pth')),
    decode_head=dict(in_channels=[64, 128, 256, 512]),  # CSWin-S's stage widths
    auxiliary_head=dict(in_channels=256))
