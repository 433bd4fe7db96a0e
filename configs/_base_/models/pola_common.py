# Settings shared by every Pola backbone base (one file per size inherits this one).
custom_imports = dict(imports=['mmpola'], allow_failed_imports=False)

# No weight decay for norms, position parameters, the softmax stages' relative position bias
# and Pola's exponent / temperature logits (mmengine matches these as substrings of parameter
# names): optim_wrapper = dict(paramwise_cfg=dict(custom_keys=_base_.backbone_no_decay_keys)).
backbone_no_decay_keys = {
    'norm': dict(decay_mult=0.),
    'pos_embed': dict(decay_mult=0.),
    'positional_encoding': dict(decay_mult=0.),
    'relative_position_bias_table': dict(decay_mult=0.),
    'attn.power': dict(decay_mult=0.),
    'attn.scale': dict(decay_mult=0.),
}
