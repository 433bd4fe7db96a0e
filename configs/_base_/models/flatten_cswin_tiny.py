# FLatten-CSWin-T backbone (ImageNet-1k pretrained at 224x224), shared by every task config: CSWin
# (microsoft/CSWin-Transformer) with the focused linear attention of FLatten Transformer (ICCV 2023)
# in stages 1-2 and CSWin's stripe softmax in stages 3-4 (the released layout 'LLSS'). Outputs: the four
# stage maps through the output norms norm1..norm4 of the official dense CSWin, channels below.
#
# Inherit it next to an mmdet / mmseg base and move the backbone into the model with
# `_base_.pop('backbone')`, as the Pola bases (see pola_pvt_tiny.py). init_cfg downloads the official
# FLatten ImageNet weights (its release's link, mmpola/checkpoint/sources.py; cached in torch hub's
# checkpoints folder; the EMA weights when the file holds them); offline:
# --cfg-options model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['./pola_common.py']

backbone = dict(
    type='FLattenCSWin',
    arch='tiny',
    out_indices=(0, 1, 2, 3),
    drop_path_rate=0.2,
    frozen_stages=-1,
    with_cp=False,
    init_cfg=dict(type='Pretrained', checkpoint='https://cloud.tsinghua.edu.cn/f/48ba765ba8b0451d9d5a/?dl=1'))
backbone_out_channels = [64, 128, 256, 512]
