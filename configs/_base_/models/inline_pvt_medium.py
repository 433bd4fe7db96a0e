# InLine-PVT-M backbone (ImageNet-1k pretrained at 224x224): pola_pvt_medium.py with the
# injective linear attention of InLine (NeurIPS 2024)
# (one word differs: type='InLinePVT'). Use it like pola_pvt_medium.py;
# init_cfg downloads the official InLine ImageNet weights (its release's link, mmpola/checkpoint/sources.py;
# cached in torch hub's checkpoints folder); offline: --cfg-options model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['./pola_pvt_medium.py']

backbone = dict(
    type='InLinePVT',
    init_cfg=dict(checkpoint='https://cloud.tsinghua.edu.cn/f/a72aec31e6084bc0a280/?dl=1'))
