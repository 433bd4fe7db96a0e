# InLine-Swin-S backbone (ImageNet-1k pretrained at 224x224): pola_swin_small.py with the
# injective linear attention of InLine (NeurIPS 2024)
# (one word differs: type='InLineSwin'). Use it like pola_swin_small.py;
# the official InLine ImageNet file at checkpoints/inline_swin_small.pth loads as is.
_base_ = ['./pola_swin_small.py']

backbone = dict(type='InLineSwin', init_cfg=dict(checkpoint='checkpoints/inline_swin_small.pth'))
