# InLine-PVT-S backbone (ImageNet-1k pretrained at 224x224): pola_pvt_small.py with the
# injective linear attention of InLine (NeurIPS 2024)
# (one word differs: type='InLinePVT'). Use it like pola_pvt_small.py;
# the official InLine ImageNet file at checkpoints/inline_pvt_small.pth loads as is.
_base_ = ['./pola_pvt_small.py']

backbone = dict(type='InLinePVT', init_cfg=dict(checkpoint='checkpoints/inline_pvt_small.pth'))
