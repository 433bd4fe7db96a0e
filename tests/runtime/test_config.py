"""Configs as the tools load them (mmpola.runtime.config): ``--cfg-options data_root=DIR`` moves every
dataset and the evaluators' annotation files (load_config / move_data_root), for detection and
segmentation configs; a misspelled top-level option is refused; a missing config file is one line (naming a close
file of its folder); the config's text is mmengine's without yapf's formatting; a config mmengine cannot read (also
`mmpola::` bases where mmengine cannot find mmpola's configs, a custom_imports module that cannot be imported) is one
error that names it and the fix."""
import os.path as osp

import pytest

from mmpola.errors import UserError
from mmpola.runtime.config import load_config
from tests.fixtures.paths import REPO

DET = osp.join(REPO, 'configs', 'detection', 'mask-rcnn_pola-swin-t_fpn_ms-crop-3x_coco.py')
SEG = osp.join(REPO, 'configs', 'segmentation', 'upernet_pola-pvt-t_8xb2-160k_ade20k-512x512.py')
LOADERS = ('train_dataloader', 'val_dataloader', 'test_dataloader')


def test_detection_datasets_and_coco_evaluators_follow_data_root():
    cfg = load_config(DET, {'data_root': '/datasets/coco2017'})
    for key in LOADERS:
        assert cfg[key].dataset.data_root == '/datasets/coco2017', key
    assert cfg.train_dataloader.dataset.ann_file == 'annotations/instances_train2017.json'  # relative: unchanged
    for key in ('val_evaluator', 'test_evaluator'):
        assert cfg[key].ann_file == '/datasets/coco2017/annotations/instances_val2017.json', key
    assert cfg.data_root == '/datasets/coco2017'


def test_segmentation_datasets_follow_data_root():
    cfg = load_config(SEG, {'data_root': '/datasets/ADEChallengeData2016/'})
    for key in LOADERS:
        assert cfg[key].dataset.data_root == '/datasets/ADEChallengeData2016/', key
        assert cfg[key].dataset.data_prefix.img_path.startswith('images/'), key


def test_explicit_dataset_options_win_over_data_root():
    cfg = load_config(DET, {'data_root': '/new/', 'val_evaluator.ann_file': '/elsewhere/val.json',
                            'test_dataloader.dataset.data_root': '/test/'})
    assert cfg.val_evaluator.ann_file == '/elsewhere/val.json'
    assert cfg.test_evaluator.ann_file == '/new/annotations/instances_val2017.json'
    assert cfg.test_dataloader.dataset.data_root == '/test/' and cfg.val_dataloader.dataset.data_root == '/new/'


@pytest.mark.parametrize('option, close', [('data_roott', "'data_root'"), ('nonfinite_los.action', "'nonfinite_loss'"),
                                           ('train_cfgg.max_epochs', "'train_cfg'")])
def test_a_misspelled_top_level_option_names_the_close_key(option, close):
    """A ``--cfg-options`` key whose first part is no key of the config but close to one (or to one that mmpola or
    the Runner reads without the config defining it) would add a key that nothing reads: refused."""
    with pytest.raises(UserError, match=rf"^--cfg-options {option}: the config has no '{option.split('.')[0]}', so "
                                        rf'the option would add a key that nothing reads; did you mean {close}'):
        load_config(DET, {option: 1})


def test_an_option_below_an_entry_set_to_none_says_how_to_give_it_whole():
    """``model.backbone.init_cfg.checkpoint=X`` where the config's init_cfg is None: one line naming the entry and the
    options that give it whole (mmengine's merge: a TypeError about child and base configs); those then work."""
    demo = osp.join(REPO, 'configs', 'demo', 'mask-rcnn_pola-pvt-t_fpn_demo-coco.py')
    with pytest.raises(UserError, match=r'^--cfg-options model\.backbone\.init_cfg\.checkpoint: model\.backbone\.'
                                        r"init_cfg is None in the config, so it has no key 'checkpoint' to set; give "
                                        r'the whole entry: --cfg-options model\.backbone\.init_cfg\._delete_=True'):
        load_config(demo, {'model.backbone.init_cfg.checkpoint': 'x.pth'})
    cfg = load_config(demo, {'model.backbone.init_cfg._delete_': True, 'model.backbone.init_cfg.type': 'Pretrained',
                             'model.backbone.init_cfg.checkpoint': 'x.pth'})
    assert cfg.model.backbone.init_cfg == dict(type='Pretrained', checkpoint='x.pth')


