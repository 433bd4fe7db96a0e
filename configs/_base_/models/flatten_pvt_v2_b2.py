# FLatten-PVTv2-B2 backbone (ImageNet-1k pretrained at 224x224), shared by every task config: PVTv2
# (whai362/PVT) with the focused linear attention of FLatten Transformer (ICCV 2023) in every stage
# (the released layout 'LLLL', la_sr_ratios '1111'). Outputs: the four stage maps after PVTv2's trained
# stage norms, channels below.
#
# Inherit it next to an mmdet / mmseg base and move the backbone into the model with
# `_base_.pop('backbone')`, as the Pola bases (see pola_pvt_tiny.py). The FLatten release publishes no
# B2 weights: put an ImageNet checkpoint (configs/classification/flatten/flatten-pvt-v2-b2_8xb128_in1k.py) at
# checkpoints/flatten_pvt_v2_b2.pth, or train from scratch with model.backbone.init_cfg=None.
_base_ = ['./pola_common.py']

backbone = dict(
    type='FLattenPVTv2',
    arch='b2',
    pretrain_img_size=224,
    out_indices=(0, 1, 2, 3),
    drop_path_rate=0.1,
    frozen_stages=-1,
    with_cp=False,
    init_cfg=dict(type='Pretrained', checkpoint='checkpoints/flatten_pvt_v2_b2.pth'))
backbone_out_channels = [64, 128, 320, 512]
