"""Class folders through tools/train.py and tools/test.py on the tiny generated ImageNet layout: a
validation split that lacks a class folder keeps the training indices (the shipped configs number every
split from the training split); numbered from its own folders it is refused before anything is built,
naming the class and the option; a class folder without images is named."""
import os
import os.path as osp
import shutil

import pytest
import torch
from mmengine.logging import MMLogger

from tests.fixtures.paths import REPO
from tests.fixtures.tools import load_tool, refused

MMLogger.get_current_instance()  # mmengine's logger keeps the stream it first sees: not a test's capsys
CONFIG = osp.join(REPO, 'configs', 'classification', 'pola-pvt-t_8xb128_in1k.py')


@pytest.fixture
def split_without_ring(tiny_imagenet, tmp_path):
    """The tiny set whose val split lacks the class folder 'ring' (the 3rd of 6), and a config for it."""
    root = tmp_path / 'imagenet'
    shutil.copytree(tiny_imagenet, root)
    shutil.rmtree(root / 'val' / 'ring')
    config = tmp_path / 'tiny.py'
    config.write_text(f"""_base_ = [{CONFIG!r}]
data_root = {str(root) + '/'!r}
model = dict(num_classes=6)
data_preprocessor = dict(mixup=dict(num_classes=6))
loader = dict(num_workers=0, persistent_workers=False, pin_memory=False)
train_dataloader = dict(batch_size=4, **loader, dataset=dict(data_root=data_root))
val_dataloader = dict(batch_size=4, **loader, dataset=dict(data_root=data_root))
test_dataloader = val_dataloader
""")
    return root, str(config)


def test_a_split_lacking_a_class_keeps_the_training_labels(split_without_ring, tmp_path, capsys):
    from mmengine.registry import DATASETS
    root, config = split_without_ring
    MMLogger.get_instance('class_folders')  # mmengine logs to its latest logger: this test's capture
    train = load_tool('train')
    args = train.parse_args([config, '--work-dir', str(tmp_path / 'work')])
    cfg, _, _ = train.build_train_config(args)  # the shipped configs pass the pre-flight checks
    classes = ('circle', 'cross', 'ring', 'square', 'stripes', 'triangle')
    val = DATASETS.build(cfg.val_dataloader.dataset)
    assert val.metainfo['classes'] == classes
    labels = {osp.basename(osp.dirname(val.get_data_info(i)['img_path'])): val.get_data_info(i)['gt_label']
              for i in range(len(val))}
    assert labels == {name: i for i, name in enumerate(classes) if name != 'ring'}  # square is 3, not 2

    # numbered from its own folders (as before): refused through tools/train.py and tools/test.py
    capsys.readouterr()
    option = ['--cfg-options', 'val_dataloader.dataset.classes_from=None', 'test_dataloader.dataset.classes_from=None']
    err = refused(train, [config, '--work-dir', str(tmp_path / 'work')] + option, capsys, work_dir=tmp_path / 'work')
    assert err == (f"val_dataloader: '{root}/val' lacks the class folder(s) 'ring' of the training split, so its "
                   "labels would be numbered differently from the model's classes (every label after a missing "
                   'class shifted by one) and the accuracy computed against wrong labels. Fix: number every split '
                   'from the training split: --cfg-options val_dataloader.dataset.classes_from=train')
    checkpoint = tmp_path / 'weights.pth'
    torch.save(dict(state_dict=dict(w=torch.zeros(1))), checkpoint)
    err = refused(load_tool('test'), [config, str(checkpoint), '--work-dir', str(tmp_path / 'test')] + option, capsys)
    assert err.startswith("test_dataloader: '") and 'test_dataloader.dataset.classes_from=train' in err


