# LightHamHead + PolaFormer++-B0 on ADE20K, 512x512 crops, 160k iterations, 8 GPUs x 8 images: the B2 recipe (official
# downstream/segmentation/configs/PolaPP/polapp_b2.py) with the B0 backbone. The PolaFormer++ release has no B0
# segmentation config; drop path 0.1 as the official B1 / B2 segmentation configs. Every number and its source:
# docs/recipes.md. ImageNet-1k weights at checkpoints/polapp_b0.pth.
_base_ = ['./segnext-ham_polapp-b2_8xb8-160k_ade20k-512x512.py']

model = dict(
    backbone=dict(arch='b0', drop_path_rate=0.1,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/polapp_b0.pth', use_ema=False)),
    decode_head=dict(in_channels=[64, 128, 384]))  # B0's widths of stages 2-4
