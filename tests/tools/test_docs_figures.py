"""tools/docs_figures.py: every params / GMACs figure of the docs is found with the command that makes it,
compared as the docs round it and rewritten in its own cell. The whole regeneration is `make docs-check`;
here one figure is counted again (Pola-PVT-T at 224, a second or two) and the rest is checked without
counting."""
import os
import os.path as osp
import shutil

import pytest

import mmpola  # noqa: F401  (registers the backbones)
from tests.fixtures.paths import CONFIGS, REPO
from tests.fixtures.tools import load_tool

docs_figures = load_tool('docs_figures')


@pytest.fixture(scope='module')
def figures():
    return docs_figures.find_figures()


def _dense_configs():
    found = set()
    for task in ('detection', 'segmentation'):
        for folder, dirs, files in os.walk(osp.join(CONFIGS, task)):
            dirs[:] = [d for d in dirs if d != '_base_']
            found |= {osp.relpath(osp.join(folder, f), REPO) for f in files if f.endswith('.py')}
    return found


def test_every_dense_config_has_its_params_and_gmacs(figures):
    zoo = [f for f in figures if f.model.config]
    counted = {}
    for figure in zoo:
        counted.setdefault(figure.model.config, set()).add(figure.what)
    assert set(counted) == _dense_configs(), (
        f'without a row in docs/model_zoo.md: {sorted(_dense_configs() - set(counted))}; rows without a '
        f'config: {sorted(set(counted) - _dense_configs())}')
    assert all(whats == {'params', 'macs'} for whats in counted.values())
    shapes = {f.model.config.split('/')[1]: f.shape for f in zoo}
    assert shapes == {'detection': (800, 1280), 'segmentation': (512, 512)}


def test_every_backbone_row_names_a_registered_backbone_and_size(figures):
    from mmengine.registry import MODELS
    rows = {f.model for f in figures if not f.model.config}
    assert len(rows) == 60  # 38 released backbones, 10 other kinds, PolaPP b0-b5 and their classifiers
    for model in rows:
        cls = MODELS.get(model.type)
        assert cls is not None, f'{model.name}: {model.type} is not registered'
        # the classifier rows: PolaFormer++'s classifier (family='polapp'), of PolaPP's sizes
        backbone = MODELS.get('PolaPP') if dict(model.options).get('family') == 'polapp' else cls
        assert model.arch in backbone.arch_settings, f'{model.name}: {model.type} has no arch {model.arch!r}'
    assert {f.shape for f in figures if not f.model.config} == {(224, 224), (800, 1333)}
    kinds = {m.options for m in rows if m.name in ('Pola-CSWin-T', 'softmax CSWin-T')}
    assert kinds == {(('attn.type', 'pola'), ), (('attn_type', 'SSSS'), )}


def test_the_command_of_a_figure(figures):
    first = figures[0]
    assert first.model.command(first.shape) == ('tools/get_flops.py --config configs/detection/'
                                                'retinanet_pola-pvt-t_fpn_1x_coco.py --shape 800 1280')
    cswin = next(f for f in figures if f.model.name == 'Pola-CSWin-T' and f.shape == (800, 1333))
    assert cswin.model.command(cswin.shape) == ('tools/get_flops.py --backbone CSWinBackbone --arch tiny '
                                                '--cfg-options attn.type=pola --shape 800 1333')


def test_a_figure_is_the_count_rounded_as_printed(figures):
    macs = next(f for f in figures if f.what == 'macs' and f.text.endswith('*'))  # a cascade row: '2178.4*'
    count = macs.value * 1e9
    assert macs.matches(count + 0.049e9) and not macs.matches(count + 0.051e9)
    assert macs.format(count + 0.33e9) == f'{macs.value + 0.33:.1f}*'
    params = next(f for f in figures if f.what == 'params' and f.model.config)
    assert params.format(12_345_678) == '12.35 M' and params.matches(params.value * 1e6 + 4_000)


def test_write_changes_only_the_figures_that_differ(tmp_path, figures):
    for path in {f.path for f in figures}:
        os.makedirs(tmp_path / osp.dirname(path), exist_ok=True)
        shutil.copy(osp.join(REPO, path), tmp_path / path)
    before = {path: (tmp_path / path).read_text(encoding='utf-8') for path in {f.path for f in figures}}
    stale = next(f for f in figures if f.model.name == 'mask-rcnn_pola-pvt-t_fpn_1x_coco' and f.what == 'macs')
    counts = {}  # the docs' own figures, one stale
    for f in figures:
        params, macs = counts.get((f.model, f.shape), (None, None))
        counts[f.model, f.shape] = (f.value * 1e6, macs) if f.what == 'params' else (params, f.value * 1e9)
    counts[stale.model, stale.shape] = (counts[stale.model, stale.shape][0], (stale.value + 0.33) * 1e9)
    changes = docs_figures.compare(figures, counts)
    assert [(f.model.name, f.what, text) for f, text in changes] == [
        (stale.model.name, 'macs', f'{stale.value + 0.33:.1f}')]
    docs_figures.write(changes, root=str(tmp_path))
    again = docs_figures.find_figures(root=str(tmp_path))
    new = f'{stale.value + 0.33:.1f}'
    assert [f.text for f in again] == [new if (f.line, f.column) == (stale.line, stale.column) else f.text
                                       for f in figures]
    after = (tmp_path / stale.path).read_text(encoding='utf-8').split('\n')
    changed = [i for i, (a, b) in enumerate(zip(before[stale.path].split('\n'), after)) if a != b]
    assert changed == [stale.line]


def test_one_figure_counted_again_matches_the_docs(figures):
    """Pola-PVT-T at 224 in docs/models.md: the tool's count, rounded as printed."""
    rows = [f for f in figures if f.model.name == 'Pola-PVT-T' and f.shape == (224, 224)]
    counts = {(rows[0].model, rows[0].shape): docs_figures.measure(rows[0].model, rows[0].shape)}
    assert {f.what for f in rows} == {'params', 'macs'}
    assert docs_figures.compare(rows, counts) == []
