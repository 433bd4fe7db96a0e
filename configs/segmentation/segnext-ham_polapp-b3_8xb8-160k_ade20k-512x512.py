# LightHamHead + PolaFormer++-B3 on ADE20K, 512x512 crops, 160k iterations, 8 GPUs x 8 images: the B2 recipe
# with the B3 backbone (official downstream/segmentation/configs/PolaPP/polapp_b3.py, drop path 0.15).
# ImageNet-1k weights at checkpoints/polapp_b3.pth.
_base_ = ['./segnext-ham_polapp-b2_8xb8-160k_ade20k-512x512.py']

model = dict(
    backbone=dict(arch='b3', drop_path_rate=0.15,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/polapp_b3.pth', use_ema=False)),
    decode_head=dict(in_channels=[128, 320, 512]))
