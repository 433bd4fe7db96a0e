# InLine-Swin-B backbone (ImageNet-1k pretrained at 224x224): pola_swin_base.py with the
# injective linear attention of InLine (NeurIPS 2024)
# (type='InLineSwin' and the released attention layout attn_type='IIMS2'). Use it like pola_swin_base.py;
# init_cfg downloads the official InLine ImageNet weights (its release's link, mmpola/checkpoint/sources.py;
# cached in torch hub's checkpoints folder); offline: --cfg-options model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['./pola_swin_base.py']

backbone = dict(
    type='InLineSwin',
    attn_type='IIMS2',
    init_cfg=dict(checkpoint='https://cloud.tsinghua.edu.cn/f/bf23564bb64c420aafe1/?dl=1'))
