# Semantic FPN on ADE20K, 40k iterations with FLatten-PVT-M: ../fpn_pola-pvt-m_8xb4-40k_ade20k-512x512.py with the
# focused linear attention of FLatten Transformer (ICCV 2023) in the backbone, everything else identical, so the two
# compare the attention alone. Every number and its source: docs/recipes.md. Backbone weights: the FLatten release
# publishes no FLatten-PVT-M ImageNet weights; train them with configs/classification/flatten/ and put the checkpoint
# at checkpoints/flatten_pvt_medium.pth, or train from scratch with --cfg-options model.backbone.init_cfg=None.
_base_ = ['../fpn_pola-pvt-m_8xb4-40k_ade20k-512x512.py']

model = dict(backbone=dict(
    type='FLattenPVT',
    init_cfg=dict(type='Pretrained', checkpoint='checkpoints/flatten_pvt_medium.pth')))
