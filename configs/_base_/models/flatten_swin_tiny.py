# FLatten-Swin-T backbone (ImageNet-1k pretrained at 224x224): pola_swin_tiny.py with the
# focused linear attention of FLatten Transformer (ICCV 2023)
# (one word differs: type='FLattenSwin'). Use it like pola_swin_tiny.py;
# the official FLatten ImageNet file at checkpoints/flatten_swin_tiny.pth loads as is.
_base_ = ['./pola_swin_tiny.py']

backbone = dict(type='FLattenSwin', init_cfg=dict(checkpoint='checkpoints/flatten_swin_tiny.pth'))
