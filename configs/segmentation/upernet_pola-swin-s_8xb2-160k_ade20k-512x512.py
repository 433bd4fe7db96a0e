# UperNet + Pola-Swin-S on ADE20K, 512x512 crops, 160k iterations, 8 GPUs x 2 images: Swin's UperNet
# recipe (see _base_/upernet_8xb2-160k_ade20k-512x512.py) with the Pola-Swin-S backbone of
# configs/_base_/models/pola_swin_small.py, drop path 0.3 as Swin's. ImageNet-1k weights at
# checkpoints/pola_swin_small.pth. Every number and its source: docs/recipes.md.
_base_ = ['./_base_/upernet_8xb2-160k_ade20k-512x512.py', '../_base_/models/pola_swin_small.py']

# the shared backbone moves into the model (pop: the dumped config holds it once); the channels are
# read for the decode head, then popped for the auxiliary head (stage 3)
model = dict(
    backbone=dict(_base_.pop('backbone'), _delete_=True, drop_path_rate=0.3),
    decode_head=dict(in_channels=_base_.backbone_out_channels),
    auxiliary_head=dict(in_channels=_base_.pop('backbone_out_channels')[2]))
