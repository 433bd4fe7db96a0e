"""COCO annotation files (mmpola.runtime.preflight.coco), through tools/train.py: annotations that
pycocotools or the pipeline cannot use are listed per problem, with ids, images and fixes; a file that
passed is not parsed again while it is unchanged."""
import json
import os.path as osp
import re

import pytest
from mmengine.logging import MMLogger

from mmpola.errors import UserError
from tests.fixtures.paths import REPO
from tests.fixtures.tools import load_tool, refused

DET_DEMO = osp.join(REPO, 'configs', 'demo', 'mask-rcnn_pola-pvt-t_fpn_demo-coco.py')
RETINANET = osp.join(REPO, 'configs', 'detection', 'retinanet_pola-pvt-t_fpn_1x_coco.py')
SEG_DEMO = osp.join(REPO, 'configs', 'demo', 'upernet_pola-swin-t_demo-ade-128x128.py')

MMLogger.get_current_instance()  # mmengine's logger keeps the stream it first sees: not a test's capsys
TRAIN, TEST = load_tool('train'), load_tool('test')


def _det_opts(root, ann='annotations/instances_train.json'):
    return ['--cfg-options', f'train_dataloader.dataset.data_root={root}/', f'train_dataloader.dataset.ann_file={ann}',
            'val_cfg=None', 'val_dataloader=None', 'val_evaluator=None']


def _bad_annotations(coco, path):
    data = json.loads((coco / 'annotations' / 'instances_train.json').read_text())
    anns = [a for a in data['annotations'] if not a['iscrowd']]
    anns[0]['segmentation'] = [[1, 1, 10, 10]]              # a polygon of 2 points
    anns[1]['bbox'] = [1.0, 2.0, float('nan'), 5.0]         # NaN (Python's json writes it as NaN)
    anns[2]['bbox'] = [10, 10, -4, 6]                       # negative width
    del anns[3]['segmentation']                             # no mask, but masks are trained
    extra = [dict(anns[4], id=900 + i, category_id=cat) for i, cat in enumerate((7, 7, 9))]
    data['annotations'] += extra                            # category ids 'categories' lacks
    path.write_text(json.dumps(data))
    return anns, data


def test_unusable_coco_annotations_are_listed(coco, tmp_path, capsys):
    work = tmp_path / 'work'
    ann = coco / 'annotations' / 'bad_train.json'
    anns, data = _bad_annotations(coco, ann)
    files = {img['id']: img['file_name'] for img in data['images']}
    err = refused(TRAIN, [DET_DEMO, '--work-dir', str(work)] + _det_opts(coco, 'annotations/bad_train.json'),
                  capsys, [coco], work, one_line=False)
    assert err.startswith(f"train_dataloader: '{ann}' has annotations the model cannot use:\n")
    lines = err.splitlines()[1:]
    assert f"  1 annotation(s) with segmentation with a polygon with fewer than 3 points: ids {anns[0]['id']} " \
           f"(images {files[anns[0]['image_id']]}); fix: delete those polygons" in err
    assert f"  1 annotation(s) with bbox with NaN/inf: ids {anns[1]['id']} (images {files[anns[1]['image_id']]})" in err
    assert f"  1 annotation(s) with bbox with negative width/height: ids {anns[2]['id']}" in err
    assert f"  1 annotation(s) with no segmentation: ids {anns[3]['id']}" in err
    assert "fix: add their masks, or train boxes only (LoadAnnotations(with_mask=False)" in err
    assert lines[-1].startswith("  3 annotation(s) whose category_id is not in 'categories' (ids 1, 2, 3), which "
                                'mmdet drops silently: category_id 7: 2, category_id 9: 1; fix: add')

    # boxes only (no masks trained or evaluated): a missing or short polygon is no problem
    config = tmp_path / 'boxes.py'
    config.write_text(f"_base_ = [{DET_DEMO!r}]\ntrain_dataloader = dict(dataset=dict(pipeline=["
                      "dict(type='LoadImageFromFile'), dict(type='LoadAnnotations', with_bbox=True), "
                      "dict(type='PackDetInputs')]))\n")
    err = refused(TRAIN, [str(config), '--work-dir', str(work)] + _det_opts(coco, 'annotations/bad_train.json'),
                  capsys, [coco], work, one_line=False)
    assert 'segmentation' not in err and 'with bbox with NaN/inf' in err

    # --skip-data-check: who insists gets past the check (the config is built, nothing checked)
    args = TRAIN.parse_args([DET_DEMO, '--work-dir', str(work), '--skip-data-check']
                            + _det_opts(coco, 'annotations/bad_train.json'))
    cfg, _, _ = TRAIN.build_train_config(args)
    assert cfg.train_dataloader.dataset.ann_file == 'annotations/bad_train.json'


