# LightHamHead + PolaFormer++-B1 on ADE20K, 512x512 crops, 160k iterations, 8 GPUs x 8 images: the B2 recipe
# with the B1 backbone (official downstream/segmentation/configs/PolaPP/polapp_b1.py, drop path 0.1).
# ImageNet-1k weights at checkpoints/polapp_b1.pth.
_base_ = ['./segnext-ham_polapp-b2_8xb8-160k_ade20k-512x512.py']

model = dict(
    backbone=dict(arch='b1', drop_path_rate=0.1,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/polapp_b1.pth', use_ema=False)),
    decode_head=dict(in_channels=[64, 192, 384]))
