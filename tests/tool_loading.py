"""Import the scripts of tools/ in a test process (tools/ is no package, and ``test`` would be the
standard library's module)."""
import importlib.util
import os.path as osp

TOOLS = osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), 'tools')


def load_tool(name):
    """A fresh module of ``tools/<name>.py`` (each call executes the script's top level again)."""
    spec = importlib.util.spec_from_file_location(f'mmpola_tools_{name}', osp.join(TOOLS, f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