def test_new_top_level_options_far_from_known_keys_are_added():
    cfg = load_config(DET, {'my_flag': 1, 'compile': True, 'resume_or_start': True, 'checkpoint_min_loaded': 0,
                            'nonfinite_pixels.action': 'skip'})
    assert cfg.my_flag == 1 and cfg.compile and cfg.nonfinite_pixels.action == 'skip'


def test_data_root_without_a_top_level_root_says_what_to_set(tmp_path):
    config = tmp_path / 'no_root.py'
    config.write_text("train_dataloader = dict(dataset=dict(data_root='somewhere/'))\n")
    with pytest.raises(UserError, match='train_dataloader.dataset.data_root'):
        load_config(str(config), {'data_root': '/new/'})


def test_missing_data_hint_names_the_option_that_fits_the_config(tmp_path):
    """A config with a top-level data_root is pointed elsewhere with `data_root=DIR`, as the docs say."""
    from mmpola.runtime.preflight.files import check_data_files
    cfg = load_config(DET, {'data_root': str(tmp_path / 'nowhere') + '/'})
    with pytest.raises(UserError, match=r'--cfg-options data_root=DIR$'):
        check_data_files(cfg, ['train_dataloader'], check_images=False)
    config = tmp_path / 'no_root.py'
    config.write_text(f"train_dataloader = dict(dataset=dict(data_root={str(tmp_path / 'nowhere')!r}))\n")
    with pytest.raises(UserError, match=r'--cfg-options train_dataloader.dataset.data_root=DIR$'):
        check_data_files(load_config(str(config)), ['train_dataloader'], check_images=False)


def test_the_config_text_is_written_without_yapf_and_reads_back_the_same(tmp_path, monkeypatch):
    """The tools' configs (load_config) give mmengine's text without yapf's formatting (format_python_code=False):
    no yapf call for the log's, the work dir's and each checkpoint's copy, and the text is the same config."""
    import mmengine.config.config as mmengine_config
    from mmengine.config import Config
    cfg = load_config(DET, {'train_cfg.max_epochs': 3})
    monkeypatch.setattr(mmengine_config, 'FormatCode', lambda *args, **kwargs: pytest.fail('yapf formatted the config'))
    cfg.dump(str(tmp_path / 'dumped.py'))
    assert cfg.filename == DET and cfg.text == Config.fromfile(DET).text
    dumped = Config.fromfile(str(tmp_path / 'dumped.py')).to_dict()
    expected = Config.fromfile(DET)
    expected.merge_from_dict({'train_cfg.max_epochs': 3})
    assert dumped == expected.to_dict() and dumped['train_cfg']['max_epochs'] == 3


@pytest.mark.parametrize('text, says', [
    ("x = dict(\n", ["is not valid Python", "line 1", "'(' was never closed", 'fix that line']),
    ("_base_ = ['./no_such_base.py']\n", ['inherits from', 'no_such_base.py', 'which does not exist', '_base_ list']),
    ("_base_ = ['mmdet::pvt/retinanet_pvt-t_fpn_1x_cocoo.py']\n",  # mmengine's check_file_exist (was its traceback)
     ["inherits from 'mmdet::pvt/retinanet_pvt-t_fpn_1x_cocoo.py', which does not exist (did you mean "
      "'mmdet::pvt/retinanet_pvt-t_fpn_1x_coco.py'", '_base_ list']),
    (f"_base_ = [{DET!r}]\nmodel = dict(backbone=dict(arch=dict(depths=[1, 1, 1, 1])))\n",
     ['does not fit the configs it inherits from', 'arch', '_delete_=True']),
    (f"_base_ = [{DET!r}]\nx = {{{{_base_.no_such_name}}}}\n",
     ["it uses 'no_such_name', which the configs it inherits from do not define"]),
], ids=['syntax', 'missing-base', 'missing-library-base', 'merge', 'base-variable'])
def test_a_broken_config_is_one_error_naming_it_and_the_fix(tmp_path, text, says):
    """A config that mmengine cannot read (bad Python, a missing base, a value that does not merge into its base's,
    a base variable its bases lack): one UserError naming the config and what to change, not a traceback."""
    path = tmp_path / 'broken.py'
    path.write_text(text)
    with pytest.raises(UserError) as info:
        load_config(str(path))
    message = str(info.value)
    assert f"config {str(path)!r}" in message and all(part in message for part in says), message


