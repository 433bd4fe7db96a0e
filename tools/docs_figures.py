#!/usr/bin/env python3
"""The parameter and GMAC figures of the docs, regenerated with tools/get_flops.py and compared.

Usage:
    tools/docs_figures.py                      # compare every figure (make docs-check); exit 1 on a difference
    tools/docs_figures.py --write              # rewrite the figures from the tool's output (make docs-figures)
    tools/docs_figures.py --list               # the figures and the command each comes from, nothing counted
    tools/docs_figures.py --only pvt-t swin-t  # the rows whose name contains one of these words

The tables and the command of each (one forward pass at batch 1, tools/get_flops.py):

* docs/model_zoo.md, COCO: ``tools/get_flops.py --config configs/detection/CONFIG.py --shape 800 1280``
  (columns ``params``, ``GMACs``);
* docs/model_zoo.md, ADE20K: ``tools/get_flops.py --config configs/segmentation/CONFIG.py --shape 512 512``
  (``params``, ``GMACs @512x512``);
* docs/models.md, the backbone tables: ``tools/get_flops.py --backbone TYPE --arch SIZE [--cfg-options
  attn.type=KIND | attn_type=LAYOUT] [--shape 800 1333]`` (``params M``, ``GMACs @224``,
  ``GMACs @800x1333``); PolaFormer++'s: ``tools/get_flops.py --backbone PolaPP --arch SIZE`` (``backbone
  params``) and ``--backbone ImageClassifier --arch SIZE --cfg-options family=polapp`` (``classifier params``,
  ``classifier GMACs``).

Parameters and multiply-accumulates are integer counts of the model's structure: they do not depend on
the machine (the two-stage detectors' second stages run on the RPN's 1000 test-time proposals). A figure
passes when it is the tool's count rounded as the docs print it (tolerance: half a unit of the last
printed digit); ``--write`` keeps each cell's number of digits and its suffix (`` M``, ``*``).
Timing columns (CPU / GPU ms) are not compared: they depend on the machine; each table names its command.
"""
import argparse
import os.path as osp
import re
import sys
import time
from dataclasses import dataclass

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
import _mmpola_tools  # noqa: E402,F401  (first: environment defaults before torch, repo on sys.path)
from _mmpola_tools import REPO_ROOT  # noqa: E402

NUMBER = re.compile(r'^(\d+(?:\.(\d+))?)(.*)$')
# docs file, the start of the table's heading or header line, and for each figure: (its column, what it
# counts, the input size, the registered type and options it counts when the row names no model of its own)
TABLES = (
    ('docs/model_zoo.md', '### COCO detection and instance segmentation (configs/detection)',
     (('params', 'params', (800, 1280), None), ('GMACs', 'macs', (800, 1280), None))),
    ('docs/model_zoo.md', '### ADE20K semantic segmentation (configs/segmentation)',
     (('params', 'params', (512, 512), None), ('GMACs @512x512', 'macs', (512, 512), None))),
    ('docs/models.md', '| backbone | type, arch | params M | GMACs @224 | GMACs @800x1333 |',
     (('params M', 'params', (224, 224), None), ('GMACs @224', 'macs', (224, 224), None),
      ('GMACs @800x1333', 'macs', (800, 1333), None))),
    ('docs/models.md', '| backbone | type, arch, attention | params M | GMACs @224 | GMACs @800x1333 |',
     (('params M', 'params', (224, 224), None), ('GMACs @224', 'macs', (224, 224), None),
      ('GMACs @800x1333', 'macs', (800, 1333), None))),
    ('docs/models.md', '| arch | backbone params | classifier params | classifier GMACs @224 |',
     (('backbone params', 'params', (224, 224), ('PolaPP', ())),
      ('classifier params', 'params', (224, 224), ('ImageClassifier', (('family', 'polapp'),))),
      ('classifier GMACs @224', 'macs', (224, 224), ('ImageClassifier', (('family', 'polapp'),))))),
)


@dataclass(frozen=True)
class Model:
    """What one row counts: a config (``config`` set) or a backbone (``type`` and ``arch``, ``options``)."""
    name: str
    config: str = None
    type: str = None
    arch: str = None
    options: tuple = ()  # ((key, value), ...): get_flops' --cfg-options of a backbone, nested keys dotted

    def command(self, shape):
        size = f' --shape {shape[0]} {shape[1]}' if shape != (224, 224) else ''
        if self.config:
            return f'tools/get_flops.py --config {self.config}{size}'
        options = ' --cfg-options ' + ' '.join(f'{k}={v}' for k, v in self.options) if self.options else ''
        return f'tools/get_flops.py --backbone {self.type} --arch {self.arch}{options}{size}'


@dataclass
class Figure:
    path: str  # docs file, relative to the repository
    line: int  # 0-based line of the row
    column: int  # cell index in the row
    what: str  # 'params' or 'macs'
    model: Model
    shape: tuple
    text: str  # the cell as the docs write it

    @property
    def value(self):
        return float(NUMBER.match(self.text).group(1))

    def format(self, count):
        """``count`` written as this cell writes its figure (digits and suffix kept)."""
        _, decimals, suffix = NUMBER.match(self.text).groups()
        return f'{count / (1e6 if self.what == "params" else 1e9):.{len(decimals or "")}f}{suffix}'

    def matches(self, count):
        """The docs' figure is ``count`` rounded to the printed digits (half a unit of the last digit)."""
        _, decimals, _ = NUMBER.match(self.text).groups()
        unit = 10.0 ** -len(decimals or '')
        return abs(self.value - count / (1e6 if self.what == 'params' else 1e9)) <= unit / 2 + 1e-9


