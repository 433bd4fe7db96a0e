"""docs/recipes.md against the configs: every shipped config has a row in exactly one recipe family,
every field of the audit list (tests/fixtures/recipes.py) is stated for it with its source, and every
stated value is the config's, so a number cannot change in a config without its row."""
import os.path as osp
import re

import pytest

from tests.fixtures.recipes import (
    DOC,
    field_value,
    load,
    parse_doc,
    parse_value,
    required_fields,
    same,
    shipped_configs,
)

with open(DOC, encoding='utf-8') as _f:
    FAMILIES = parse_doc(_f.read())
ROWS = {config: family for family in FAMILIES for config in family['configs']}
# where a number comes from: a file of one of these repositories, or "mmpola choice" with its reason
SOURCE = re.compile(r'^mmpola choice: \S|whai362/PVT|SwinTransformer/Swin-Transformer-|microsoft/CSWin-Transformer|'
                    r'ZacharyMeng/PolaFormer|'
                    r'LeapLabTHU/(FLatten-Transformer|InLine)|open-mmlab/(mmdetection|mmsegmentation)|'
                    r'huggingface/pytorch-image-models|pytorch/pytorch')
NAME_BATCH = re.compile(r'(?:^|[_-])(\d+)xb(\d+)(?:[_-]|$)')


def test_every_shipped_config_has_one_row():
    listed = [config for family in FAMILIES for config in family['configs']]
    twice = sorted({c for c in listed if listed.count(c) > 1})
    assert not twice, f'configs listed in two rows: {twice}'
    shipped = set(shipped_configs())
    assert not shipped - set(listed), f'configs without a row in docs/recipes.md: {sorted(shipped - set(listed))}'
    assert not set(listed) - shipped, f'rows of configs that do not exist: {sorted(set(listed) - shipped)}'


def test_every_row_names_its_source():
    unsourced = [f"{family['title']}: {field}" for family in FAMILIES
                 for field, (_, source) in family['common'].items() if not SOURCE.search(source)]
    unsourced += [f"{family['title']}: {config}" for family in FAMILIES
                  for config, row in family['configs'].items() if not SOURCE.search(row['source'])]
    assert not unsourced, f'rows without a source: {unsourced}'


@pytest.mark.parametrize('config', shipped_configs())
def test_recipe_rows_hold_the_config_values(config):
    family = ROWS.get(config)
    if family is None:
        pytest.fail(f'{config} has no row in docs/recipes.md')
    cfg = load(config)
    stated = {field: value for field, (value, _) in family['common'].items()}
    stated.update((field, value) for field, value in family['configs'][config].items() if field != 'source')
    missing = [field for field in required_fields(config, cfg) if field not in stated]
    assert not missing, f"docs/recipes.md ({family['title']}) does not state {missing} for {config}"
    wrong = []
    for field, text in stated.items():
        try:
            value = field_value(cfg, config, field)
        except KeyError as error:
            wrong.append(f'{field}: {error}')
            continue
        try:
            documented = parse_value(text)
        except (SyntaxError, ValueError):
            wrong.append(f'{field}: the value {text!r} is no Python literal')
            continue
        if not same(documented, value):
            wrong.append(f'{field}: docs/recipes.md says {text}, the config has {value!r}')
    assert not wrong, f"{config} ({family['title']}):\n" + '\n'.join(wrong)


@pytest.mark.parametrize('config', [c for c in shipped_configs() if not c.startswith('demo')])
def test_config_name_tells_the_batch(config):
    """`8xb2` in a name is 8 GPUs x 2 images (mmdet's names leave out their default, 8 x 2); dense
    configs scale the lr from that total with --auto-scale-lr."""
    cfg = load(config)
    match = NAME_BATCH.search(osp.basename(config))
    gpus, batch = (int(match.group(1)), int(match.group(2))) if match else (8, 2)
    assert match or config.startswith('detection'), f'{config}: segmentation / classification names say NxbM'
    assert cfg.train_dataloader.batch_size == batch
    if not config.startswith('classification'):  # ImageNet configs scale per 512 images, as the official code
        assert cfg.auto_scale_lr.base_batch_size == gpus * batch


def test_every_config_has_a_model_zoo_row():
    """Detection and segmentation configs are rows of docs/model_zoo.md, the ImageNet recipes rows of
    docs/classification.md (PolaFormer++'s of docs/models.md)."""
    docs = {}
    for page in ('model_zoo', 'classification', 'models'):
        with open(osp.join(osp.dirname(DOC), f'{page}.md'), encoding='utf-8') as f:
            docs[page] = f.read()
    missing = []
    for config in shipped_configs():
        task, name = config.split(osp.sep)[0], config.split(osp.sep, 1)[1]
        if task in ('detection', 'segmentation'):
            found = f'| {name[:-3]} ' in docs['model_zoo']
        elif task == 'classification':
            found = f'| {name} |' in docs['classification'] or f'| {name} |' in docs['models']
        else:  # demo configs: README.md and the pages of their task
            continue
        if not found:
            missing.append(config)
    assert not missing, f'configs without a row in the model zoo pages: {missing}'
