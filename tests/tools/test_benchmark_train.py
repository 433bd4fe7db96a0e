"""tools/benchmark.py train: a real config trains on generated data and is timed (and profiled); the
configs compared get the same hooks; the generated data has the config's classes and 5 to 15 objects
an image; a config of a package that is not installed is one line; the CUDA profile summary adds up a
made-up event list as it should (no timing is asserted)."""
import argparse
import json
import os
import os.path as osp
import re

import pytest
import torch

from tests.fixtures.paths import CONFIGS, PYTHON
from tests.fixtures.runs import run_tool
from tests.fixtures.tools import load_tool, table_rows

TRAIN = load_tool('benchmark_train')
RETINANET = osp.join(CONFIGS, 'detection', 'retinanet_pola-pvt-t_fpn_1x_coco.py')
RETINANET_REFERENCE = 'mmdet::pvt/retinanet_pvt-t_fpn_1x_coco.py'


def bench_args(**kwargs):
    values = dict(seed=0, hooks='mmpola', batch_size=None, img_scale=None, data_root=None, warmup=1, iters=1,
                  profile=None, amp=False)
    values.update(kwargs)
    return argparse.Namespace(**values)


def test_train_prints_the_table_and_writes_the_profile(tmp_path):
    log = run_tool([PYTHON, 'tools/benchmark.py', 'train', RETINANET, '--iters', '3', '--warmup', '1', '--device',
                    'cpu', '--img-scale', '160', '128', '--batch-size', '1', '--profile', str(tmp_path)])
    assert '# benchmark train' in log and 'torch.compile for the fast path' in log  # the environment lines
    assert '| config | device | amp | batch | s/iter median |' in log
    row = next(line for line in log.splitlines() if line.startswith('| retinanet_pola-pvt-t_fpn_1x_coco |'))
    cells = [c.strip() for c in row.strip('|').split('|')]
    assert cells[1:4] == ['cpu', 'off', '1']
    median, fastest, images_per_s, data, peak = (float(c) for c in cells[4:9])
    assert 0 < fastest <= median and images_per_s == pytest.approx(1 / median, rel=0.02)
    assert 0 <= data < median and peak > 0
    assert cells[9] == '-'  # too few timed iterations to tell a trend
    assert f'[1/1] retinanet_pola-pvt-t_fpn_1x_coco: {median:.3f} s/iter (median; min {fastest:.3f}), peak ' in log
    assert 'hooks: RuntimeInfoHook, RandomStateHook, NonFiniteLossHook' in log and 'CheckpointHook' not in log
    # the generated images' orientations (seeded): the first timed iteration at a new size, then the warm-up's twice
    assert re.search(r'batch input sizes: 2 distinct over 3 timed iterations; 1 at a size new to the run ', log)
    assert re.search(r'- the same batch again \(the last 1 timed iterations at a size new to the run, each run once '
                     r'more after the timed ones\): median [0-9.]+ s against [0-9.]+ s at its first pass, without its '
                     r'loading \([0-9.]+x\); 160x128 ', log)

    stem = 'retinanet_pola-pvt-t_fpn_1x_coco'
    with open(tmp_path / f'{stem}_trace.json') as f:
        trace = json.load(f)
    assert any(e.get('name') == 'model.backbone' for e in trace['traceEvents'])
    summary = (tmp_path / f'{stem}_profile.md').read_text()
    assert summary in log  # printed and saved
    assert '### Top 15 ops by self CPU time' in summary
    assert re.search(r'aten ops \(at every nesting level\): [1-9]', summary)
    with open(tmp_path / f'{stem}_profile.json') as f:
        numbers = json.load(f)
    parts = numbers['parts']
    assert {'model.backbone', 'model.neck', 'model.bbox_head', 'optim_wrapper.backward', 'optim_wrapper.step'} \
        <= set(parts)
    for name in ('model.backbone', 'model.bbox_head'):  # a head's forward inside its loss: one range
        assert parts[name]['cpu_ms'] > 0 and parts[name]['calls'] == 1
    assert sum(p['cpu_ms'] for p in parts.values()) <= numbers['wall_ms'] * 1.01  # the parts do not overlap
    assert len(numbers['top_ops']) == 15 and numbers['syncs']['aten::_local_scalar_dense'] > 0
    with open(tmp_path / f'{stem}_iterations.json') as f:
        iterations = json.load(f)
    times = sorted(iteration['seconds'] for iteration in iterations['iterations'])
    assert times[1] == pytest.approx(median, abs=6e-4) and times[0] == pytest.approx(fastest, abs=6e-4)
    for iteration in iterations['iterations']:
        assert all(side % 32 == 0 and side <= 160 for side in iteration['size'])  # mmdet pads to a multiple of 32
    (again,) = iterations['again']
    assert again['size'] == [160, 128] and again['again_seconds'] > 0 and again['first_seconds'] > 0


