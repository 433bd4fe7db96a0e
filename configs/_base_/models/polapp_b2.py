# PolaFormer++-B2 (PolaPP) backbone (ImageNet-1k pretrained at 224x224), shared by every task config.
#
# Inherit it next to an mmdet / mmseg base and move the backbone into the model with
# `_base_.pop('backbone')`, as the Pola bases (see pola_pvt_tiny.py). Put the ImageNet checkpoint at
# checkpoints/polapp_b2.pth (official PolaFormer++ file or our own classification run; both load as
# is), or train from scratch with model.backbone.init_cfg=None. `use_ema=False`: the official dense
# code reads the file's `model` weights (the raw ones of a main_ema.py checkpoint, not
# `state_dict_ema`); our classification runs with EMA on store the averaged weights there.
# Drop path as the official dense configs; BatchNorm statistics train (the official detection
# backbone has no norm_eval; the segmentation configs set norm_eval=True as its segmentation one).
_base_ = ['./pola_common.py']

backbone = dict(
    type='PolaPP',
    arch='b2',
    out_indices=(0, 1, 2, 3),
    drop_path_rate=0.1,
    frozen_stages=-1,
    norm_eval=False,
    with_cp=False,
    init_cfg=dict(type='Pretrained', checkpoint='checkpoints/polapp_b2.pth', use_ema=False))
backbone_out_channels = [64, 128, 256, 512]
