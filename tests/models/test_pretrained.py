"""Official weight sources (mmpola/checkpoint/sources.py): the table, timm's ``pretrained=True`` and the
configs' ``init_cfg`` reach the published downloads, cached once; no network: downloads are mocked."""
import glob
import os.path as osp
import re
import urllib.error

import pytest
import timm
import torch
from mmengine.config import Config

from mmpola.checkpoint.reading import CheckpointFileError
from mmpola.checkpoint.sources import (
    WEIGHT_SOURCES,
    NoPublishedWeightsError,
    cache_file_name,
    pretrained_url,
    weight_source,
)
from mmpola.models.timm_models import TIMM_ENTRIES
from tests.fixtures.paths import CONFIGS

# the FLatten release's TsinghuaCloud file ids that an earlier PolaFormer README listed for Pola models
FLATTEN_IDS_SHOWN_AS_POLA = ('3ab1d773f19d45648690', '5d1f01532b104da28e7b', 'e1518e76703e4e57a7f2',
                             '94188e52af354bf4a88b', '7a9e5186bad04e7fb3a9')


def test_every_timm_entry_has_a_source_and_no_pola_entry_names_a_flatten_file():
    assert set(TIMM_ENTRIES) <= set(WEIGHT_SOURCES)
    urls = [s.url for s in WEIGHT_SOURCES.values() if s.url]
    # FLatten PVT-T, PVTv2-b0, Swin-T/S/B, Swin-B 384, CSWin-T; InLine DeiT-T/S/B, PVT-T/S/M/L, Swin-T/S/B,
    # CSWin-T/S/B
    assert len(urls) == len(set(urls)) == 20
    for name, source in WEIGHT_SOURCES.items():
        assert (source.url is None) == bool(source.note), name  # a download, or where the weights are
        if name.startswith(('pola_', 'polapp_')):
            assert source.url is None  # PolaFormer: Hugging Face, file names unverified; PolaFormer++: Baidu
        for file_id in FLATTEN_IDS_SHOWN_AS_POLA:
            if source.url and file_id in source.url:
                assert name.startswith('flatten_'), name
    assert 'huggingface.co/ZachMeng/PolaFormer' in weight_source('pola_swin_tiny').note
    assert cache_file_name(pretrained_url('inline_pvt_tiny')) == 'inline_pvt_tiny_in1k_official.pth'
    assert cache_file_name('https://example.org/w/model.pth?x=1') == 'model.pth'
    assert re.fullmatch(r'download_[0-9a-f]{16}\.pth', cache_file_name('https://example.org/f/abc/?dl=1'))


def _model_configs():
    """(config path, entry name) of the base model files and the FLatten / InLine task configs."""
    for path in sorted(glob.glob(osp.join(CONFIGS, '_base_', 'models', '*.py'))):
        name = osp.splitext(osp.basename(path))[0]
        if name in WEIGHT_SOURCES:
            yield path, name
    for path in sorted(glob.glob(osp.join(CONFIGS, '*', 'flatten', '*.py')) +
                       glob.glob(osp.join(CONFIGS, '*', 'inline', '*.py'))):
        if not osp.relpath(path, CONFIGS).startswith('classification'):
            yield path, None


@pytest.mark.downstream
@pytest.mark.parametrize('path,name', list(_model_configs()), ids=lambda v: osp.basename(v) if v else '')
def test_configs_name_the_published_source_or_a_local_file(path, name):
    cfg = Config.fromfile(path)
    backbone = cfg.model.backbone if 'model' in cfg else cfg.backbone
    if name is None:  # a task config: the entry of its backbone type and size
        kind, family = re.fullmatch(r'(FLatten|InLine)(PVTv2|PVT|Swin|CSWin|DeiT)', backbone.type).groups()
        name = f"{kind.lower()}_{family.lower().replace('v2', '_v2')}_{backbone.arch}"
    url = pretrained_url(name)
    assert backbone.init_cfg.checkpoint == (url or f'checkpoints/{name}.pth')


def _fake_download(state_dict, calls):
    def download(url, dst, *args, **kwargs):
        calls.append((url, dst))
        torch.save({'state_dict': state_dict}, dst)
    return download


@pytest.fixture
def hub_dir(tmp_path, monkeypatch):
    monkeypatch.setenv('TORCH_HOME', str(tmp_path))
    return tmp_path / 'hub' / 'checkpoints'


