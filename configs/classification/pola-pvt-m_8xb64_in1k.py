# Pola-PVT-M (40.0 M parameters, 7.8 GMACs); no official accuracy published.
# ImageNet-1k from scratch, 8 GPUs x 64 images (512 per step; lr 5e-4 x 512 / 512), official recipe
# (the official training configuration). Train / test:
#   tools/dist_train.sh configs/classification/pola-pvt-m_8xb64_in1k.py 8 [--amp]
#   GPUS=8 tools/slurm_train.sh PARTITION JOB configs/classification/pola-pvt-m_8xb64_in1k.py WORK_DIR
#   tools/test.py configs/classification/pola-pvt-m_8xb64_in1k.py CHECKPOINT   (official PolaFormer files load as is)
# The checkpoint feeds every dense config's backbone: init_cfg=dict(type='Pretrained', checkpoint=...).
_base_ = [
    './_base_/datasets/imagenet_timm.py',
    './_base_/schedules/pola-pvt_310e.py',
    './_base_/default_runtime.py',
]

model = dict(
    type='ClassificationModel',
    family='pvt',
    arch='medium',
    num_classes=1000,
    drop_path_rate=0.3,
    label_smoothing=0.1)

train_dataloader = dict(batch_size=64)

# the official yaml clips the gradient norm
optim_wrapper = dict(clip_grad=dict(max_norm=1.0, norm_type=2))