def test_a_class_folder_without_images_is_named(split_without_ring, tmp_path, capsys):
    root, config = split_without_ring
    for name in ('stripes_0000.JPEG', 'stripes_0001.JPEG', 'stripes_0002.JPEG', 'stripes_0003.JPEG'):
        (root / 'train' / 'stripes' / name).unlink()
    (root / 'train' / 'stripes' / 'notes.txt').write_text('not an image')
    work = tmp_path / 'work'
    err = refused(load_tool('train'), [config, '--work-dir', str(work)], capsys, work_dir=work)
    assert err.startswith(f"train_dataloader: 1 class folder(s) of '{root}/train' hold no image (")
    assert err.endswith("): 'stripes', a class the model would never be trained on. Fix: copy its images there (an "
                        'interrupted copy?), or remove the folder (one class fewer: num_classes too)')


def test_a_flat_split_is_told_to_sort_its_images_into_class_folders(split_without_ring, tmp_path, capsys):
    """ImageNet's validation archive is flat (every image in val/): one line, not a traceback from the listing."""
    root, config = split_without_ring
    images = [p for p in (root / 'val').rglob('*.JPEG')]
    for path in images:
        path.rename(root / 'val' / path.name)
    for folder in [p for p in (root / 'val').iterdir() if p.is_dir()]:
        folder.rmdir()
    work = tmp_path / 'work'
    err = refused(load_tool('train'), [config, '--work-dir', str(work)], capsys, work_dir=work)
    assert err == (f"val_dataloader: '{root}/val' has no class folders ({len(images)} image(s) lie in the folder "
                   'itself): classification data are read as <split>/<class>/<image>, each image\'s label from its '
                   "folder. Fix: move each image into the folder of its class (ImageNet's validation archive is flat: "
                   "its devkit's ground truth gives the classes; docs/data.md)")


def test_a_head_narrower_than_the_class_folders_or_mixup_of_another_width_is_refused(split_without_ring, tmp_path,
                                                                                      capsys):
    """The classes of a class-folder dataset come from its folders: a head narrower than them (labels beyond its
    logits) and Mixup targets of another width than the logits are named before the run (a RuntimeError at the
    first step); a wider head only predicts classes no label has, and trains."""
    root, config = split_without_ring
    work = tmp_path / 'work'
    train = load_tool('train')
    err = refused(train, [config, '--work-dir', str(work), '--cfg-options', 'model.num_classes=4',
                          'data_preprocessor.mixup.num_classes=4'], capsys, work_dir=work)
    assert err.startswith("train_dataloader: the dataset has 6 classes ('circle', 'cross', 'ring', 'square', "
                          f"'stripes', 'triangle') (from the class folders of '{root}/train') but the model predicts "
                          'another number: model.num_classes=4, data_preprocessor.mixup.num_classes=4.'), err
    err = refused(train, [config, '--work-dir', str(work), '--cfg-options', 'model.num_classes=8'], capsys,
                  work_dir=work)
    assert err == ('data_preprocessor.mixup.num_classes=6 differs from model.num_classes=8: the Mixup / CutMix targets '
                   'would not fit the logits and the loss would fail at the first step. Fix: set both to the number of '
                   'classes, e.g. --cfg-options model.num_classes=N data_preprocessor.mixup.num_classes=N')
    args = train.parse_args([config, '--work-dir', str(work), '--cfg-options', 'model.num_classes=8',
                             'data_preprocessor.mixup.num_classes=8'])
    train.build_train_config(args)  # wider than the folders: accepted


def test_a_listed_class_without_a_training_folder_is_named(tiny_imagenet, tmp_path, capsys):
    """Classes from metainfo.classes (the demo config): a class with no folder in the training split is never
    trained on (a missing validation folder is fine: its labels keep the list's numbers)."""
    root = tmp_path / 'imagenet'
    shutil.copytree(tiny_imagenet, root)
    shutil.rmtree(root / 'train' / 'ring')
    work = tmp_path / 'work'
    demo = osp.join(REPO, 'configs', 'demo', 'pola-pvt_demo-imagenet-64x64.py')
    err = refused(load_tool('train'), [demo, '--work-dir', str(work), '--cfg-options', f'data_root={root}/'], capsys,
                  work_dir=work)
    assert err == (f"train_dataloader: '{root}/train' has no class folder for 'ring' of metainfo.classes, a class the "
                   'model would never be trained on. Fix: add its folder of images (an interrupted copy?), or leave it '
                   'out of metainfo.classes (one class fewer: num_classes too)')


