# Semantic FPN + FLatten-PVTv2-B2 on ADE20K, 512x512 crops, 40k iterations, 8 GPUs x 4 images: PVT's
# Semantic FPN recipe (see ../_base_/fpn_8xb4-40k_ade20k-512x512.py: AdamW lr 2e-4, weight decay 1e-4, poly
# decay) with the FLatten-PVTv2-B2 backbone of configs/_base_/models/flatten_pvt_v2_b2.py, drop path 0.1 as
# PVT's segmentation backbones. whai362/PVT ships Semantic FPN configs for PVTv1 only and the FLatten
# repository none: an mmpola choice. Every number and its source: docs/recipes.md.
#
# Backbone weights: the FLatten release publishes no B2 ImageNet weights; train them with
# configs/classification/flatten/flatten-pvt-v2-b2_8xb128_in1k.py and put the checkpoint at
# checkpoints/flatten_pvt_v2_b2.pth, or train from scratch with --cfg-options model.backbone.init_cfg=None.
_base_ = ['../_base_/fpn_8xb4-40k_ade20k-512x512.py', '../../_base_/models/flatten_pvt_v2_b2.py']

# the shared backbone moves into the model (pop: the dumped config holds it once)
model = dict(
    backbone=dict(_base_.pop('backbone'), _delete_=True, drop_path_rate=0.1),
    neck=dict(in_channels=_base_.pop('backbone_out_channels')))
