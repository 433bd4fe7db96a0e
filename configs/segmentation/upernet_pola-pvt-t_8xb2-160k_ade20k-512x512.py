# UperNet + Pola-PVT-T on ADE20K, 512x512 crops, 160k iterations, 8 GPUs x 2 images: an mmpola recipe
# (PVT's own ADE20K recipe is Semantic FPN, fpn_pola-pvt-t_8xb4-40k_ade20k-512x512.py): Swin's UperNet
# recipe (see _base_/upernet_8xb2-160k_ade20k-512x512.py) with the Pola-PVT-T backbone of
# configs/_base_/models/pola_pvt_tiny.py, drop path 0.1 as PVT's segmentation backbones. ImageNet-1k
# weights at checkpoints/pola_pvt_tiny.pth (without them, train from scratch with --cfg-options
# model.backbone.init_cfg=None). Every number and its source: docs/recipes.md.
_base_ = ['./_base_/upernet_8xb2-160k_ade20k-512x512.py', '../_base_/models/pola_pvt_tiny.py']

# the shared backbone moves into the model (pop: the dumped config holds it once); the channels are
# read for the decode head, then popped for the auxiliary head (stage 3)
model = dict(
    backbone=dict(_base_.pop('backbone'), _delete_=True, drop_path_rate=0.1),
    decode_head=dict(in_channels=_base_.backbone_out_channels),
    auxiliary_head=dict(in_channels=_base_.pop('backbone_out_channels')[2]))
