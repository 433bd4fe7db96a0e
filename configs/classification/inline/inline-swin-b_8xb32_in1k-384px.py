# InLine-Swin-B at 384x384: fine-tuning of the 224 model with the official recipe of LeapLabTHU/InLine
# (cfgs/inline_swin_b_384.yaml), which is the Pola-Swin-B 384 recipe (../pola-swin-b_8xb32_in1k-384px.py)
# with the injective linear attention in the released layout 'IIMS2'. Starts from the 224 weights at
# checkpoints/inline_swin_base.pth.
#   tools/dist_train.sh configs/classification/inline/inline-swin-b_8xb32_in1k-384px.py 8 --amp
_base_ = ['../pola-swin-b_8xb32_in1k-384px.py']

model = dict(kind='inline', attn_type='IIMS2', init_cfg=dict(checkpoint='checkpoints/inline_swin_base.pth'))
