# UperNet + InLine-Swin-T on ADE20K, 512x512 crops, 160k iterations: ../upernet_pola-swin-t_8xb2-160k_ade20k-512x512.py
# with the injective linear attention of InLine (NeurIPS 2024) in the backbone, everything else identical.
# Backbone weights: the official InLine-Swin-T ImageNet file at checkpoints/inline_swin_tiny.pth (or
# --cfg-options model.backbone.init_cfg=None).
_base_ = ['../upernet_pola-swin-t_8xb2-160k_ade20k-512x512.py']

model = dict(backbone=dict(type='InLineSwin', init_cfg=dict(checkpoint='checkpoints/inline_swin_tiny.pth')))