@pytest.mark.parametrize('mode', ['mmpola', 'library'])
def test_mmpola_config_and_its_reference_run_the_same_hooks(tmp_path, mode):
    """The reference gets mmpola's runtime hooks ('mmpola') or mmpola's config loses them ('library');
    neither saves checkpoints, validates or loads weights."""
    args = bench_args(hooks=mode, data_root=str(tmp_path), img_scale=(160, 128), batch_size=1)
    configs = {}
    for spec in (RETINANET, RETINANET_REFERENCE):
        cfg, scope, info = TRAIN.prepare_config(spec, args, str(tmp_path / TRAIN.file_stem(spec)))
        assert scope == 'mmdet' and cfg.default_hooks.checkpoint is None
        assert cfg.model.backbone.init_cfg is None and cfg.load_from is None
        assert cfg.val_cfg is None and cfg.val_dataloader is None
        assert cfg.train_dataloader.batch_size == 1 and cfg.train_dataloader.dataset.indices == 2
        assert cfg.train_dataloader.dataset.data_root == str(tmp_path)
        steps = [{k: v for k, v in step.items() if k != '_scope_'} for step in cfg.train_dataloader.dataset.pipeline]
        assert dict(type='Resize', scale=(160, 128), keep_ratio=True) in steps
        configs[spec] = info['hooks']
    assert configs[RETINANET] == configs[RETINANET_REFERENCE]
    has_ours = 'NonFiniteLossHook' in configs[RETINANET]
    assert has_ours == (mode == 'mmpola')


def test_cfg_options_reach_every_config_and_are_noted(tmp_path):
    """--cfg-options as tools/train.py reads them: here mmpola's optimizer step for mmdet's config."""
    options = ['optim_wrapper.optimizer.fused=True',
               'optim_wrapper.constructor=mmpola.MergedGroupsOptimWrapperConstructor']
    args = bench_args(data_root=str(tmp_path), img_scale=(160, 128), batch_size=1, cfg_options=options)
    cfg, _, info = TRAIN.prepare_config(RETINANET_REFERENCE, args, str(tmp_path / 'reference'))
    assert cfg.optim_wrapper.optimizer.fused is True and cfg.optim_wrapper.optimizer.type == 'AdamW'
    assert cfg.optim_wrapper.constructor == 'mmpola.MergedGroupsOptimWrapperConstructor'
    assert f"--cfg-options {' '.join(options)}" in info['notes']
    _, _, info = TRAIN.prepare_config(RETINANET_REFERENCE, bench_args(data_root=str(tmp_path), batch_size=1),
                                      str(tmp_path / 'plain'))
    assert not any(note.startswith('--cfg-options') for note in info['notes'])
    with pytest.raises(Exception, match='weight_decy'):  # a misspelled key: tools/train.py's check
        TRAIN.prepare_config(RETINANET_REFERENCE, bench_args(data_root=str(tmp_path), batch_size=1, cfg_options=[
            'optim_wrapper.optimizer.weight_decy=0.1']), str(tmp_path / 'misspelled'))