def test_an_error_of_code_the_config_imports_is_not_called_a_config_error(tmp_path, monkeypatch):
    """An error raised by a module of the config's custom_imports is that module's: it comes through as it is."""
    (tmp_path / 'module_that_fails.py').write_text("raise KeyError('raised by the module')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / 'imports.py'
    path.write_text("custom_imports = dict(imports=['module_that_fails'], allow_failed_imports=False)\n")
    with pytest.raises(KeyError, match='raised by the module'):
        load_config(str(path))


def test_a_mistyped_config_path_names_the_close_file_of_its_folder():
    """A config file that is not there, next to one whose name is close: the error names that one."""
    from mmpola.runtime.config import check_config_file
    typo = osp.join('configs', 'demo', 'mask-rcnn_pola-pvt-t_fpn_demo_coco.py')
    real = osp.join('configs', 'demo', 'mask-rcnn_pola-pvt-t_fpn_demo-coco.py')
    with pytest.raises(UserError) as info:
        check_config_file(osp.join(REPO, typo))
    assert str(info.value) == (f"config file {osp.join(REPO, typo)!r} does not exist; "
                               f"did you mean {osp.join(REPO, real)!r}?")


def test_a_config_path_with_no_close_file_says_where_configs_live(tmp_path):
    (tmp_path / 'other_name.py').write_text('x = 1\n')
    with pytest.raises(UserError) as info:
        load_config(str(tmp_path / 'mask-rcnn.py'))
    assert 'did you mean' not in str(info.value) and 'configs live in configs/detection' in str(info.value)


SCOPED_BASE = 'detection/mask-rcnn_pola-pvt-t_fpn_1x_coco.py'
_LOAD_AS_A_TOOL = '''
import sys
from mmpola.runtime.cli import exit_on_user_error
from mmpola.runtime.config import load_config
with exit_on_user_error():
    cfg = load_config(sys.argv[1])
print(cfg.model.backbone.type)
'''


def test_mmpola_scoped_bases_in_an_editable_install_are_one_error_with_the_path_that_works(tmp_path):
    """`mmpola::` bases read where mmengine cannot find mmpola's configs (an editable install, read from outside the
    checkout): one error line that says why and gives the base by its path; both paths it gives then load."""
    import json
    import os
    import subprocess
    import sys
    from importlib import metadata
    # the installed distribution, not the checkout's build metadata (mmpola.egg-info) on the tests' path
    installed = [d for d in metadata.distributions(name='mmpola', path=[p for p in sys.path if p and
                                                                        osp.realpath(p) != osp.realpath(REPO)])]
    if not installed:
        pytest.skip('mmpola is not installed here')
    if not json.loads(installed[0].read_text('direct_url.json') or '{}').get('dir_info', {}).get('editable'):
        pytest.skip('mmpola is installed regularly here, where mmpola:: bases resolve (tests/test_packaging.py)')
    project = tmp_path / 'project'
    project.mkdir()
    config = project / 'scoped.py'
    config.write_text(f"_base_ = ['mmpola::{SCOPED_BASE}']\n"
                      "custom_imports = dict(imports=['mmpola'], allow_failed_imports=False)\n")
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    run = subprocess.run([sys.executable, '-c', _LOAD_AS_A_TOOL, str(config)], cwd=project, env=env,
                         capture_output=True, text=True, timeout=300)
    absolute = osp.join(REPO, 'configs', SCOPED_BASE)
    relative = osp.relpath(absolute, str(project))
    assert run.returncode == 2 and run.stdout == '', run.stderr
    assert run.stderr.count('\n') == 1 and run.stderr.startswith(f'error: config {str(config)!r} inherits '
                                                                 f'mmpola::{SCOPED_BASE}, but mmengine'), run.stderr
    for part in ('resolves mmpola:: bases only for an installed mmpola (pip install ., not -e)',
                 'this environment has an editable install (pip install -e .)', 'site-packages',
                 f'the package is {osp.join(REPO, "mmpola")}', f'_base_ = [{absolute!r}]',
                 f'a path relative to the config also works: {relative!r}', 'or install mmpola with pip install .'):
        assert part in run.stderr, (part, run.stderr)
    for name, base in (('absolute.py', absolute), ('relative.py', relative)):
        (project / name).write_text(f'_base_ = [{base!r}]\n')
        assert load_config(str(project / name)).model.backbone.type == 'PolaPVT'


def _config_importing(folder, *modules):
    path = folder / 'imports.py'
    path.write_text(f'custom_imports = dict(imports={list(modules)!r}, allow_failed_imports=False)\n')
    return str(path)


def _load_error(path):
    with pytest.raises(UserError) as info:
        load_config(path)
    assert '\n' not in str(info.value) and 'sys.path' not in str(info.value), str(info.value)
    return str(info.value)


def test_a_misspelled_custom_import_is_one_error_naming_the_module_and_the_close_one(tmp_path):
    """A module of custom_imports that cannot be found: one error naming it, a module of a close name (here in the
    config's folder, which is not on Python's path) and the fix, instead of mmengine's dump of sys.path."""
    (tmp_path / 'my_attention.py').write_text('x = 1\n')
    path = _config_importing(tmp_path, 'mmpola', 'my_atention')
    assert _load_error(path) == (
        f"config {path!r} imports the module 'my_atention' (custom_imports), which cannot be found (no module named "
        f"'my_atention'); did you mean 'my_attention' (in {tmp_path}, not on Python's path)? Fix: check the name; a "
        'module of your own must be importable: its folder on PYTHONPATH, e.g. PYTHONPATH=. tools/train.py CONFIG '
        'from the folder that holds it')
    message = _load_error(_config_importing(tmp_path, 'zq_no_module_of_this_name'))
    assert "which cannot be found (no module named 'zq_no_module_of_this_name'). Fix: check the name" in message


def test_a_custom_import_next_to_the_config_but_not_on_the_path_says_which_folder_to_add(tmp_path):
    (tmp_path / 'my_attention.py').write_text('x = 1\n')
    path = _config_importing(tmp_path, 'my_attention')
    assert _load_error(path).endswith(
        f"cannot be found (no module named 'my_attention'): there is one in {tmp_path}, which is not on Python's "
        f'path. Fix: put that folder on PYTHONPATH, e.g. PYTHONPATH={tmp_path} tools/train.py CONFIG')


def test_a_misspelled_submodule_of_custom_imports_names_the_close_submodule(tmp_path, monkeypatch):
    package = tmp_path / 'cfgtest_package'
    package.mkdir()
    (package / '__init__.py').write_text('')
    (package / 'attention.py').write_text('x = 1\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    message = _load_error(_config_importing(tmp_path, 'cfgtest_package.atention'))
    assert ("imports the module 'cfgtest_package.atention' (custom_imports), which cannot be found (no module named "
            "'cfgtest_package.atention'); did you mean 'cfgtest_package.attention'?") in message


def test_a_custom_import_that_exists_but_fails_to_import_keeps_its_own_error(tmp_path, monkeypatch):
    """A module of custom_imports that is there but fails to import itself: the error names it, gives its own
    ImportError and where it was raised, not "cannot be found"."""
    (tmp_path / 'cfgtest_broken.py').write_text('import os\nimport cfgtest_dependency_not_installed\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    path = _config_importing(tmp_path, 'mmpola', 'cfgtest_broken')
    assert _load_error(path) == (
        f"config {path!r} imports the module 'cfgtest_broken' (custom_imports), which is found but fails to import: "
        "ModuleNotFoundError: No module named 'cfgtest_dependency_not_installed' "
        f"({tmp_path / 'cfgtest_broken.py'}, line 2); fix that import in the module (or install what it needs)")
