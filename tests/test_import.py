"""What importing mmpola does: it registers, and replaces nothing of timm or mmengine; the runtime
package has no import cycle (function-level imports included)."""
import ast
import json
import os
import os.path as osp
import subprocess
import sys

from tests.fixtures.paths import REPO

_SNAPSHOT = r'''
import importlib, json, sys, warnings
warnings.simplefilter('ignore')
import timm, mmengine
for name in ('timm.models._helpers', 'mmengine.runner', 'mmengine.runner.checkpoint', 'mmengine.registry',
             'mmengine.hooks', 'mmengine.model', 'mmengine.optim', 'mmengine.dataset', 'mmengine.fileio',
             'mmengine.logging', 'mmengine.dist', 'mmengine.config', 'mmengine.evaluator', 'mmengine.visualization',
             'mmengine.structures'):
    importlib.import_module(name)
from mmengine.runner.checkpoint import CheckpointLoader
schemes = dict(CheckpointLoader._schemes)
modules = {name: module for name, module in sys.modules.items()
           if module is not None and name.split('.')[0] in ('timm', 'mmengine')}
before = {(name, attr): value for name, module in modules.items() for attr, value in list(vars(module).items())}
import mmpola
changed = sorted(f'{name}.{attr}' for (name, attr), value in before.items()
                 if attr in vars(modules[name]) and vars(modules[name])[attr] is not value)
removed = sorted(f'{name}.{attr}' for (name, attr) in before if attr not in vars(modules[name]))
loaders = sorted(prefix for prefix, loader in CheckpointLoader._schemes.items() if schemes.get(prefix) is not loader)
print(json.dumps(dict(modules=len(modules), attributes=len(before), changed=changed, removed=removed,
                      loaders=loaders)))
'''


def test_importing_mmpola_replaces_no_attribute_of_timm_or_mmengine():
    """Every attribute of every timm / mmengine module imported before ``import mmpola`` is the same
    object after it (``is``), in a fresh interpreter; so are mmengine's checkpoint loaders."""
    out = subprocess.run([sys.executable, '-c', _SNAPSHOT], cwd=REPO, capture_output=True, text=True, check=True,
                         timeout=600, env=dict(os.environ, PYTHONPATH=REPO)).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result['modules'] > 100 and result['attributes'] > 10000, result
    assert (result['changed'], result['removed'], result['loaders']) == ([], [], []), result


# ----------------------------------------------------------------------------------------------
# import cycles

def _module_name(path):
    rel = osp.relpath(path, REPO)[:-3].replace(os.sep, '.')
    return rel[:-len('.__init__')] if rel.endswith('.__init__') else rel


def _imports(path, modules):
    """(imported mmpola module, line, function-level) of every import statement in ``path``."""
    name = _module_name(path)
    package = name if path.endswith('__init__.py') else name.rpartition('.')[0]
    with open(path) as f:
        tree = ast.parse(f.read())
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            targets = []
            if isinstance(child, ast.Import):
                targets = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ''
                if child.level:
                    parts = package.split('.')
                    parent = '.'.join(parts[:len(parts) - child.level + 1])
                    base = f'{parent}.{base}' if base else parent
                targets = [f'{base}.{alias.name}' if f'{base}.{alias.name}' in modules else base
                           for alias in child.names]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition('.')[0]
                if target and target != name:
                    found.append((target, child.lineno, nested))
            visit(child, nested)

    visit(tree, False)
    return found


def _package_graph():
    paths = {}
    for dirpath, _, files in os.walk(osp.join(REPO, 'mmpola')):
        for file in files:
            if file.endswith('.py'):
                path = osp.join(dirpath, file)
                paths[_module_name(path)] = path
    return {name: _imports(path, paths) for name, path in paths.items()}


