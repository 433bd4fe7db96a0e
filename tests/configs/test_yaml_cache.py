"""The test processes' YAML handler (tests/fixtures/yaml_cache.py) loads configs as mmengine's own does."""
from mmengine.config import Config
from mmengine.fileio import load, register_handler
from mmengine.fileio.handlers import YamlHandler

from tests.fixtures.paths import CONFIGS
from tests.fixtures.yaml_cache import CachedYamlHandler

# inherits mmseg's _base_ files through `mmseg::` names, each of which mmengine looks up in mmseg's metafiles first
CONFIG = f'{CONFIGS}/segmentation/upernet_pola-swin-t_8xb2-160k_ade20k-512x512.py'


def test_configs_load_as_with_mmengines_handler(tmp_path):
    cached = Config.fromfile(CONFIG).to_dict()
    register_handler(['yaml', 'yml'])(YamlHandler)
    try:
        plain = Config.fromfile(CONFIG).to_dict()
    finally:
        register_handler(['yaml', 'yml'])(CachedYamlHandler)
    assert cached == plain

    path = tmp_path / 'a.yml'
    path.write_text('Models:\n  - Name: a\n')
    first = load(str(path))
    first['Models'].append('changed by a reader')
    assert load(str(path)) == {'Models': [{'Name': 'a'}]}  # every reader gets its own copy
    path.write_text('Models: []\n')
    assert load(str(path)) == {'Models': []}  # keyed by the text: an edited file is parsed again
