# InLine-Swin-S backbone (ImageNet-1k pretrained at 224x224): pola_swin_small.py with the
# injective linear attention of InLine (NeurIPS 2024)
# (type='InLineSwin' and the released attention layout attn_type='IISS'). Use it like pola_swin_small.py;
# init_cfg downloads the official InLine ImageNet weights (its release's link, mmpola/checkpoint/sources.py;
# cached in torch hub's checkpoints folder); offline: --cfg-options model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['./pola_swin_small.py']

backbone = dict(
    type='InLineSwin',
    attn_type='IISS',
    init_cfg=dict(checkpoint='https://cloud.tsinghua.edu.cn/f/e9657fd247c04c7cb1a1/?dl=1'))
