# FLatten-PVT-M backbone (ImageNet-1k pretrained at 224x224): pola_pvt_medium.py with the
# focused linear attention of FLatten Transformer (ICCV 2023)
# (one word differs: type='FLattenPVT'). Use it like pola_pvt_medium.py;
# the official FLatten ImageNet file at checkpoints/flatten_pvt_medium.pth loads as is.
_base_ = ['./pola_pvt_medium.py']

backbone = dict(type='FLattenPVT', init_cfg=dict(checkpoint='checkpoints/flatten_pvt_medium.pth'))
