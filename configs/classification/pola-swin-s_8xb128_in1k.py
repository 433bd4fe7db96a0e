# Pola-Swin-S (50.6 M parameters, 8.9 GMACs): official ImageNet top-1 83.6.
# ImageNet-1k from scratch, 8 GPUs x 128 images (1024 per step; lr 5e-4 x 1024 / 512), official recipe
# (the official training configuration). Train / test:
#   tools/dist_train.sh configs/classification/pola-swin-s_8xb128_in1k.py 8 [--amp]
#   GPUS=8 tools/slurm_train.sh PARTITION JOB configs/classification/pola-swin-s_8xb128_in1k.py WORK_DIR
#   tools/test.py configs/classification/pola-swin-s_8xb128_in1k.py CHECKPOINT   (official PolaFormer files load as is)
# The checkpoint feeds every dense config's backbone: init_cfg=dict(type='Pretrained', checkpoint=...).
_base_ = [
    './_base_/datasets/imagenet_timm.py',
    './_base_/schedules/pola-swin_300e.py',
    './_base_/default_runtime.py',
]

model = dict(
    type='ClassificationModel',
    family='swin',
    arch='small',
    num_classes=1000,
    drop_path_rate=0.3,
    label_smoothing=0.1)

train_dataloader = dict(batch_size=128)