def test_img_scale_reaches_every_choice_of_a_multi_scale_pipeline():
    from mmengine.config import Config
    cfg = Config.fromfile(osp.join(CONFIGS, 'detection', 'mask-rcnn_pola-swin-t_fpn_ms-crop-3x_coco.py'))
    pipeline = cfg.train_dataloader.dataset.pipeline
    assert TRAIN.override_scale(pipeline, 160, 128) >= 4
    text = str(pipeline)
    assert '1333' not in text and "'scales': [(160, 128)]" in text
    assert "'crop_size': (128, 160)" in text  # (384, 600) capped at (H, W)


def test_generated_coco_has_the_configs_classes_and_several_objects(tmp_path):
    from mmengine.config import Config

    from mmpola.runtime.config import register_task_modules
    cfg = Config.fromfile(RETINANET)
    register_task_modules(cfg)
    dataset = cfg.train_dataloader.dataset
    TRAIN.generate_data(dataset, 'mmdet', 3, str(tmp_path), seed=0)
    with open(osp.join(dataset.data_root, dataset.ann_file)) as f:
        data = json.load(f)
    assert len(data['categories']) == 80 and data['categories'][0]['name'] == 'person'
    assert len(data['images']) == 3 and min(min(image['height'], image['width']) for image in data['images']) >= 427
    for image in data['images']:
        objects = [a for a in data['annotations'] if a['image_id'] == image['id'] and not a['iscrowd']]
        assert 5 <= len(objects) <= 15
        assert osp.isfile(osp.join(dataset.data_root, dataset.data_prefix['img'], image['file_name']))


def test_a_config_of_a_missing_package_is_one_line(capsys):
    bench = load_tool('benchmark')
    with pytest.raises(SystemExit) as exc:
        bench.main(['train', 'mmnotinstalled::pvt/retinanet.py', '--device', 'cpu', '--malloc', 'default'])
    assert exc.value.code == 2
    out = capsys.readouterr().out
    skipped = [line for line in out.splitlines() if line.startswith('skipped ')]
    assert skipped == ["skipped mmnotinstalled::pvt/retinanet.py: the package 'mmnotinstalled' is not installed here, "
                       'so its configs are not either (install it, see requirements/pins.txt, or leave this config '
                       'out)']


