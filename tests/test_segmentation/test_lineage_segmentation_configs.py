"""FLatten / InLine segmentation configs: thin deltas on the Pola UperNet config (the backbone type
and its checkpoint differ, nothing else); each trains one step and predicts an ADE-sized image."""
import copy
import glob
import os.path as osp

import pytest
import torch
from seg_test_utils import REPO, build_segmentor, load_config, seg_batch

LINEAGE_CONFIGS = sorted(p for kind in ('flatten', 'inline')
                         for p in glob.glob(osp.join(REPO, 'configs', 'segmentation', kind, '*.py')))


def test_the_listed_configs_exist():
    assert [osp.basename(p) for p in LINEAGE_CONFIGS] == [
        f'upernet_{kind}-swin-t_8xb2-160k_ade20k-512x512.py' for kind in ('flatten', 'inline')]


@pytest.mark.parametrize('path', LINEAGE_CONFIGS, ids=lambda p: osp.basename(p)[:-3])
def test_config_trains_one_step_and_predicts(path):
    from mmengine.optim import build_optim_wrapper

    kind = osp.basename(osp.dirname(path))
    cfg = load_config(path)
    pola = load_config(osp.join(REPO, 'configs', 'segmentation', osp.basename(path).replace(kind, 'pola')))
    title = {'flatten': 'FLatten', 'inline': 'InLine'}[kind]
    assert cfg.model.backbone.type == f'{title}Swin'
    assert cfg.model.backbone.init_cfg.checkpoint == f'checkpoints/{kind}_swin_tiny.pth'
    ours, theirs = cfg.to_dict(), pola.to_dict()
    for d in (ours, theirs):
        del d['model']['backbone']['type'], d['model']['backbone']['init_cfg']['checkpoint']
    assert ours == theirs

    torch.manual_seed(0)
    model = build_segmentor(cfg.model)
    num_classes = cfg.model.decode_head.num_classes
    model.data_preprocessor.size = (32, 64)
    optim_wrapper = build_optim_wrapper(model, copy.deepcopy(cfg.optim_wrapper))
    model.train()
    batch = model.data_preprocessor(seg_batch([(32, 64), (32, 64)], num_classes), True)
    loss, log_vars = model.parse_losses(model(**batch, mode='loss'))
    assert torch.isfinite(loss), log_vars
    optim_wrapper.backward(loss)
    unused = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not unused, unused
    optim_wrapper.step()
    model.eval()
    with torch.no_grad():
        batch = model.data_preprocessor(seg_batch([(128, 171)], num_classes), False)
        pred = model(**batch, mode='predict')[0].pred_sem_seg.data
    assert pred.shape == (1, 128, 171)
