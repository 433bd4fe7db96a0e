# InLine-Swin-B backbone (ImageNet-1k pretrained at 224x224): pola_swin_base.py with the
# injective linear attention of InLine (NeurIPS 2024)
# (type='InLineSwin' and the released attention layout attn_type='IIMS2'). Use it like pola_swin_base.py;
# the official InLine ImageNet file at checkpoints/inline_swin_base.pth loads as is.
_base_ = ['./pola_swin_base.py']

backbone = dict(type='InLineSwin', attn_type='IIMS2', init_cfg=dict(checkpoint='checkpoints/inline_swin_base.pth'))
