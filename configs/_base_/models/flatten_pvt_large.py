# FLatten-PVT-L backbone (ImageNet-1k pretrained at 224x224): pola_pvt_large.py with the
# focused linear attention of FLatten Transformer (ICCV 2023)
# (one word differs: type='FLattenPVT'). Use it like pola_pvt_large.py;
# the official FLatten ImageNet file at checkpoints/flatten_pvt_large.pth loads as is.
_base_ = ['./pola_pvt_large.py']

backbone = dict(type='FLattenPVT', init_cfg=dict(checkpoint='checkpoints/flatten_pvt_large.pth'))