def test_profile_summary_of_a_cuda_iteration():
    """The CUDA summary from a made-up event list (this suite has no GPU): kernels and device time come
    from the device's events (range annotations on its timeline are not kernels), a part's device time
    includes the kernels of backward ops on autograd's own thread, each kind of sync is counted, and the host's
    table has the CPU's self time of ops, runtime calls and each part's own code."""
    from types import SimpleNamespace

    import torch
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    def event(name, thread, start, end, parent=None, kernel=None, device=False, annotation=False):
        e = FunctionEvent(id=len(events) + 1, name=name, thread=thread, start_us=start, end_us=end, use_device='cuda',
                          device_type=DeviceType.CUDA if device else DeviceType.CPU, is_user_annotation=annotation)
        if parent is not None:
            e.set_cpu_parent(parent)
            parent.append_cpu_child(e)
        if kernel is not None:
            e.append_kernel(kernel[0], 0, kernel[1])
        events.append(e)
        return e

    events = []
    backbone = event('model.backbone', 1, 0, 100, annotation=True)
    event('aten::mm', 1, 10, 50, parent=backbone, kernel=('gemm_a', 30))
    event('optim_wrapper.backward', 1, 100, 300, annotation=True)
    node = event('autograd::engine::evaluate_function: MmBackward0', 2, 120, 200)  # autograd's thread
    event('aten::mm', 2, 130, 190, parent=node, kernel=('gemm_b', 60))
    event('aten::_local_scalar_dense', 1, 310, 320, kernel=('Memcpy DtoH (Device -> Pageable)', 5))
    event('cudaDeviceSynchronize', 1, 320, 330)
    event('gemm_a', 7, 20, 50, device=True)
    event('gemm_b', 7, 140, 200, device=True)
    event('Memcpy DtoH (Device -> Pageable)', 7, 312, 317, device=True)
    event('model.backbone', 7, 20, 50, device=True, annotation=True)
    profiler = SimpleNamespace(prof=SimpleNamespace(events=lambda: events),
                               labels=['model.backbone', 'optim_wrapper.backward'])

    summary = TRAIN.summarize_profile(profiler, 0.001, torch.device('cuda'))
    # torch 2.11's events have no activity type: the same summary
    for e in events:
        e.__dict__.pop('activity_type', None)
    assert TRAIN.summarize_profile(profiler, 0.001, torch.device('cuda')) == summary
    assert summary['device_ms'] == pytest.approx(0.095) and summary['kernels'] == 2
    assert [(k['name'], k['calls'], round(k['ms'], 3)) for k in summary['top_kernels']] == [
        ('gemm_b', 1, 0.06), ('gemm_a', 1, 0.03), ('Memcpy DtoH (Device -> Pageable)', 1, 0.005)]
    assert summary['parts']['model.backbone'] == dict(calls=1, cpu_ms=pytest.approx(0.1), device_ms=pytest.approx(0.03))
    assert summary['parts']['optim_wrapper.backward']['device_ms'] == pytest.approx(0.06)
    assert summary['syncs']['aten::_local_scalar_dense'] == 1 and summary['syncs']['Memcpy DtoH'] == 1
    assert summary['syncs']['cudaDeviceSynchronize'] == 1 and summary['syncs']['aten::item'] == 0
    assert summary['top_ops'][0] == dict(name='aten::mm', calls=2, self_ms=pytest.approx(0.09),
                                         percent=pytest.approx(100 * 90 / 95))
    text = TRAIN.render_profile(summary, 'made-up')
    assert '- kernels launched: 2' in text and '| optim_wrapper.backward | 1 | 0.2 | 0.1 | 63.2 |' in text
    assert '| gemm_b | 1 | 0.06 | 63.2 |' in text
    # the host's side: self CPU time of ops, runtime calls and the parts' own code (wall time 1 ms)
    host = {entry['name']: (entry['calls'], round(entry['self_ms'], 3)) for entry in summary['top_host']}
    assert host == {'aten::mm': (2, 0.1), 'optim_wrapper.backward (own code)': (1, 0.2),
                    'model.backbone (own code)': (1, 0.06), 'cudaDeviceSynchronize': (1, 0.01),
                    'aten::_local_scalar_dense': (1, 0.01),
                    'autograd::engine::evaluate_function: MmBackward0': (1, 0.02)}, host
    assert [entry['name'] for entry in summary['top_host']][:2] == ['optim_wrapper.backward (own code)', 'aten::mm']
    assert '### Top 15 by host time' in text and '| optim_wrapper.backward (own code) | 1 | 0.20 | 20.0 |' in text


def test_triton_compilations_are_counted_while_asked_and_the_hook_restored():
    """The count of kernels Triton compiles in the timed iterations: through Triton's public post-compile hook,
    only while ``counting()`` is true, with a hook already set still called and set again afterwards."""
    pytest.importorskip('triton')
    from types import SimpleNamespace

    from triton import knobs

    earlier = []

    def previous(**kwargs):
        earlier.append(kwargs['fn'].name)

    def compile_kernel(name):  # what Triton's JIT does after each compilation
        knobs.runtime.jit_post_compile_hook(key='k', repr=name, fn=SimpleNamespace(name=name), compile={},
                                            is_manual_warmup=False, already_compiled=False)

    timed = [False]
    knobs.runtime.jit_post_compile_hook = previous
    try:
        with TRAIN.triton_compilations(lambda: timed[0]) as compiled:
            compile_kernel('_warm_up_kernel')
            timed[0] = True
            compile_kernel('_pola_fwd_keys')
            compile_kernel('_pola_fwd_keys')
            compile_kernel('_dw_conv_kernel')
        assert knobs.runtime.jit_post_compile_hook is previous
    finally:
        knobs.runtime.jit_post_compile_hook = None
    assert compiled == ['_pola_fwd_keys', '_pola_fwd_keys', '_dw_conv_kernel']
    assert earlier == ['_warm_up_kernel', '_pola_fwd_keys', '_pola_fwd_keys', '_dw_conv_kernel']
    assert TRAIN.compilations_text(compiled) == '3 (_dw_conv_kernel, _pola_fwd_keys x2)'
    assert TRAIN.compilations_text([]) == '0'


