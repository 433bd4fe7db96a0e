# UperNet + PolaFormer++-B2 on ADE20K, 512x512 crops, 160k iterations, 8 GPUs x 2 images: an mmpola
# recipe (PolaFormer++'s own ADE20K recipe is segnext-ham_polapp-b2_8xb8-160k_ade20k-512x512.py): Swin's
# UperNet recipe (see _base_/upernet_8xb2-160k_ade20k-512x512.py) with the PolaPP-B2 backbone of
# configs/_base_/models/polapp_b2.py, its BatchNorm statistics frozen (norm_eval) as the official
# PolaFormer++ segmentation backbone does. ImageNet-1k weights at checkpoints/polapp_b2.pth. Every
# number and its source: docs/recipes.md.
_base_ = ['./_base_/upernet_8xb2-160k_ade20k-512x512.py', '../_base_/models/polapp_b2.py']

# the shared backbone moves into the model (pop: the dumped config holds it once); the channels are
# read for the decode head, then popped for the auxiliary head (stage 3)
model = dict(
    backbone=dict(_base_.pop('backbone'), _delete_=True, drop_path_rate=0.1, norm_eval=True),
    decode_head=dict(in_channels=_base_.backbone_out_channels),
    auxiliary_head=dict(in_channels=_base_.pop('backbone_out_channels')[2]))
