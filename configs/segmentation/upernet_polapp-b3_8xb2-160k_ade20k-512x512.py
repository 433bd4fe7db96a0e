# UperNet + PolaFormer++-B3 on ADE20K, 512x512 crops, 160k iterations: the B2 recipe with the B3 backbone
# (drop path 0.15 as the official B3 configs; ImageNet-1k weights at checkpoints/polapp_b3.pth).
_base_ = ['./upernet_polapp-b2_8xb2-160k_ade20k-512x512.py']

model = dict(
    backbone=dict(arch='b3', drop_path_rate=0.15,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/polapp_b3.pth', use_ema=False)),
    decode_head=dict(in_channels=[64, 128, 320, 512]),
    auxiliary_head=dict(in_channels=320))
