"""The release table of docs/models.md ("ImageNet weights: where they come from"), the weight sources
(mmpola/checkpoint/sources.py) and the timm entries name the same models, and the table shows each
source's download: a model a release publishes cannot miss its source, its timm entry or its row."""
import itertools
import os.path as osp
import re

from mmpola.checkpoint.sources import WEIGHT_SOURCES, pretrained_url
from mmpola.models.timm_models import TIMM_ENTRIES
from tests.fixtures.paths import REPO

SECTION = '### ImageNet weights: where they come from'


def expand(text):
    """The names a cell writes: backticked names with ``{a,b}`` alternatives, ``x_b0`` ... ``x_b5`` ranges."""
    names = []
    for match in re.finditer(r'`([a-z0-9_{},]+)`(?:\s*\.\.\.\s*`([a-z0-9_]+)`)?', text):
        first, last = match.groups()
        if last:  # `polapp_b0` ... `polapp_b5`
            prefix, lo = re.fullmatch(r'(.*?)(\d+)', first).groups()
            hi = int(re.fullmatch(rf'{re.escape(prefix)}(\d+)', last).group(1))
            names += [f'{prefix}{i}' for i in range(int(lo), hi + 1)]
            continue
        parts = re.split(r'\{([^}]*)\}', first)
        choices = [[p] if i % 2 == 0 else p.split(',') for i, p in enumerate(parts)]
        names += [''.join(c) for c in itertools.product(*choices)]
    return names


def release_rows():
    """{name: download URL or None} of the rows of the table."""
    with open(osp.join(REPO, 'docs', 'models.md'), encoding='utf-8') as f:
        lines = f.read().splitlines()
    start = lines.index(SECTION)
    header = next(i for i in range(start, len(lines)) if lines[i].startswith('| backbone |'))
    rows = {}
    for line in itertools.takewhile(lambda s: s.startswith('|'), lines[header + 2:]):
        cells = [c.strip() for c in line.strip('|').split(' | ')]
        url = re.fullmatch(r'<(https://\S+)>', cells[3])
        for name in expand(cells[1]):
            assert name not in rows, f'{name} has two rows'
            rows[name] = url.group(1) if url else None
    return rows


def test_expand():
    assert expand('`pola_pvt_{tiny,small}`, `pola_swin_base_384`') == ['pola_pvt_tiny', 'pola_pvt_small',
                                                                      'pola_swin_base_384']
    assert expand('`polapp_b0` ... `polapp_b2`') == ['polapp_b0', 'polapp_b1', 'polapp_b2']


def test_the_table_the_sources_and_the_timm_entries_name_the_same_models():
    rows = release_rows()
    documented, sources, entries = set(rows), set(WEIGHT_SOURCES), set(TIMM_ENTRIES)
    assert documented == sources == entries, (
        f'without a source: {sorted((documented | entries) - sources)}; without a timm entry: '
        f'{sorted((documented | sources) - entries)}; without a row in docs/models.md: '
        f'{sorted((sources | entries) - documented)}')


def test_the_table_shows_each_download():
    wrong = {name: (url, pretrained_url(name)) for name, url in release_rows().items() if url != pretrained_url(name)}
    assert not wrong, f'docs/models.md and mmpola/checkpoint/sources.py differ (docs, sources): {wrong}'


def test_flatten_swin_b_384_has_its_release_file():
    """Released with weights (85.0 top-1 at 384, the FLatten README): a source, a timm entry at 384."""
    assert pretrained_url('flatten_swin_base_384') == 'https://cloud.tsinghua.edu.cn/f/0d0330cf2e5249f1abb6/?dl=1'
    entry = TIMM_ENTRIES['flatten_swin_base_384']
    assert (entry.family, entry.arch, entry.attn, entry.img_size) == ('swin', 'base', 'flatten', 384)
    assert entry.options['pretrain_img_size'] == 384 and entry.options['window_size'] == 96
