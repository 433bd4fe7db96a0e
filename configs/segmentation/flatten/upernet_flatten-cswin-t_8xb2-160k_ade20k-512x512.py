# UperNet + FLatten-CSWin-T on ADE20K, 512x512 crops, 160k iterations, 8 GPUs x 2 images: CSWin's UperNet
# recipe (microsoft/CSWin-Transformer segmentation/configs/cswin/upernet_cswin_tiny.py), which is Swin's
# (see ../_base_/upernet_8xb2-160k_ade20k-512x512.py: AdamW lr 6e-5, weight decay 0.01 without decay on
# norms, 1500 warm-up iterations, poly decay; drop path 0.3), with the FLatten-CSWin-T backbone of
# configs/_base_/models/flatten_cswin_tiny.py (its output norms norm1..norm4 are the official dense CSWin's).
# Backbone weights: the official FLatten-CSWin-T ImageNet weights, downloaded from its release
# (mmpola/checkpoint/sources.py); offline: --cfg-options model.backbone.init_cfg.checkpoint=PATH. Every
# number and its source: docs/recipes.md.
_base_ = ['../_base_/upernet_8xb2-160k_ade20k-512x512.py', '../../_base_/models/flatten_cswin_tiny.py']

# the shared backbone moves into the model (pop: the dumped config holds it once); the channels are
# read for the decode head, then popped for the auxiliary head (stage 3)
model = dict(
    backbone=dict(_base_.pop('backbone'), _delete_=True, drop_path_rate=0.3),
    decode_head=dict(in_channels=_base_.backbone_out_channels),
    auxiliary_head=dict(in_channels=_base_.pop('backbone_out_channels')[2]))