def test_a_checked_annotation_file_is_not_parsed_again_until_it_changes(coco, tmp_path, monkeypatch):
    from mmpola.runtime.preflight import coco as preflight
    ann = tmp_path / 'ann.json'
    ann.write_bytes((coco / 'annotations' / 'instances_train.json').read_bytes())
    names = preflight.checked_coco_categories(str(ann), needs_masks=True)
    assert names == ['circle', 'rectangle', 'triangle']
    monkeypatch.setattr(preflight, 'load_coco_json', lambda path: pytest.fail('parsed a second time'))
    assert preflight.checked_coco_categories(str(ann), needs_masks=True) == names
    monkeypatch.undo()
    monkeypatch.setenv('MMPOLA_CACHE_DIR', str(tmp_path / 'cache'))
    _bad_annotations(coco, ann)  # changed: checked again
    with pytest.raises(UserError, match='has annotations the model cannot use'):
        preflight.checked_coco_categories(str(ann), needs_masks=True)


def _write(coco, name, edit):
    """A copy of the train annotations as ``annotations/<name>``, changed by ``edit(data)``."""
    data = json.loads((coco / 'annotations' / 'instances_train.json').read_text())
    edit(data)
    (coco / 'annotations' / name).write_text(json.dumps(data))
    return data


def test_image_and_annotation_ids_used_twice_are_named(coco, tmp_path, capsys):
    """Two images with one id: mmdet would merge them (one disappears, the other gets both's boxes)."""
    def edit(data):
        data['images'][1]['id'] = data['images'][0]['id']
        data['annotations'][3]['id'] = data['annotations'][2]['id']
    data = _write(coco, 'dup_ids.json', edit)
    work = tmp_path / 'work'
    err = refused(TRAIN, [DET_DEMO, '--work-dir', str(work)] + _det_opts(coco, 'annotations/dup_ids.json'),
                  capsys, [coco], work, one_line=False)
    first, second = data['images'][0], data['images'][1]
    assert f"  1 image id(s) used by several images (id {first['id']}: {first['file_name']}, " \
           f"{second['file_name']}), which mmdet merges into one image" in err
    assert f"  1 annotation id(s) used by several annotations (ids {data['annotations'][2]['id']} (2x)), of which " \
           'pycocotools keeps one per id' in err
    assert 'fix: give every image its own id' in err and 'fix: give every annotation its own id' in err


@pytest.mark.parametrize('which', ['val', 'train'])
def test_a_file_without_annotations_is_refused_before_training(coco, tmp_path, capsys, which):
    """Validation: a whole run, then -1.000 for every metric; training: a bare error inside mmengine."""
    _write(coco, f'no_anns_{which}.json', lambda data: data.pop('annotations'))
    ann = coco / 'annotations' / f'no_anns_{which}.json'
    work = tmp_path / 'work'
    opts = ['--cfg-options'] + [f'{k}.dataset.data_root={coco}/' for k in ('train_dataloader', 'val_dataloader')]
    opts += [f'{which}_dataloader.dataset.ann_file=annotations/no_anns_{which}.json',
             'val_dataloader.dataset.data_prefix.img=train/', f'val_evaluator.ann_file={ann}']
    err = refused(TRAIN, [DET_DEMO, '--work-dir', str(work)] + opts, capsys, [coco], work)
    if which == 'val':
        assert err.startswith(f"val_dataloader: '{ann}' has no 'annotations' list (its keys: categories, images, "
                              'info, licenses), so the COCO metric has no ground truth and would report -1.000')
        assert err.endswith('or train without validation (--cfg-options val_cfg=None val_dataloader=None '
                            'val_evaluator=None)')
    else:
        assert err.startswith(f"train_dataloader: '{ann}' has no 'annotations' list") and 'nothing to train on' in err


