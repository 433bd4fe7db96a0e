# FLatten-PVTv2-B0 backbone (ImageNet-1k pretrained at 224x224), shared by every task config: PVTv2
# (whai362/PVT) with the focused linear attention of FLatten Transformer (ICCV 2023) in every stage
# (the released layout 'LLLL', la_sr_ratios '1111'). Outputs: the four stage maps after PVTv2's trained
# stage norms, channels below.
#
# Inherit it next to an mmdet / mmseg base and move the backbone into the model with
# `_base_.pop('backbone')`, as the Pola bases (see pola_pvt_tiny.py). init_cfg downloads the official
# FLatten ImageNet weights (its release's link, mmpola/checkpoint/sources.py; cached in torch hub's checkpoints
# folder); offline: --cfg-options model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['./pola_common.py']

backbone = dict(
    type='FLattenPVTv2',
    arch='b0',
    pretrain_img_size=224,
    out_indices=(0, 1, 2, 3),
    drop_path_rate=0.1,
    frozen_stages=-1,
    with_cp=False,
    init_cfg=dict(type='Pretrained', checkpoint='https://cloud.tsinghua.edu.cn/f/5d1f01532b104da28e7b/?dl=1'))
backbone_out_channels = [32, 64, 160, 256]
