# InLine-Swin-S backbone (ImageNet-1k pretrained at 224x224): pola_swin_small.py with the
# injective linear attention of InLine (NeurIPS 2024)
# (type='InLineSwin' and the released attention layout attn_type='IISS'). Use it like pola_swin_small.py;
# the official InLine ImageNet file at checkpoints/inline_swin_small.pth loads as is.
_base_ = ['./pola_swin_small.py']

backbone = dict(type='InLineSwin', attn_type='IISS', init_cfg=dict(checkpoint='checkpoints/inline_swin_small.pth'))