def test_tests_without_the_training_split_are_told_where_the_classes_come_from(split_without_ring, tmp_path, capsys):
    root, config = split_without_ring
    shutil.rmtree(root / 'train')
    checkpoint = tmp_path / 'weights.pth'
    torch.save(dict(state_dict=dict(w=torch.zeros(1))), checkpoint)
    err = refused(load_tool('test'), [config, str(checkpoint), '--work-dir', str(tmp_path / 'test')], capsys)
    assert err.startswith(f"test_dataloader: test_dataloader.dataset.classes_from '{root}/train' does not exist: the "
                          "class list (and the label of every image) comes from the training split's class folders. "
                          'Fix: put the training split there')


def test_unreadable_files_in_class_folders_are_named(split_without_ring, tmp_path, capsys):
    """A dangling link, an empty file, a file that is no image, a cut-off JPEG (and, for a user other
    than root, one without read permission) in a class folder: named before anything is built; with
    --skip-data-check the loader names the file (one line) instead of PIL's error naming none."""
    root, config = split_without_ring
    train = load_tool('train')
    folder = root / 'train' / 'circle'
    work = tmp_path / 'work'

    def refusal(*extra):
        return refused(train, [config, '--work-dir', str(work), *extra], capsys, work_dir=work, one_line=False)

    (folder / 'gone.JPEG').symlink_to(tmp_path / 'moved_away.JPEG')
    err = refusal()
    assert err.startswith(f"train_dataloader: 1 of 25 images in the class folders of '{root}/train' do not exist:\n"
                          f'  {folder}/gone.JPEG\nFix: restore them (a link whose target is gone?), or remove them')
    (folder / 'gone.JPEG').unlink()
    (folder / 'empty.JPEG').write_bytes(b'')
    err = refusal()
    assert err.startswith(f"train_dataloader: 1 of 25 images in the class folders of '{root}/train' are empty "
                          f'(0 bytes: an interrupted download or copy):\n  {folder}/empty.JPEG\n')
    assert err.endswith('Fix: replace them with the original files, or remove them from the class folders.')
    (folder / 'empty.JPEG').write_text('<html>not an image</html>')
    jpeg = (folder / 'circle_0000.JPEG').read_bytes()
    (folder / 'cut.JPEG').write_bytes(jpeg[:len(jpeg) // 2])
    err = refusal()
    assert err.startswith(f"train_dataloader: 2 of 26 images in the class folders of '{root}/train' cannot be decoded")
    assert f'  {folder}/cut.JPEG: cut off: a JPEG file without its end marker (FF D9)' in err
    assert f'  {folder}/empty.JPEG: not an image file: no image format starts with the bytes 3c 68' in err
    assert err.endswith('Fix: replace them with the original files (download or copy them again), or remove them '
                        'from the class folders.')

    # the loader names the file where the pre-flight check is skipped
    (folder / 'cut.JPEG').unlink()
    err = refusal('--skip-data-check', '--cfg-options', 'train_dataloader.batch_size=6',
                  'train_dataloader.sampler.shuffle=False')  # circle's 4 images, empty.JPEG and cross's first
    assert err.startswith(f'image {folder}/empty.JPEG cannot be loaded (UnidentifiedImageError: ')
    assert err.endswith('Fix: replace it with the original file (download or copy it again), make it readable by '
                        'this user, or remove it from the dataset') and '\n' not in err

    if os.geteuid() != 0:  # root reads every file whatever its permissions
        (folder / 'empty.JPEG').write_bytes(jpeg)
        (folder / 'empty.JPEG').chmod(0)
        err = refusal()
        assert err.startswith(f"train_dataloader: 1 of 25 images in the class folders of '{root}/train' cannot be "
                              f'read:\n  {folder}/empty.JPEG: Permission denied\nFix: make them readable')