def _cells(line):
    return [c.strip() for c in line.strip().strip('|').split('|')]


def _model_of_row(path, heading, cells, counted):
    if 'model_zoo' in path:
        name = cells[0].split(' ')[0]
        task = 'detection' if heading.startswith('### COCO') else 'segmentation'
        return Model(name, config=f'configs/{task}/{name}.py')
    if counted:  # the row names the arch only
        type_name, options = counted
        return Model(f'{type_name} {cells[0]}', type=type_name, arch=cells[0], options=options)
    described = re.findall(r'`([^`]*)`', cells[1])
    type_name, arch, *rest = described
    options = []
    for option in rest:  # attn='pola' -> attn.type=pola; attn_type='SSSS' -> attn_type=SSSS
        key, value = option.split('=', 1)
        options.append(('attn.type' if key == 'attn' else key, value.strip('\'"')))
    return Model(cells[0], type=type_name, arch=arch, options=tuple(options))


def find_figures(root=REPO_ROOT):
    """Every figure of :data:`TABLES` in the docs under ``root``, in the order the docs write them."""
    figures = []
    for path, heading, columns in TABLES:
        with open(osp.join(root, path), encoding='utf-8') as f:
            lines = f.read().splitlines()
        start = next((i for i, line in enumerate(lines) if line.startswith(heading)), None)
        if start is None:
            raise SystemExit(f'{path}: no table at {heading!r}; update TABLES in tools/docs_figures.py '
                             f'with the docs')
        header = next(i for i in range(start, len(lines)) if lines[i].startswith('| '))
        names = _cells(lines[header])
        index = {column: names.index(column) for column, *_ in columns}
        line = header + 2
        while line < len(lines) and lines[line].startswith('|'):
            cells = _cells(lines[line])
            for column, what, shape, type_name in columns:
                text = cells[index[column]]
                if NUMBER.match(text):
                    model = _model_of_row(path, heading, cells, type_name)
                    figures.append(Figure(path, line, index[column], what, model, shape, text))
            line += 1
    return figures


def measure(model, shape, root=REPO_ROOT):
    """(parameters, MACs) of ``model`` at ``shape`` (H, W), as tools/get_flops.py counts them."""
    import get_flops
    import torch
    torch.manual_seed(0)
    if model.config:
        built, inputs = get_flops.build_from_config(osp.join(root, model.config), *shape)
    else:
        built = get_flops.build_backbone(model.type, model.arch, **get_flops._nested(dict(model.options)))
        built.eval()
        inputs = (torch.randn(1, 3, *shape), )
    flops, _ = get_flops.count_flops(built, *inputs)
    return get_flops.count_parameters(built), flops // 2


def compare(figures, counts):
    """The figures whose docs value is not the count: [(figure, new text)]."""
    return [(f, f.format(counts[f.model, f.shape][0 if f.what == 'params' else 1]))
            for f in figures if (f.model, f.shape) in counts
            and not f.matches(counts[f.model, f.shape][0 if f.what == 'params' else 1])]


def write(changes, root=REPO_ROOT):
    """Put each change's new text into its cell (only that cell of that line changes)."""
    by_file = {}
    for figure, text in changes:
        by_file.setdefault(figure.path, []).append((figure, text))
    for path, items in by_file.items():
        full = osp.join(root, path)
        with open(full, encoding='utf-8') as f:
            lines = f.read().split('\n')
        for figure, text in items:
            parts = lines[figure.line].split('|')  # parts[0] is '' before the leading '|'
            cell = parts[figure.column + 1]
            assert cell.strip() == figure.text, f'{path}:{figure.line + 1} changed while counting'
            parts[figure.column + 1] = cell.replace(figure.text, text)
            lines[figure.line] = '|'.join(parts)
        with open(full, 'w', encoding='utf-8') as f:
            f.write('\n'.join(lines))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--write', action='store_true', help='rewrite the figures that differ')
    parser.add_argument('--list', action='store_true', help='list the figures and their commands, count nothing')
    parser.add_argument('--only', nargs='+', metavar='WORD', help='rows whose name contains one of these')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    figures = find_figures()
    if args.only:
        figures = [f for f in figures if any(word in f.model.name for word in args.only)]
    targets = list(dict.fromkeys((f.model, f.shape) for f in figures))
    if args.list:
        for model, shape in targets:
            cells = ', '.join(f'{f.path}:{f.line + 1} {f.what} {f.text}' for f in figures
                              if (f.model, f.shape) == (model, shape))
            print(f'{model.command(shape)}  ->  {cells}')
        return []
    counts = {}
    for i, (model, shape) in enumerate(targets, 1):
        start = time.time()
        counts[model, shape] = measure(model, shape)
        params, macs = counts[model, shape]
        print(f'[{i}/{len(targets)}] {model.name} @{shape[0]}x{shape[1]}: {params / 1e6:.2f} M, '
              f'{macs / 1e9:.2f} GMACs ({time.time() - start:.0f} s)', flush=True)
    changes = compare(figures, counts)
    for figure, text in changes:
        print(f'{figure.path}:{figure.line + 1} {figure.model.name} {figure.what} @{figure.shape[0]}x'
              f'{figure.shape[1]}: docs {figure.text}, {figure.model.command(figure.shape)} gives {text}')
    if args.write:
        write(changes)
        print(f'{len(changes)} of {len(figures)} figures rewritten')
    elif changes:
        print(f'{len(changes)} of {len(figures)} figures differ from the tool; rewrite them with '
              f'tools/docs_figures.py --write (make docs-figures)')
        raise SystemExit(1)
    else:
        print(f'all {len(figures)} figures match tools/get_flops.py')
    return changes


if __name__ == '__main__':
    main()