def test_timm_pretrained_true_downloads_the_official_file_once(hub_dir, monkeypatch):
    source = timm.create_model('inline_pvt_tiny')
    calls = []
    monkeypatch.setattr(timm.models._hub, 'download_url_to_file', _fake_download(source.state_dict(), calls))
    model = timm.create_model('inline_pvt_tiny', pretrained=True)
    assert calls == [(pretrained_url('inline_pvt_tiny'), str(hub_dir / 'inline_pvt_tiny_in1k_official.pth'))]
    assert model.pretrained_cfg['url'] == pretrained_url('inline_pvt_tiny')
    for key, value in source.state_dict().items():
        torch.testing.assert_close(model.state_dict()[key], value, rtol=0, atol=0, msg=key)
    new_head = timm.create_model('inline_pvt_tiny', pretrained=True, num_classes=10)  # cached: no download
    assert len(calls) == 1 and new_head.head.out_features == 10
    torch.testing.assert_close(new_head.state_dict()['backbone.patch_embed1.proj.weight'],
                               source.state_dict()['backbone.patch_embed1.proj.weight'])


def test_timm_pretrained_takes_the_users_file_and_explains_missing_sources(hub_dir, monkeypatch, tmp_path):
    monkeypatch.setattr(timm.models._hub, 'download_url_to_file', lambda *a, **k: pytest.fail('no download'))
    source = timm.create_model('pola_pvt_tiny')
    path = tmp_path / 'pola_pvt_tiny.pth'
    torch.save({'state_dict': source.state_dict()}, path)
    model = timm.create_model('pola_pvt_tiny', pretrained=True, pretrained_cfg_overlay=dict(file=str(path)))
    torch.testing.assert_close(model.state_dict()['head.weight'], source.state_dict()['head.weight'])
    with pytest.raises(NoPublishedWeightsError, match=r'huggingface.co/ZachMeng/PolaFormer.*pretrained_cfg_overlay'):
        timm.create_model('pola_pvt_tiny', pretrained=True)
    with pytest.raises(NoPublishedWeightsError, match='Baidu Netdisk'):
        timm.create_model('polapp_b0', pretrained=True)
    with pytest.raises(NoPublishedWeightsError, match=r'^no official ImageNet weights exist for flatten_pvt_v2_b1: '
                                                      r'not published by the FLatten release\. Train them') as error:
        timm.create_model('flatten_pvt_v2_b1', pretrained=True)
    assert 'Download' not in str(error.value)


def _offline(*args, **kwargs):
    raise urllib.error.URLError('[Errno -3] Temporary failure in name resolution')


def test_offline_download_names_the_local_file_options_and_the_cache_file(hub_dir, monkeypatch):
    """Without network: timm's route says how to pass a file and the hub cache file docs/models.md promises."""
    monkeypatch.setattr(timm.models._hub, 'download_url_to_file', _offline)
    with pytest.raises(CheckpointFileError) as exc:
        timm.create_model('flatten_swin_tiny', pretrained=True)
    message = str(exc.value)
    assert "timm.create_model('flatten_swin_tiny', pretrained=True, pretrained_cfg_overlay=dict(file=" in message
    assert f"or copy it to {hub_dir / 'flatten_swin_tiny_in1k_official.pth'} (torch hub's cache)" in message
    assert not list(hub_dir.glob('*.pth'))


def test_offline_init_cfg_url_names_the_cache_file(hub_dir, monkeypatch):
    """The config route (init_cfg URL, what the tools fetch before building) names the same file."""
    from mmpola.checkpoint import read_checkpoint
    monkeypatch.setattr(torch.hub, 'download_url_to_file', _offline)
    with pytest.raises(CheckpointFileError) as exc:
        read_checkpoint(pretrained_url('flatten_pvt_tiny'))
    message = str(exc.value)
    assert 'model.backbone.init_cfg.checkpoint=' in message
    assert f"or copy it to {hub_dir / 'flatten_pvt_tiny_in1k_official.pth'} (torch hub's cache)" in message


def test_init_cfg_url_downloads_into_torch_hub_cache_once(hub_dir, monkeypatch):
    from mmengine.registry import MODELS
    url = pretrained_url('flatten_pvt_tiny')
    source = MODELS.build(dict(type='FLattenPVT', arch='tiny'))
    calls = []
    monkeypatch.setattr(torch.hub, 'download_url_to_file', _fake_download(
        {f'backbone.{k}': v for k, v in source.state_dict().items()}, calls))
    for _ in range(2):
        model = MODELS.build(dict(type='FLattenPVT', arch='tiny', init_cfg=dict(type='Pretrained', checkpoint=url)))
        model.init_weights()
        for key, value in source.state_dict().items():
            torch.testing.assert_close(model.state_dict()[key], value, rtol=0, atol=0, msg=key)
    assert calls == [(url, str(hub_dir / 'flatten_pvt_tiny_in1k_official.pth'))]  # the second one used the cache
