# FLatten-Swin-B at 384x384: fine-tuning of the 224 model with the official recipe of
# LeapLabTHU/FLatten-Transformer (cfgs/flatten_swin_b_384.yaml, README "Fine-tuning on higher
# resolution"), which is the Pola-Swin-B 384 recipe (../pola-swin-b_8xb32_in1k-384px.py) with the focused
# linear attention. Starts from the 224 weights at checkpoints/flatten_swin_base.pth.
#   tools/dist_train.sh configs/classification/flatten/flatten-swin-b_8xb32_in1k-384px.py 8 [--amp]
_base_ = ['../pola-swin-b_8xb32_in1k-384px.py']

model = dict(kind='flatten', init_cfg=dict(checkpoint='checkpoints/flatten_swin_base.pth'))
