# InLine-DeiT-S backbone (ImageNet-1k pretrained at 288x288; 320 channels, 12 blocks of 10 heads), shared by
# every task config: the plain ViT with the injective linear attention of InLine (NeurIPS 2024) in every
# block. Outputs: the patch-token maps (stride 16, the class token dropped) of blocks 2, 5, 8 and 11;
# a pyramid neck makes strides 4-32 of them (mmseg's MultiLevelNeck for UperNet, mmpola's
# SimpleFeaturePyramid for detection). pos_embed follows the input size (bicubic, as mmseg's ViT).
#
# Inherit it next to an mmdet / mmseg base and move the backbone into the model with
# `_base_.pop('backbone')`, as the Pola bases (see pola_pvt_tiny.py). init_cfg downloads the official
# InLine ImageNet weights (its release's link, mmpola/checkpoint/sources.py; cached in torch hub's checkpoints
# folder); offline: --cfg-options model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['./pola_common.py']

backbone = dict(
    type='InLineDeiT',
    arch='small',
    out_indices=(2, 5, 8, 11),
    final_norm=False,
    drop_path_rate=0.1,
    frozen_stages=-1,
    with_cp=False,
    init_cfg=dict(type='Pretrained', checkpoint='https://cloud.tsinghua.edu.cn/f/2f3898b07e9247f3beb3/?dl=1'))
backbone_out_channels = [320, 320, 320, 320]