def test_the_peak_memory_survives_mmengines_logger_resetting_it(monkeypatch):
    """mmengine's logger reads the CUDA peak and resets it at each logging iteration, after the step and before the
    timing's last hook: the peak of the timed iterations is read before the logger too (at the first hook)."""
    from types import SimpleNamespace

    import torch
    state = dict(peak=0, current=100)  # MiB: the peak since the last reset, and what stays allocated
    monkeypatch.setattr(TRAIN, '_peak_mib', lambda device: state['peak'])
    monkeypatch.setattr(TRAIN, '_reset_peak', lambda device: state.update(peak=state['current']) or True)
    monkeypatch.setattr(TRAIN, '_synchronize', lambda device: None)
    clock = TRAIN.IterationClock(torch.device('cpu'), warmup=1, iters=3)
    first, last = TRAIN.timing_hooks(clock)
    runner = SimpleNamespace(train_loop=SimpleNamespace(stop_training=False))
    last.before_train(runner)
    for i, step_peak in enumerate([900, 500, 700, 400]):  # a warm-up iteration, then the timed ones
        first.before_train_iter(runner, i)
        state['peak'] = max(state['peak'], step_peak)  # the step's activations
        first.after_train_iter(runner, i)
        if i % 2 == 1:  # the logger, as mmengine's get_max_cuda_memory
            state['peak'] = state['current']
        last.after_train_iter(runner, i)
    assert clock.peak_mib == 700 and len(clock.iter_times) == 3 and runner.train_loop.stop_training


def test_the_batch_input_size_is_the_padded_size_the_data_preprocessor_makes():
    from mmdet.models.data_preprocessors import DetDataPreprocessor
    from mmseg.models.data_preprocessor import SegDataPreProcessor
    images = [torch.zeros(3, 100, 130, dtype=torch.uint8), torch.zeros(3, 90, 150, dtype=torch.uint8)]
    model = torch.nn.Module()
    model.data_preprocessor = DetDataPreprocessor(pad_size_divisor=32)
    assert TRAIN.batch_input_size(model, dict(inputs=images, data_samples=[])) == (128, 160)
    assert model.data_preprocessor(dict(inputs=images, data_samples=None))['inputs'].shape[-2:] == (128, 160)
    model.data_preprocessor = SegDataPreProcessor(size=(128, 128))  # a segmentation crop: padded to it
    assert TRAIN.batch_input_size(model, dict(inputs=images)) == (128, 150)
    assert TRAIN.batch_input_size(model, dict(inputs=[])) is None and TRAIN.batch_input_size(model, None) is None


def test_iterations_at_a_new_size_are_told_from_those_at_a_size_seen_before(monkeypatch):
    """Each timed iteration keeps its batch input size and whether an earlier one (warm-up included) had it; the
    summary sets the medians of the two groups side by side and names the slowest and fastest with their sizes."""
    from types import SimpleNamespace
    monkeypatch.setattr(TRAIN, '_synchronize', lambda device: None)
    now = [0.0]
    monkeypatch.setattr(TRAIN.time, 'perf_counter', lambda: now[0])
    model = torch.nn.Module()  # no data preprocessor: the largest image's size
    runner = SimpleNamespace(model=model, train_loop=SimpleNamespace(stop_training=False))
    clock = TRAIN.IterationClock(torch.device('cpu'), warmup=1, iters=3)
    clock.last_end = 0.0
    for side, seconds in ((64, 3.0), (96, 2.0), (64, 0.5), (128, 1.0)):  # a warm-up iteration, then the timed ones
        clock.begin(runner, dict(inputs=[torch.zeros(3, side, side), torch.zeros(3, 32, side)]))
        now[0] += seconds
        clock.end(runner)
    assert clock.iter_sizes == [(96, 96), (64, 64), (128, 128)] and clock.iter_new == [True, False, True]
    summary = TRAIN.sizes_summary(clock.iter_times, clock.iter_sizes, clock.iter_new)
    assert (summary['distinct'], summary['new']) == (3, 2)
    assert summary['new_median'] == pytest.approx((2.0 + 1.0) / 2) and summary['seen_median'] == pytest.approx(0.5)
    assert TRAIN.sizes_text(summary) == (
        'batch input sizes: 3 distinct over 3 timed iterations; 2 at a size new to the run (median 1.500 s/iter), '
        '1 at a size seen before (median 0.500); slowest 2.000 s at 96x96 (new), 1.000 s at 128x128 (new), '
        '0.500 s at 64x64 (seen); fastest 0.500 s at 64x64 (seen)')


