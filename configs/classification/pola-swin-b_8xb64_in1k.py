# Pola-Swin-B (89.1 M parameters, 15.7 GMACs): official ImageNet top-1 83.8.
# ImageNet-1k from scratch, 8 GPUs x 64 images (512 per step; lr 5e-4 x 512 / 512), official recipe
# (cfgs/pola_swin_b.yaml on the config.py defaults). Every number and its source: docs/recipes.md.
# Train / test:
#   tools/dist_train.sh configs/classification/pola-swin-b_8xb64_in1k.py 8 [--amp]
#   GPUS=8 tools/slurm_train.sh PARTITION JOB configs/classification/pola-swin-b_8xb64_in1k.py WORK_DIR
#   tools/test.py configs/classification/pola-swin-b_8xb64_in1k.py CHECKPOINT   (official PolaFormer files load as is)
# The checkpoint feeds every dense config's backbone: init_cfg=dict(type='Pretrained', checkpoint=...).
_base_ = [
    './_base_/datasets/imagenet_timm.py',
    './_base_/schedules/pola-swin_300e.py',
    './_base_/default_runtime.py',
]

model = dict(
    type='ClassificationModel',
    family='swin',
    arch='base',
    num_classes=1000,
    drop_path_rate=0.5,
    label_smoothing=0.1)

train_dataloader = dict(batch_size=64)
