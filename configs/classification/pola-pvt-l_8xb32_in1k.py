# Pola-PVT-L (54.4 M parameters, 11.5 GMACs; the official 'pola_pvt_b'); no official accuracy published.
# ImageNet-1k from scratch, 8 GPUs x 32 images (256 per step; lr 5e-4 x 256 / 512), official recipe
# (the official training configuration). Train / test:
#   tools/dist_train.sh configs/classification/pola-pvt-l_8xb32_in1k.py 8 [--amp]
#   GPUS=8 tools/slurm_train.sh PARTITION JOB configs/classification/pola-pvt-l_8xb32_in1k.py WORK_DIR
#   tools/test.py configs/classification/pola-pvt-l_8xb32_in1k.py CHECKPOINT   (official PolaFormer files load as is)
# The checkpoint feeds every dense config's backbone: init_cfg=dict(type='Pretrained', checkpoint=...).
_base_ = [
    './_base_/datasets/imagenet_timm.py',
    './_base_/schedules/pola-pvt_310e.py',
    './_base_/default_runtime.py',
]

model = dict(
    type='ClassificationModel',
    family='pvt',
    arch='large',
    num_classes=1000,
    drop_path_rate=0.3,
    label_smoothing=0.1)

train_dataloader = dict(batch_size=32)

# the official yaml clips the gradient norm
optim_wrapper = dict(clip_grad=dict(max_norm=1.0, norm_type=2))
