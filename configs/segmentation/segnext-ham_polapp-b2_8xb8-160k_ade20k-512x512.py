# LightHamHead (SegNeXt's Hamburger decoder) + PolaFormer++-B2 on ADE20K, 512x512 crops, 160k iterations,
# 8 GPUs x 8 images, as the official PolaFormer++ downstream/segmentation/configs/PolaPP/polapp_b2.py
# (launched by its run.sh on 8 GPUs with samples_per_gpu=8): the head reads stages 2-4 (512 channels, NMF
# rank 16, GroupNorm), AdamW lr 6e-5, weight decay 0.01 without decay on norms and `pos_block`, 10x lr for
# the head, 1500 warm-up iterations then poly to 0; the backbone's BatchNorm statistics stay frozen
# (norm_eval, the official segmentation backbone's train()); the whole image is tested at its resized
# size, without padding. mmseg's SegNeXt config (which this one inherits) has the same head, optimizer
# and schedule. Every number and its source: docs/recipes.md.
# The backbone returns only the stages the head reads (no unused output norm).
# ImageNet-1k weights at checkpoints/polapp_b2.pth (see configs/_base_/models/polapp_b2.py).
_base_ = ['mmseg::segnext/segnext_mscan-t_1xb16-adamw-160k_ade20k-512x512.py', '../_base_/models/polapp_b2.py']

_base_.pop('checkpoint_file')  # mmseg's MSCAN checkpoint URL: not this model's weights
_base_.pop('optimizer')  # mmseg's schedule base leaves its SGD settings in a top-level variable
_base_.pop('data_preprocessor')  # mmseg's copy pads test images to 32; the model's (below) does not

# the shared PolaPP-B2 backbone moves into the model (pop: the dumped config holds it once)
model = dict(
    data_preprocessor=dict(test_cfg=None),
    backbone=dict(_base_.pop('backbone'), _delete_=True, drop_path_rate=0.1, norm_eval=True, out_indices=(1, 2, 3)),
    decode_head=dict(in_channels=_base_.pop('backbone_out_channels')[1:], in_index=[0, 1, 2], channels=512,
                     ham_channels=512))

# 8 GPUs x 8 images; --auto-scale-lr rescales the lr for another total batch size.
train_dataloader = dict(batch_size=8)
auto_scale_lr = dict(enable=False, base_batch_size=64)
