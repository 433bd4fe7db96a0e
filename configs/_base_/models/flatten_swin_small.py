# FLatten-Swin-S backbone (ImageNet-1k pretrained at 224x224): pola_swin_small.py with the
# focused linear attention of FLatten Transformer (ICCV 2023)
# (one word differs: type='FLattenSwin'). Use it like pola_swin_small.py;
# init_cfg downloads the official FLatten ImageNet weights (its release's link, mmpola/checkpoint/sources.py;
# cached in torch hub's checkpoints folder); offline: --cfg-options model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['./pola_swin_small.py']

backbone = dict(
    type='FLattenSwin',
    init_cfg=dict(checkpoint='https://cloud.tsinghua.edu.cn/f/94188e52af354bf4a88b/?dl=1'))
