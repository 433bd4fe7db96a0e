# Runtime of the ImageNet runs: log every 100 iterations, validate and checkpoint every epoch
# (keep the last 3 and the best top-1), seed 0 (+ rank), EMA available but off:
#   tools/train.py CONFIG --cfg-options custom_hooks.0.enabled=True [custom_hooks.0.momentum=1e-4]
# (momentum 1e-4 = the 0.9999 decay of FLatten's main_ema.py; validation and checkpoints then
# use the averaged weights).
default_scope = 'mmengine'  # the classification modules live in mmengine's root registries
custom_imports = dict(imports=['mmpola', 'mmpola.classification'], allow_failed_imports=False)

default_hooks = dict(
    runtime_info=dict(type='RuntimeInfoHook'),
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=100),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='CheckpointHook', interval=1, max_keep_ckpts=3, save_best='accuracy/top1',
                    rule='greater'),
    sampler_seed=dict(type='DistSamplerSeedHook'),
)
custom_hooks = [dict(type='SwitchableEMAHook', enabled=False, momentum=1e-4, priority='ABOVE_NORMAL')]

env_cfg = dict(
    cudnn_benchmark=True,
    mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
    dist_cfg=dict(backend='nccl'),
)
vis_backends = [dict(type='LocalVisBackend')]
visualizer = dict(type='Visualizer', vis_backends=vis_backends)
log_processor = dict(type='LogProcessor', window_size=50, by_epoch=True)
log_level = 'INFO'
load_from = None
resume = False
randomness = dict(seed=0, diff_rank_seed=True)
