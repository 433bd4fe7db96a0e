"""No import cycle inside the package, function-level imports included: every module's imports of
mmpola modules (read with ``ast``, not executed) form a graph without cycles."""
import ast
import os
import os.path as osp

from tests.fixtures.paths import REPO

PACKAGE = 'mmpola'


def _modules():
    """``{dotted module name: path}`` of every module of the package (packages by their __init__)."""
    out = {}
    root = osp.join(REPO, PACKAGE)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != '__pycache__']
        for name in filenames:
            if name.endswith('.py'):
                parts = osp.relpath(osp.join(dirpath, name), REPO)[:-3].split(os.sep)
                if parts[-1] == '__init__':
                    parts = parts[:-1]
                out['.'.join(parts)] = osp.join(dirpath, name)
    return out


def _imports(name, path, modules):
    """The mmpola modules ``name`` imports, anywhere in its body (``from X import y`` names the
    submodule ``X.y`` when there is one, else ``X``)."""
    with open(path, encoding='utf-8') as f:
        tree = ast.parse(f.read(), path)
    package = name if path.endswith('__init__.py') else name.rpartition('.')[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                anchor = package.split('.')
                anchor = anchor[:len(anchor) - node.level + 1]
                base = '.'.join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f'{base}.{alias.name}'
                found.add(sub if sub in modules else base)
    return {m for m in found if m in modules and m != name}


def _cycles(graph):
    """Every cycle found by a depth-first search, as lists of modules."""
    cycles, state, stack = [], {}, []

    def visit(node):
        state[node] = 'open'
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 'open':
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 'done'

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


def test_the_reader_resolves_relative_and_submodule_imports():
    modules = _modules()
    assert 'mmpola.models.backbones.presets' in modules and 'mmpola.checkpoint' in modules
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert {'mmpola.models.backbones.pvt', 'mmpola.models.backbones.swin', 'mmpola.models.attention',
            'mmpola.registry', 'mmpola.checkpoint'} <= graph['mmpola.models.backbones.presets']
    assert _cycles({'a': {'b'}, 'b': {'c'}, 'c': {'a'}}) == [['a', 'b', 'c', 'a']]


def test_no_import_cycle_in_the_package():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    cycles = _cycles(graph)
    assert not cycles, 'import cycles:\n' + '\n'.join(' -> '.join(cycle) for cycle in cycles)
