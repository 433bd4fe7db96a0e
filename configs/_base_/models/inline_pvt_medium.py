# InLine-PVT-M backbone (ImageNet-1k pretrained at 224x224): pola_pvt_medium.py with the
# injective linear attention of InLine (NeurIPS 2024)
# (one word differs: type='InLinePVT'). Use it like pola_pvt_medium.py;
# the official InLine ImageNet file at checkpoints/inline_pvt_medium.pth loads as is.
_base_ = ['./pola_pvt_medium.py']

backbone = dict(type='InLinePVT', init_cfg=dict(checkpoint='checkpoints/inline_pvt_medium.pth'))
