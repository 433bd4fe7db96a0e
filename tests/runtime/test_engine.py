"""mmpola.runtime: machine fallbacks, input checks, task adapters, bf16 AMP, the demo hook."""
import copy
import os.path as osp

import pytest
import torch
from mmengine.config import Config

from mmpola.runtime import (
    BF16AmpOptimWrapper,
    InitialEvaluationHook,
    UserError,
    adapt_cfg_to_machine,
    check_data_files,
    enable_test_dump,
    enable_test_visualization,
    enable_tta,
    replace_sync_bn,
    setup_amp,
)

needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason='checks the CPU-only fallbacks')


def _cfg(**kwargs):
    base = dict(
        model=dict(type='Net', head=dict(norm_cfg=dict(type='SyncBN', requires_grad=True)),
                   aux=[dict(norm_cfg=dict(type='MMSyncBN')), dict(norm_cfg=dict(type='BN'))]),
        env_cfg=dict(dist_cfg=dict(backend='nccl')),
        optim_wrapper=dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1e-4)),
        sync_bn='torch')
    base.update(kwargs)
    return Config(base)


def test_replace_sync_bn_walks_dicts_and_lists():
    cfg = _cfg()
    assert replace_sync_bn(cfg.model) == 2
    assert cfg.model.head.norm_cfg.type == 'BN' and [a.norm_cfg.type for a in cfg.model.aux] == ['BN', 'BN']


def test_single_process_drops_sync_bn():
    cfg = _cfg()
    notes = adapt_cfg_to_machine(cfg, 'none')
    assert cfg.model.head.norm_cfg.type == 'BN' and 'sync_bn' not in cfg
    assert any('SyncBN' in n for n in notes)


@needs_no_cuda
def test_cpu_distributed_uses_gloo_and_no_device_ids():
    cfg = _cfg(find_unused_parameters=True)
    adapt_cfg_to_machine(cfg, 'pytorch')
    assert cfg.env_cfg.dist_cfg.backend == 'gloo'
    assert cfg.model_wrapper_cfg.device_ids is None and cfg.model_wrapper_cfg.find_unused_parameters
    assert cfg.model.head.norm_cfg.type == 'BN'  # no CPU SyncBN kernel


@needs_no_cuda
def test_amp_on_cpu_is_bf16_and_reloadable():
    cfg = _cfg(custom_imports=dict(imports=['mmpola'], allow_failed_imports=False))
    assert 'bfloat16' in setup_amp(cfg)
    assert cfg.optim_wrapper.type == 'BF16AmpOptimWrapper' and cfg.optim_wrapper.dtype == 'bfloat16'
    assert cfg.custom_imports.imports == ['mmpola', 'mmpola.runtime']  # the dumped config rebuilds it
    with pytest.raises(UserError):
        setup_amp(_cfg(), 'float16')
    # a config written for CUDA AMP runs here too
    cfg = _cfg(optim_wrapper=dict(type='AmpOptimWrapper', loss_scale='dynamic', optimizer=dict(type='SGD', lr=1)))
    adapt_cfg_to_machine(cfg, 'none')
    assert cfg.optim_wrapper.type == 'BF16AmpOptimWrapper' and 'loss_scale' not in cfg.optim_wrapper


class _Detector(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 1)
        self.seen = []

    def forward(self, x):
        feats = self.backbone(x)
        self.seen.append((feats.dtype, torch.is_autocast_enabled('cpu')))
        return self.head(feats)


def test_bf16_amp_autocasts_the_backbone_only():
    model = _Detector()
    wrapper = BF16AmpOptimWrapper(optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3))
    backbone_dtypes = []
    model.backbone.register_forward_hook(lambda m, a, out: backbone_dtypes.append(out.dtype))
    with wrapper.optim_context(model):
        loss = model(torch.randn(2, 4)).sum()
    assert backbone_dtypes == [torch.bfloat16]  # inside the backbone: bf16
    assert model.seen == [(torch.float32, False)]  # the head gets fp32 and runs without autocast
    wrapper.update_params(loss)
    model(torch.randn(2, 4))  # outside the context (validation): plain fp32
    assert backbone_dtypes[-1] == torch.float32 and model.seen[-1] == (torch.float32, False)

    state = wrapper.state_dict()
    state['loss_scaler'] = {'scale': 1024.0}  # as written by fp16 AmpOptimWrapper
    wrapper.load_state_dict(state)


