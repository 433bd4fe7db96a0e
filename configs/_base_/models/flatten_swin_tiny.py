# FLatten-Swin-T backbone (ImageNet-1k pretrained at 224x224): pola_swin_tiny.py with the
# focused linear attention of FLatten Transformer (ICCV 2023)
# (one word differs: type='FLattenSwin'). Use it like pola_swin_tiny.py;
# init_cfg downloads the official FLatten ImageNet weights (its release's link, mmpola/checkpoint/sources.py;
# cached in torch hub's checkpoints folder); offline: --cfg-options model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['./pola_swin_tiny.py']

backbone = dict(
    type='FLattenSwin',
    init_cfg=dict(checkpoint='https://cloud.tsinghua.edu.cn/f/e1518e76703e4e57a7f2/?dl=1'))
