# UperNet + InLine-DeiT-S on ADE20K, 512x512 crops, 160k iterations, 8 GPUs x 2 images: mmseg's DeiT-S
# UperNet recipe (open-mmlab/mmsegmentation configs/vit/vit_deit-s16_mln_upernet_8xb2-160k_ade20k-512x512.py
# on vit_vit-b16_mln_upernet_8xb2-160k_ade20k-512x512.py): the maps of blocks 2, 5, 8 and 11 through
# MultiLevelNeck (resized x4, x2, x1, x0.5: strides 4-32), UPerHead (512 channels) and an auxiliary
# FCNHead on the last level; AdamW lr 6e-5, weight decay 0.01 without decay on the position embedding,
# the class token and norms; 1500 warm-up iterations, poly decay; drop path 0.1. The InLine repository
# ships no segmentation configs. Data, heads and schedule are those of the other UperNet configs
# (../_base_/upernet_8xb2-160k_ade20k-512x512.py), which mmseg's ViT config shares.
# InLine-DeiT-S is 320 channels wide (not DeiT-S's 384) and pretrained at 288x288: its position
# embedding (18x18) is resized bicubically to the 32x32 patch grid of a 512 crop.
# Backbone weights: the official InLine-DeiT-S ImageNet weights, downloaded from its release
# (mmpola/checkpoint/sources.py); offline: --cfg-options model.backbone.init_cfg.checkpoint=PATH. Every
# number and its source: docs/recipes.md.
_base_ = ['../_base_/upernet_8xb2-160k_ade20k-512x512.py', '../../_base_/models/inline_deit_small.py']

# the shared backbone moves into the model (pop: the dumped config holds it once); its channels are read
# for the neck and the decode head, then popped for the auxiliary head (the last level)
model = dict(
    backbone=dict(_base_.pop('backbone'), _delete_=True, drop_path_rate=0.1),
    neck=dict(type='MultiLevelNeck', in_channels=_base_.backbone_out_channels, out_channels=320,
              scales=[4, 2, 1, 0.5]),
    decode_head=dict(in_channels=_base_.backbone_out_channels),
    auxiliary_head=dict(in_channels=_base_.pop('backbone_out_channels')[3], in_index=3))

optim_wrapper = dict(
    paramwise_cfg=dict(_delete_=True, custom_keys={
        'pos_embed': dict(decay_mult=0.),
        'cls_token': dict(decay_mult=0.),
        'norm': dict(decay_mult=0.)}))
