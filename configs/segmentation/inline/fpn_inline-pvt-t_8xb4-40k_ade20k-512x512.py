# Semantic FPN + InLine-PVT-T on ADE20K, 512x512 crops, 40k iterations: ../fpn_pola-pvt-t_8xb4-40k_ade20k-512x512.py
# with the injective linear attention of InLine (NeurIPS 2024) in the backbone, everything else identical.
# Backbone weights: the official InLine-PVT-T ImageNet file at checkpoints/inline_pvt_tiny.pth (or
# --cfg-options model.backbone.init_cfg=None).
_base_ = ['../fpn_pola-pvt-t_8xb4-40k_ade20k-512x512.py']

model = dict(backbone=dict(type='InLinePVT', init_cfg=dict(checkpoint='checkpoints/inline_pvt_tiny.pth')))