def test_batches_at_a_new_size_run_once_more_after_the_timed_iterations(monkeypatch):
    """The last few timed iterations at a size new to the run (AGAIN) run their batch once more, by the model's
    train_step with the runner's optimizer wrapper, after the last timed iteration (outside the timed ones): what
    the same work costs once its size has been seen, beside its first pass less its loading. The profiled
    iteration's batch, at a new size, runs once more under a profile of its own."""
    from types import SimpleNamespace
    monkeypatch.setattr(TRAIN, '_synchronize', lambda device: None)
    now = [0.0]
    monkeypatch.setattr(TRAIN.time, 'perf_counter', lambda: now[0])
    monkeypatch.setattr(TRAIN, 'batch_input_size', lambda model, batch: batch['size'])
    ran = []

    class Model(torch.nn.Module):
        def train_step(self, data, optim_wrapper):
            assert optim_wrapper is runner.optim_wrapper
            ran.append((data['size'], clock.index))
            now[0] += 0.25

    runner = SimpleNamespace(model=Model(), train_loop=SimpleNamespace(stop_training=False),
                             optim_wrapper=SimpleNamespace(backward=lambda loss: None, step=lambda: None,
                                                           zero_grad=lambda: None))
    clock = TRAIN.IterationClock(torch.device('cpu'), warmup=1, iters=5, profiler=TRAIN.IterationProfiler(
        torch.device('cpu')))
    clock.last_end = 0.0
    # the warm-up at A; timed B, C (new), A (seen), D, E (new); the profiled iteration at F (new)
    for size, seconds in (('A', 1.0), ('B', 2.0), ('C', 3.0), ('A', 0.5), ('D', 4.0), ('E', 5.0), ('F', 6.0)):
        batch = dict(size=(size, size))
        now[0] += 0.125  # its loading
        clock.begin(runner, batch)
        now[0] += seconds
        clock.end(runner, batch)
        assert not ran or clock.index >= 6  # none inside the timed iterations
    assert ran == [(('C', 'C'), 5), (('D', 'D'), 5), (('E', 'E'), 5), (('F', 'F'), 6)]
    assert [(a['size'][0], a['first'], a['again']) for a in clock.again] == [('C', 3.0, 0.25), ('D', 4.0, 0.25),
                                                                           ('E', 5.0, 0.25)]
    assert clock.iter_times == [2.125, 3.125, 0.625, 4.125, 5.125]  # the replays are not in them
    assert clock.profiler_again is not None and clock.profiled_again_seconds == 0.25
    assert runner.train_loop.stop_training
    assert clock.again_error is None
    assert TRAIN.again_text(clock.again) == (
        'the same batch again (the last 3 timed iterations at a size new to the run, each run once more after the '
        'timed ones): median 0.250 s against 4.000 s at its first pass, without its loading (0.06x); CxC 3.000 -> '
        '0.250 s, DxD 4.000 -> 0.250 s, ExE 5.000 -> 0.250 s')


