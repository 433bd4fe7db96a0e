# Semantic FPN + Pola-PVT-T on ADE20K, 512x512 crops, 40k iterations, 8 GPUs x 4 images: PVT's recipe
# (whai362/PVT segmentation/configs/sem_fpn/PVT/fpn_pvt_t_ade20k_40k.py; see
# _base_/fpn_8xb4-40k_ade20k-512x512.py), which the PolaFormer paper follows for its PVT backbones, with
# the Pola-PVT-T backbone of configs/_base_/models/pola_pvt_tiny.py (drop path 0.1 as PVT's segmentation
# backbones). ImageNet-1k weights at checkpoints/pola_pvt_tiny.pth (without them, train from scratch with
# --cfg-options model.backbone.init_cfg=None). Every number and its source: docs/recipes.md.
_base_ = ['./_base_/fpn_8xb4-40k_ade20k-512x512.py', '../_base_/models/pola_pvt_tiny.py']

# the shared backbone moves into the model (pop: the dumped config holds it once)
model = dict(
    backbone=dict(_base_.pop('backbone'), _delete_=True, drop_path_rate=0.1),
    neck=dict(in_channels=_base_.pop('backbone_out_channels')))