def test_exif_rotated_images_whose_boxes_were_drawn_on_the_stored_pixels(tmp_path, capsys, monkeypatch):
    """A RetinaNet (boxes only) would train silently on boxes that miss the objects; the fix it names
    (load without applying the orientation) passes the check."""
    from PIL import Image

    from mmpola.datasets import make_demo_coco
    root = tmp_path / 'coco'
    make_demo_coco(str(root), num_train=3, num_val=1, seed=2, image_shapes=((48, 64),), verbose=False)
    for name in ('000001.jpg', '000003.jpg'):  # stored 64x48, decoded 48x64
        exif = Image.Exif()
        exif[0x0112] = 6
        Image.open(root / 'train' / name).save(root / 'train' / name, exif=exif, quality=95)
    work = tmp_path / 'work'
    opts = _det_opts(root) + ['train_dataloader.dataset.data_prefix.img=train/', 'model.backbone.init_cfg=None',
                              'model.bbox_head.num_classes=3',
                              "train_dataloader.dataset.metainfo.classes=['circle','rectangle','triangle']"]
    err = refused(TRAIN, [RETINANET, '--work-dir', str(work)] + opts, capsys, [root], work, one_line=False)
    ann = root / 'annotations' / 'instances_train.json'
    assert err.startswith(f"train_dataloader: 2 of 3 images of '{ann}' are not the size the file says (width x "
                          'height), so their boxes and masks would not lie on the objects:\n'
                          '  000001.jpg: 64x48 in the file, decoded 48x64 (EXIF orientation 6: the decoder turns it '
                          'by 90 degrees)\n  000003.jpg: 64x48')
    option = 'train_dataloader.dataset.pipeline.0.color_type=color_ignore_orientation'
    assert f'(e.g. --cfg-options {option})' in err
    args = TRAIN.parse_args([RETINANET, '--work-dir', str(work)] + opts + [option])
    cfg, _, _ = TRAIN.build_train_config(args)  # the named fix passes the pre-flight checks
    assert cfg.train_dataloader.dataset.pipeline[0].color_type == 'color_ignore_orientation'


def test_a_metric_scoring_against_another_annotation_file_is_refused(coco, tmp_path, capsys):
    """The test / validation set's predictions scored with the training file's ground truth: the
    metric's file must list the images the dataset reads (through tools/test.py and tools/train.py)."""
    import torch
    train_ann = coco / 'annotations' / 'instances_train.json'
    val_ann = coco / 'annotations' / 'instances_val.json'
    checkpoint = tmp_path / 'weights.pth'
    torch.save(dict(state_dict=dict(w=torch.zeros(1))), checkpoint)
    work = tmp_path / 'work'
    err = refused(TEST, [DET_DEMO, str(checkpoint), '--work-dir', str(work), '--cfg-options', f'data_root={coco}/',
                         f'test_evaluator.ann_file={train_ann}'], capsys, [coco])
    assert err == (f"test_evaluator.ann_file '{train_ann}' is not the annotation file of the images test_dataloader "
                   f"reads ('{val_ann}'): it has 2 image(s) the dataset does not read (e.g. id 3: '000003.jpg'), "
                   "counted as missed; the COCO metric would score the predictions against other images' ground "
                   f"truth. Fix: --cfg-options test_evaluator.ann_file={val_ann} (the dataset's file)")

    def renamed(data):  # the same number of images, other files under the same ids
        for img in data['images']:
            img['file_name'] = 'other_' + img['file_name']
    _write(coco, 'renamed.json', renamed)
    opts = ['--cfg-options', f'data_root={coco}/', f"val_evaluator.ann_file={coco / 'annotations' / 'renamed.json'}",
            'val_dataloader.dataset.ann_file=annotations/instances_train.json',
            'val_dataloader.dataset.data_prefix.img=train/']
    err = refused(TRAIN, [DET_DEMO, '--work-dir', str(work)] + opts, capsys, [coco], work)
    assert err.startswith("val_evaluator.ann_file '") and "4 image id(s) name another file there (e.g. id 1: " \
        "'other_000001.jpg' there, '000001.jpg' in the dataset)" in err

    # the dataset's own file (the shipped configs) passes
    args = TEST.parse_args([DET_DEMO, str(checkpoint), '--work-dir', str(work), '--cfg-options', f'data_root={coco}/'])
    cfg, _, _ = TEST.build_test_config(args)
    assert cfg.test_evaluator.ann_file == f'{val_ann}'


