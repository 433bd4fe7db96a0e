# FLatten-PVT-T backbone (ImageNet-1k pretrained at 224x224): pola_pvt_tiny.py with the
# focused linear attention of FLatten Transformer (ICCV 2023)
# (one word differs: type='FLattenPVT'). Use it like pola_pvt_tiny.py;
# init_cfg downloads the official FLatten ImageNet weights (its release's link, mmpola/checkpoint/sources.py;
# cached in torch hub's checkpoints folder); offline: --cfg-options model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['./pola_pvt_tiny.py']

backbone = dict(
    type='FLattenPVT',
    init_cfg=dict(checkpoint='https://cloud.tsinghua.edu.cn/f/3ab1d773f19d45648690/?dl=1'))