def test_a_batch_that_cannot_run_again_leaves_the_timed_iterations(monkeypatch):
    """Running a batch again is an extra: where it fails (out of memory, say), the error is noted for the row and
    the run stops as it would have, its timed iterations kept."""
    from types import SimpleNamespace
    monkeypatch.setattr(TRAIN, '_synchronize', lambda device: None)
    monkeypatch.setattr(TRAIN, 'batch_input_size', lambda model, batch: batch['size'])

    class Model(torch.nn.Module):
        def train_step(self, data, optim_wrapper):
            raise RuntimeError('CUDA out of memory. Tried to allocate 2.00 GiB\nmore')

    runner = SimpleNamespace(model=Model(), train_loop=SimpleNamespace(stop_training=False), optim_wrapper=None)
    clock = TRAIN.IterationClock(torch.device('cpu'), warmup=1, iters=2)
    clock.last_end = 0.0
    for size in ('A', 'B', 'C'):
        batch = dict(size=(size, size))
        clock.begin(runner, batch)
        clock.end(runner, batch)
    assert len(clock.iter_times) == 2 and clock.again == [] and runner.train_loop.stop_training
    assert clock.again_error == 'RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB'


def test_the_allocators_events_are_counted_over_the_timed_iterations_only(monkeypatch):
    """On CUDA each row counts what the caching allocator asked of the driver during the timed iterations (each
    cudaMalloc or cudaFree makes the host wait): the counts after the last timed iteration less those at the end of
    the warm-up. Here the allocator's counters are made up, one cudaMalloc per iteration and a retry in the
    second timed one."""
    from types import SimpleNamespace
    counters = dict(num_device_alloc=0, num_device_free=0, num_alloc_retries=0, num_sync_all_streams=0)
    monkeypatch.setattr(TRAIN, '_synchronize', lambda device: None)
    monkeypatch.setattr(TRAIN, '_reset_peak', lambda device: True)
    monkeypatch.setattr(TRAIN, '_peak_mib', lambda device: 1.0)
    monkeypatch.setattr(TRAIN.torch.cuda, 'memory_stats', lambda device=None: dict(counters))
    clock = TRAIN.IterationClock(torch.device('cuda'), warmup=2, iters=3)
    runner = SimpleNamespace(model=torch.nn.Module(), train_loop=SimpleNamespace(stop_training=False))
    clock.last_end = 0.0
    for i in range(5):
        clock.begin(runner)
        counters['num_device_alloc'] += 1
        if i == 3:
            counters.update(num_alloc_retries=1, num_device_free=4, num_sync_all_streams=1)
        clock.end(runner)
    assert clock.allocator == dict(num_device_alloc=3, num_device_free=4, num_alloc_retries=1, num_sync_all_streams=1)
    assert TRAIN.allocator_text(clock.allocator) == '3 cudaMalloc, 4 cudaFree, 1 retries, 1 syncs of all streams'
    assert TRAIN._allocator_events(torch.device('cpu')) is None
    monkeypatch.delenv('PYTORCH_CUDA_ALLOC_CONF', raising=False)
    assert TRAIN.allocator_settings() == 'its defaults'
    monkeypatch.setenv('PYTORCH_CUDA_ALLOC_CONF', 'expandable_segments:True')
    assert TRAIN.allocator_settings() == 'PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True'


def test_a_profile_summary_that_fails_leaves_the_trace_and_says_why(tmp_path, monkeypatch):
    """Where torch's profiler events lack what the summary reads, the config's row and the chrome trace stay and
    the summary is one line saying why (the timed iterations are not lost to the profile)."""
    from types import SimpleNamespace

    import torch

    def summary_of_other_events(*args):
        raise AttributeError("'FunctionEvent' object has no attribute 'device_time_total'")

    monkeypatch.setattr(TRAIN, 'summarize_profile', summary_of_other_events)
    profiler = SimpleNamespace(prof=SimpleNamespace(export_chrome_trace=lambda path: open(path, 'w').write('{}')))
    text = TRAIN.write_profile(profiler, 0.1, torch.device('cuda'), 'configs/x/a_b.py', str(tmp_path), 'a_b')
    assert (tmp_path / 'a_b_trace.json').is_file()
    assert text.startswith('a_b: no profile summary (AttributeError: ') and str(tmp_path) in text


