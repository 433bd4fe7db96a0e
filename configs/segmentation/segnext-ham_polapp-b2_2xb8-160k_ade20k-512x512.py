# LightHamHead (SegNeXt's Hamburger decoder) + PolaFormer++-B2 on ADE20K, 512x512 crops, 160k iterations,
# as the official PolaPP-B2 segmentation config: the head reads stages 2-4 (512 channels, NMF rank 16,
# GroupNorm), AdamW lr 6e-5, weight decay 0.01 without decay on norms, 10x lr for the head, 1500
# warm-up iterations then poly to 0. The official run used 8 images per GPU (total 16 on 2 GPUs, the
# batch of mmseg's SegNeXt recipe this config inherits; --auto-scale-lr rescales the lr for another one).
# The backbone returns only the stages the head reads (no unused output norm).
# ImageNet-1k weights at checkpoints/polapp_b2.pth (see configs/_base_/models/polapp_b2.py).
_base_ = ['mmseg::segnext/segnext_mscan-t_1xb16-adamw-160k_ade20k-512x512.py', '../_base_/models/polapp_b2.py',
          '../_base_/runtime.py']
# mmpola's atomic checkpoint saves (configs/_base_/runtime.py says why this is set here)
default_hooks = dict(checkpoint=dict(type='mmpola.SafeCheckpointHook'))

model = dict(
    backbone=dict(_delete_=True, **dict(_base_.backbone, out_indices=(1, 2, 3))),
    decode_head=dict(in_channels=_base_.backbone_out_channels[1:], in_index=[0, 1, 2], channels=512,
                     ham_channels=512))

train_dataloader = dict(batch_size=8)
auto_scale_lr = dict(enable=False, base_batch_size=16)
