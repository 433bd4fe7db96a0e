# UperNet + FLatten-Swin-T on ADE20K, 512x512 crops, 160k iterations: ../upernet_pola-swin-t_8xb2-160k_ade20k-512x512.py
# with the focused linear attention of FLatten Transformer (ICCV 2023) in the backbone, everything else identical.
# Backbone weights: the official FLatten-Swin-T ImageNet file at checkpoints/flatten_swin_tiny.pth (or
# --cfg-options model.backbone.init_cfg=None).
_base_ = ['../upernet_pola-swin-t_8xb2-160k_ade20k-512x512.py']

model = dict(backbone=dict(type='FLattenSwin', init_cfg=dict(checkpoint='checkpoints/flatten_swin_tiny.pth')))
