# Pola-PVT-T (12.9 M parameters, 2.3 GMACs): official ImageNet top-1 78.8.
# ImageNet-1k from scratch, 8 GPUs x 128 images (1024 per step; lr 5e-4 x 1024 / 512), official recipe
# (the official training configuration). Train / test:
#   tools/dist_train.sh configs/classification/pola-pvt-t_8xb128_in1k.py 8 [--amp]
#   GPUS=8 tools/slurm_train.sh PARTITION JOB configs/classification/pola-pvt-t_8xb128_in1k.py WORK_DIR
#   tools/test.py configs/classification/pola-pvt-t_8xb128_in1k.py CHECKPOINT   (official PolaFormer files load as is)
# The checkpoint feeds every dense config's backbone: init_cfg=dict(type='Pretrained', checkpoint=...).
_base_ = [
    './_base_/datasets/imagenet_timm.py',
    './_base_/schedules/pola-pvt_310e.py',
    './_base_/default_runtime.py',
]

model = dict(
    type='ClassificationModel',
    family='pvt',
    arch='tiny',
    num_classes=1000,
    drop_path_rate=0.1,
    label_smoothing=0.1)

train_dataloader = dict(batch_size=128)