def test_annotations_that_cannot_train(coco, tmp_path, capsys):
    """Only crowd regions (losses 0 all run), boxes written as corners (off their polygons): refused with
    the file, the count, an annotation id and the fix; the fixed file passes."""
    work = tmp_path / 'work'

    def all_crowd(data):
        for ann in data['annotations']:
            ann['iscrowd'] = 1
    data = _write(coco, 'crowd.json', all_crowd)
    err = refused(TRAIN, [DET_DEMO, '--work-dir', str(work)] + _det_opts(coco, 'annotations/crowd.json'), capsys,
                  [coco], work)
    assert err == (f"train_dataloader: all {len(data['annotations'])} annotations of "
                   f"'{coco / 'annotations' / 'crowd.json'}' have iscrowd=1 (e.g. annotation id "
                   f"{data['annotations'][0]['id']}), which mmdet treats as regions to ignore: the box and mask "
                   'losses would be 0 for the whole run. Fix: set iscrowd=0 for the objects to learn (iscrowd=1 '
                   'only marks crowds)')

    def corners(data):
        for ann in data['annotations']:
            if isinstance(ann['segmentation'], list):
                x, y, w, h = ann['bbox']
                ann['bbox'] = [x, y, x + w, y + h]
    data = _write(coco, 'corners.json', corners)
    err = refused(TRAIN, [DET_DEMO, '--work-dir', str(work)] + _det_opts(coco, 'annotations/corners.json'), capsys,
                  [coco], work)
    # (an object at the image's top-left corner has nearly the same box either way: not counted)
    polygons = sum(isinstance(a['segmentation'], list) for a in data['annotations'])
    match = re.match(f"train_dataloader: (\\d+) of the {polygons} annotations with polygons of "
                     f"'{re.escape(str(coco / 'annotations' / 'corners.json'))}' have a bbox that does not match "
                     r'their own polygon, e\.g\. annotation id (\d+) \(\d+\.jpg\): bbox \[', err)
    assert match and int(match[1]) >= polygons // 2, err
    first = next(a for a in data['annotations'] if a['id'] == int(match[2]))
    x, y, x2, y2 = first['bbox']
    assert f'bbox {first["bbox"]} spans x {x:g}..{x + x2:g}, y {y:g}..{y + y2:g}, its polygon x ' in err
    assert err.endswith('They look like x1,y1,x2,y2 corners; COCO boxes are [x, y, width, height]. Fix: write each '
                        'bbox as [x, y, width, height] of its object (e.g. from the polygon: [min x, min y, max x - '
                        'min x, max y - min y])')

    def fixed(data):  # the fix the message names
        for ann in (a for a in data['annotations'] if isinstance(a['segmentation'], list)):
            xs, ys = ann['segmentation'][0][0::2], ann['segmentation'][0][1::2]
            ann['bbox'] = [min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys)]
    _write(coco, 'fixed.json', lambda data: (corners(data), fixed(data)))
    args = TRAIN.parse_args([DET_DEMO, '--work-dir', str(work)] + _det_opts(coco, 'annotations/fixed.json'))
    TRAIN.build_train_config(args)


def test_a_crowd_rle_mask_of_another_size_than_its_image(coco, tmp_path, capsys):
    """An RLE mask encoded at another size (a crowd region of a resized copy of the image): named with the
    sizes and the fix before anything is built (mmdet's LoadAnnotations: `ValueError: all input arrays must
    have the same shape`, naming no file, at the first batch holding that image)."""
    def edit(data):
        crowd = next(a for a in data['annotations'] if a['iscrowd'])
        crowd['segmentation']['size'] = [32, 128]  # the same number of pixels, another shape
    data = _write(coco, 'rle_size.json', edit)
    crowd = next(a for a in data['annotations'] if a['iscrowd'])
    image = next(img for img in data['images'] if img['id'] == crowd['image_id'])
    work = tmp_path / 'work'
    err = refused(TRAIN, [DET_DEMO, '--work-dir', str(work)] + _det_opts(coco, 'annotations/rle_size.json'),
                  capsys, [coco], work, one_line=False)
    assert f"  1 annotation(s) with an RLE mask whose size is not its image's: ids {crowd['id']} (images " \
           f"{image['file_name']}), e.g. id {crowd['id']} ({image['file_name']}): RLE size [32, 128] (height, " \
           f"width), the image [{image['height']}, {image['width']}] in 'images'" in err, err
    assert "fix: encode each RLE at its image's size (pycocotools.mask.encode of a height x width mask)" in err


def test_a_box_clipped_to_its_image_matches_a_polygon_past_the_edge():
    """Boxes lie inside their image, a polygon may reach past its edge (the demo data's objects at the
    border): the comparison takes the polygon's bounds inside the image."""
    from mmpola.runtime.preflight.coco import check_trainable_annotations
    poly = [[60.7, -8.6, 133.0, -8.6, 133.0, 63.9, 60.7, 63.9]]
    coco = dict(images=[dict(id=1, file_name='a.jpg', width=128, height=96)],
                annotations=[dict(id=i, image_id=1, iscrowd=0, bbox=[61.0, 0.0, 67.0, 64.0], segmentation=poly)
                             for i in range(3)])
    check_trainable_annotations(coco, 'ann.json', 'train_dataloader')  # no error
    for ann in coco['annotations']:
        ann['bbox'] = [61.0, 0.0, 128.0, 64.0]  # x1, y1, x2, y2 corners
    with pytest.raises(Exception, match='have a bbox that does not match their own polygon'):
        check_trainable_annotations(coco, 'ann.json', 'train_dataloader')
