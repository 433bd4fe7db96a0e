# InLine-PVT-M (37.6 M parameters): ImageNet-1k from scratch with the official recipe of
# LeapLabTHU/InLine (cfgs/inline_pvt_m.yaml), which is the Pola-PVT-M recipe
# (../pola-pvt-m_8xb64_in1k.py) with the injective linear attention (InLine, NeurIPS 2024) and 128 images per GPU.
#   tools/dist_train.sh configs/classification/inline/inline-pvt-m_8xb128_in1k.py 8 --amp  (official: fp16)
#   tools/test.py configs/classification/inline/inline-pvt-m_8xb128_in1k.py CHECKPOINT  (official files load as is)
_base_ = ['../pola-pvt-m_8xb64_in1k.py']

model = dict(kind='inline')

train_dataloader = dict(batch_size=128)  # the official batch per GPU (the lr scales with it)
