# InLine-DeiT-T (6.5 M parameters, trained and evaluated at 224x224): official ImageNet top-1 74.5.
# ImageNet-1k from scratch with the official recipe of LeapLabTHU/InLine (cfgs/inline_deit_t.yaml on
# config.py, main.py --amp), 8 GPUs x 512 images (lr 5e-4 x 4096 / 512): the config.py defaults, which are the
# Swin schedule of ../_base_/schedules/pola-swin_300e.py (AdamW, weight decay 0.05, 20 warm-up epochs, cosine
# to epoch 300, gradient norm clipped at 5.0), drop path 0.1, no weight decay on 1-D parameters, pos_embed and
# cls_token (the model's no_weight_decay); the plain ViT with InLine attention in every block. Every number
# and its source: docs/recipes.md.
#   tools/dist_train.sh configs/classification/inline/inline-deit-t_8xb512_in1k.py 8 --amp   (official: fp16)
#   tools/test.py configs/classification/inline/inline-deit-t_8xb512_in1k.py CHECKPOINT
#   (official files load as they are)
_base_ = ['../_base_/inline-deit_in1k.py']

model = dict(arch='tiny')

train_dataloader = dict(batch_size=512)