def test_bf16_amp_whole_model_when_there_is_no_backbone():
    model = torch.nn.Linear(4, 4)
    wrapper = BF16AmpOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=1e-3))
    with wrapper.optim_context(model):
        assert model(torch.randn(2, 4)).dtype == torch.bfloat16


def test_check_data_files_names_the_missing_path_and_the_hint(tmp_path):
    cfg = Config(dict(
        data_hint='generate it with: python tools/make_demo_x.py',
        train_dataloader=dict(dataset=dict(type='RepeatDataset', times=2, dataset=dict(
            type='CocoDataset', data_root=str(tmp_path) + '/', ann_file='ann.json', data_prefix=dict(img='img/'))))))
    with pytest.raises(UserError, match=r'ann_file .*ann\.json.*Generate it with: python tools/make_demo_x.py'):
        check_data_files(cfg, ['train_dataloader'])
    (tmp_path / 'ann.json').write_text('{}')
    with pytest.raises(UserError, match=r"data_prefix.img .*img/'"):
        check_data_files(cfg, ['train_dataloader'])
    (tmp_path / 'img').mkdir()
    check_data_files(cfg, ['train_dataloader', 'val_dataloader'])  # absent loaders are skipped


def test_test_time_adapters_follow_each_library():
    det = Config(dict(test_evaluator=dict(type='CocoMetric'), default_hooks=dict(visualization=dict(draw=False)),
                      visualizer=dict(type='DetLocalVisualizer')))
    enable_test_dump(det, 'out.pkl', 'mmdet')
    assert [e['type'] for e in det.test_evaluator] == ['CocoMetric', 'DumpDetResults']
    with pytest.raises(UserError):
        enable_test_dump(copy.deepcopy(det), 'out.json', 'mmdet')
    enable_test_visualization(det, 'vis', 'mmdet')
    assert det.default_hooks.visualization.draw and det.default_hooks.visualization.test_out_dir == osp.abspath('vis')

    seg = Config(dict(test_evaluator=dict(type='IoUMetric'), default_hooks=dict(visualization=dict(draw=False)),
                      visualizer=dict(type='SegLocalVisualizer'), model=dict(type='EncoderDecoder'),
                      test_dataloader=dict(dataset=dict(pipeline=['plain'])),
                      tta_model=dict(type='SegTTAModel'), tta_pipeline=['tta']))
    enable_test_dump(seg, 'pred_dir', 'mmseg')
    assert seg.test_evaluator.output_dir == 'pred_dir' and seg.test_evaluator.keep_results
    enable_test_visualization(seg, 'vis', 'mmseg')
    assert seg.default_hooks.visualization.draw and seg.visualizer.save_dir == 'vis'
    enable_tta(seg)
    assert seg.model.type == 'SegTTAModel' and seg.model.module.type == 'EncoderDecoder'
    assert seg.test_dataloader.dataset.pipeline == ['tta']
    with pytest.raises(UserError, match='tta_model'):
        enable_tta(Config(dict(model=dict(type='X'))))


def test_initial_evaluation_hook_records_before_and_after():
    class Loop:
        def run(self):
            return {'coco/bbox_mAP': 0.01}

    class Runner:
        _resume, iter, val_loop = False, 0, Loop()

        class logger:
            info = staticmethod(print)

    hook = InitialEvaluationHook()
    hook.before_train(Runner())
    hook.after_val_epoch(Runner(), {'coco/bbox_mAP': 0.5})
    assert hook.initial_metrics == {'coco/bbox_mAP': 0.01} and hook.last_metrics == {'coco/bbox_mAP': 0.5}
    resumed = Runner()
    resumed._resume = True
    hook = InitialEvaluationHook()
    hook.before_train(resumed)
    assert hook.initial_metrics is None