def _cycles(graph, nodes):
    """Strongly connected components of more than one module among ``nodes`` (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def connect(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target, _, _ in graph[node]:
            if target not in nodes:
                continue
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(nodes):
        if node not in index:
            connect(node)
    return found


def test_no_import_cycle_in_the_runtime_package():
    """Explicit imports only (importing ``a.b`` also runs ``a/__init__``, which is how packages work):
    no two modules of mmpola.runtime (or the checkpoint reading and errors they use) import each
    other, directly or around a loop, at module or function level."""
    graph = _package_graph()
    nodes = {name for name in graph if name.startswith('mmpola.runtime')} | {
        'mmpola.errors', 'mmpola.registry', 'mmpola.checkpoint.reading'}
    assert len([n for n in nodes if n.startswith('mmpola.runtime')]) > 15
    assert _cycles(graph, nodes) == []
    # a module of the runtime never imports the package that contains it (a cycle through __init__)
    inward = [(name, target, line) for name in nodes for target, line, _ in graph[name]
              if name.startswith(target + '.') and target.startswith('mmpola')]
    assert inward == []


_WITHOUT_MMCV = r'''
import sys
sys.modules['mmcv'] = None  # `import mmcv` raises ImportError, as where mmcv is not installed
import torch, timm
import mmpola
model = timm.create_model('pola_pvt_tiny', num_classes=3).eval()
with torch.no_grad():
    print(tuple(model(torch.randn(1, 3, 64, 64)).shape), 'mmcv' in sys.modules and sys.modules['mmcv'] is not None)
'''


def test_backbones_and_timm_entries_need_no_mmcv():
    """mmcv is not a dependency of the package (mmdet and mmseg need it): importing mmpola and using a timm
    entry work without it; what needs mmcv (detection, the checked image loading) imports it when built."""
    proc = subprocess.run([sys.executable, '-c', _WITHOUT_MMCV], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=REPO))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-3:] == ['(1,', '3)', 'False']


# ----------------------------------------------------------------------------------------------
# the oldest torch

def test_an_older_torch_is_refused_at_import_in_one_line():
    """``import mmpola`` with a torch older than mmpola/version.py's ``MIN_TORCH`` stops with an ImportError that
    names the version, the minimum and the fix, before anything that would fail on it less clearly."""
    from mmpola.version import MIN_TORCH
    older = f'{MIN_TORCH[0]}.{MIN_TORCH[1] - 1}.1+cu128'
    code = f'import torch; torch.__version__ = {older!r}; import mmpola'
    run = subprocess.run([sys.executable, '-c', code], cwd=REPO, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, PYTHONPATH=REPO))
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    need = '.'.join(map(str, MIN_TORCH))
    assert last == (f'ImportError: mmpola: torch {older} is older than {need}, the oldest torch mmpola is tested '
                    f'with; upgrade torch and torchvision together (torch >= {need}, docs/install.md)'), run.stderr


def test_torch_too_old_reads_release_local_and_prerelease_versions():
    from mmpola.version import MIN_TORCH, torch_too_old
    major, minor = MIN_TORCH
    assert torch_too_old(f'{major}.{minor - 1}.9')
    assert torch_too_old(f'{major - 1}.{minor + 5}.0+cpu')
    for fine in (f'{major}.{minor}.0', f'{major}.{minor}.0+cu130', f'{major}.{minor + 1}.0a0+git1234abc',
                 f'{major + 1}.0.0'):
        assert torch_too_old(fine) == '', fine


def test_the_oldest_torch_is_the_one_pyproject_asks_for_and_make_test_compat_runs():
    """One minimum: pyproject.toml's torch requirement and requirements/compat.txt's torch (the older of the
    two environments the suite runs in) are mmpola/version.py's ``MIN_TORCH``."""
    from mmpola.version import MIN_TORCH
    need = '.'.join(map(str, MIN_TORCH))
    with open(osp.join(REPO, 'pyproject.toml')) as f:
        pyproject = f.read()
    assert f'"torch>={need}",' in pyproject
    with open(osp.join(REPO, 'requirements', 'compat.txt')) as f:
        compat = [line.strip() for line in f if line.startswith('torch==')]
    assert len(compat) == 1 and compat[0].startswith(f'torch=={need}.'), compat