def test_steadiness_tells_a_falling_run_from_a_steady_one():
    steady = TRAIN.steadiness([1.0, 1.1, 0.9, 1.0, 1.05, 0.95])
    assert steady == pytest.approx(1.0, abs=0.06)
    falling = TRAIN.steadiness([3.0, 2.5, 2.0, 1.2, 1.0, 1.0])
    assert falling < TRAIN.STILL_FALLING
    assert TRAIN.steadiness([1.0, 1.0, 1.0]) is None


def test_also_with_times_each_config_again_with_the_variable_set_right_after_its_row(tmp_path, monkeypatch, capsys):
    """--also-with VARIABLE=VALUE: one more row per use, right after the config's own, with the variable set while
    it runs only (the models read it at each call); the profile is the config's own row's. The rows' training is
    made up here (test_train_prints_the_table_and_writes_the_profile trains for real): each row's median is
    set by what its run saw."""
    monkeypatch.setenv('MMPOLA_RECOMPUTE', 'auto')
    seen = []

    def made_up(spec, args, device):
        seen.append((os.environ.get('MMPOLA_RECOMPUTE'), os.environ.get('MMPOLA_SDPA'), args.profile))
        median = 0.2 * len(seen)
        return dict(config=TRAIN.config_label(spec), spec=spec, variant=None, device='cpu', amp='off', batch=1,
                    median=median, min=median, data=0.01, peak=100.0, peak_reset=True, hooks=['IterTimerHook'],
                    data_info='made up', notes=[], compiled=[], images_per_s=1 / median, trend=None)

    monkeypatch.setattr(TRAIN, '_bench_config', made_up)
    monkeypatch.delenv('MMPOLA_SDPA', raising=False)
    args = bench_args(img_scale=(160, 128), batch_size=1, configs=[RETINANET],
                      also_with=['MMPOLA_RECOMPUTE=torch', ' MMPOLA_SDPA = torch'], profile=str(tmp_path / 'profile'))
    TRAIN.bench_train(args, torch.device('cpu'))
    assert seen == [('auto', None, str(tmp_path / 'profile')), ('torch', None, None), ('auto', 'torch', None)]
    assert os.environ['MMPOLA_RECOMPUTE'] == 'auto' and 'MMPOLA_SDPA' not in os.environ
    out = capsys.readouterr().out
    stem = 'retinanet_pola-pvt-t_fpn_1x_coco'
    rows = table_rows(out, stem)
    assert list(rows) == [stem, f'{stem}, MMPOLA_RECOMPUTE=torch', f'{stem}, MMPOLA_SDPA=torch'], out[-2000:]
    assert '| 2nd half / 1st half | median vs own row |' in out and rows[stem][10] == '-'
    # each variant's median over its config's own row's (0.4 and 0.6 s over 0.2 s)
    assert [rows[name][10] for name in rows] == ['-', '2.00x', '3.00x'], rows
    assert f'[3/3] {stem}, MMPOLA_SDPA=torch: 0.600 s/iter' in out


@pytest.mark.parametrize('value, message', [
    ('MMPOLA_RECOMPUTE', 'takes VARIABLE=VALUE'),
    ('MMPOLA_FOO=1', 'takes VARIABLE=VALUE with one of MMPOLA_DEPTHWISE_CONV, MMPOLA_RECOMPUTE, MMPOLA_SDPA'),
    ('MMPOLA_SDPA=cudnn', "--also-with MMPOLA_SDPA=cudnn: MMPOLA_SDPA='cudnn' is not an implementation")])
def test_also_with_refuses_an_unknown_variable_or_value_before_anything_runs(value, message):
    with pytest.raises(SystemExit, match=re.escape(message)):
        TRAIN.variants(bench_args(also_with=[value]))
