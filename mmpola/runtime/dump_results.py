"""``tools/test.py --out``: the predictions are written as checkpoints are, and the path is checked first.

mmengine's ``DumpResults`` (and mmdet's ``DumpDetResults``) pickle the predictions straight into the
final file once the whole evaluation is done: a disk that fills leaves a truncated pickle under that
name (an earlier good file of that name is already gone), and a path that cannot be written (a folder,
a missing or read-only folder) fails only then, with a raw ``FileExistsError`` or
``PermissionError``. Here:

* :func:`check_out_path` refuses such a path before anything is built;
* :func:`build_safe_dump_results` (registered as ``SafeDumpResults``; what ``--out`` adds to the
  test evaluator) is the scope's own dump metric (``DumpDetResults`` for mmdet, ``DumpResults``
  otherwise) whose results go through :func:`mmpola.runtime.atomic_files.write_atomic` (temporary file
  in the same folder, then a rename); a write error leaves the earlier file intact and stops with
  :class:`ResultsSaveError`, naming the file, the cause and that nothing was lost;
* :func:`build_safe_output_dir` (registered as ``SafeOutputDir``; what ``--out DIR`` makes of an mmseg
  test evaluator) is the evaluator's metric (``IoUMetric``) writing its prediction maps into a
  temporary folder next to ``DIR`` (``.<name>.<pid>.part``, the same name on every rank); once the
  evaluation is complete the folder replaces ``DIR`` (an earlier ``DIR`` is renamed aside first and
  removed after). A write error (a full disk) removes the temporary folder, leaves an earlier ``DIR`` as
  it was and stops with :class:`ResultsSaveError`. mmseg's metric writes each map straight into ``DIR``,
  so an earlier folder was overwritten map by map and a failure left a mix of old and new maps.
"""
import os
import os.path as osp
import pickle
import shutil

from mmpola.errors import MMPolaUserError, UserError
from mmpola.registry import METRICS

from .atomic_files import fsync_dir, part_name, write_atomic

__all__ = ['ResultsSaveError', 'check_out_path', 'write_results', 'build_safe_dump_results',
           'build_safe_output_dir']


class ResultsSaveError(MMPolaUserError, OSError):
    """The predictions could not be written (disk full, quota); an earlier file of that name is intact."""

    exit_code = 1


def check_out_path(out, folder=False, option='--out'):
    """Raise :class:`mmpola.errors.UserError` unless ``out`` can be written: its folder exists and is
    writable, and it is no folder itself (``folder``: it is a folder of outputs, mmseg's prediction
    maps: an existing one must be a writable folder)."""
    path = osp.abspath(out)
    parent = osp.dirname(path)
    if folder:  # written next to it first, then renamed: its parent folder must be writable
        if osp.exists(path) and not osp.isdir(path):
            raise UserError(f'{option} {out!r} is a file; the predictions are written as one map per image into a '
                            'folder: pass a folder path')
    elif osp.isdir(path):
        raise UserError(f'{option} {out!r} is a folder; pass the file to write, e.g. {osp.join(out, "results.pkl")}')
    missing = parent
    while not osp.exists(missing):
        missing = osp.dirname(missing)
    if missing != parent and not osp.isdir(missing):
        raise UserError(f'{option} {out!r}: {missing!r} is a file, not a folder; pass a path in an existing folder')
    if missing != parent:
        raise UserError(f'{option} {out!r}: the folder {parent!r} does not exist; create it first '
                        f'(mkdir -p {parent}) or pass a path in an existing folder')
    if not osp.isdir(parent):
        raise UserError(f'{option} {out!r}: {parent!r} is a file, not a folder; pass a path in an existing folder')
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f'{option} {out!r}: the folder {parent!r} is not writable; pass a path in a folder '
                        'you can write to')


def write_results(results, path):
    """Pickle ``results`` to ``path`` atomically; a write error raises :class:`ResultsSaveError`."""
    existed = osp.isfile(path)
    try:
        write_atomic(path, lambda f: pickle.dump(results, f))
    except OSError as e:
        cause = f'{e.strerror or e}' + (f' (errno {e.errno})' if e.errno else '')
        earlier = f'the earlier {path} is intact' if existed else f'no file {path} was written'
        raise ResultsSaveError(
            f'could not write the predictions to {path}: {cause}. Nothing was lost: {earlier} and no partial file '
            'was left. Free disk space (or pass an --out on another disk), then run tools/test.py again.') from e


_CLASSES = {}


def _atomic_class(base):
    """``base`` (a dump metric with ``out_file_path``) writing through :func:`write_results`."""
    if base not in _CLASSES:
        def compute_metrics(self, results):
            from mmengine.logging import print_log
            write_results(results, self.out_file_path)
            print_log(f'Results has been saved to {self.out_file_path}.', logger='current')
            return {}

        _CLASSES[base] = type(f'Safe{base.__name__}', (base,), dict(
            compute_metrics=compute_metrics, __module__=__name__,
            __doc__=f'{base.__name__} whose file is written atomically (mmpola.runtime.dump_results).'))
    return _CLASSES[base]


@METRICS.register_module(name='SafeDumpResults')
def build_safe_dump_results(out_file_path, dump_type='DumpResults', **kwargs):
    """The dump metric ``dump_type`` (``'mmdet.DumpDetResults'``, ``'DumpResults'``) writing its pickle
    atomically (see the module doc)."""
    return _atomic_class(_metric_class(dump_type, 'SafeDumpResults dump_type'))(out_file_path=out_file_path, **kwargs)


def _metric_class(metric_type, where):
    """The registered metric class ``metric_type`` (scoped names such as 'mmseg.IoUMetric' included)."""
    from mmengine.registry import METRICS as ROOT_METRICS
    base = ROOT_METRICS.get(metric_type)
    if base is None:
        raise UserError(f'no metric {metric_type!r} is registered ({where})')
    return base


_OUTPUT_CLASSES = {}


def _cause(error):
    return f'{error.strerror or error}' + (f' (errno {error.errno})' if error.errno else '')


def _output_dir_class(base):
    """``base`` (a metric writing into ``output_dir`` in ``process``) writing into a temporary folder that
    replaces the final one once the evaluation is complete."""
    if base in _OUTPUT_CLASSES:
        return _OUTPUT_CLASSES[base]

    def __init__(self, output_dir, **kwargs):
        from mmengine.dist import broadcast_object_list, get_dist_info
        final = osp.abspath(output_dir)
        pid = [os.getpid()]
        if get_dist_info()[1] > 1:
            broadcast_object_list(pid)  # one temporary folder for every rank: rank 0's name
        folder, name = osp.split(final)
        self.final_output_dir = final
        base.__init__(self, output_dir=osp.join(folder, f'.{name}.{pid[0]}.part'), **kwargs)

    def _abandon(self, error):
        shutil.rmtree(self.output_dir, ignore_errors=True)
        earlier = (f'the earlier {self.final_output_dir} is intact' if osp.isdir(self.final_output_dir)
                   else f'no folder {self.final_output_dir} was written')
        raise ResultsSaveError(
            f'could not write the prediction maps to {self.final_output_dir}: {_cause(error)}. Nothing was lost: '
            f'{earlier} and no partial folder was left. Free disk space (or pass an --out on another disk), then run '
            'tools/test.py again.') from error

    def process(self, data_batch, data_samples):
        try:
            base.process(self, data_batch, data_samples)
        except OSError as error:
            _abandon(self, error)

    def compute_metrics(self, results):
        metrics = base.compute_metrics(self, results)
        final, tmp = self.final_output_dir, self.output_dir
        aside = None
        try:
            if osp.isdir(final):
                aside = osp.join(osp.dirname(final), part_name(osp.basename(final) + '.old'))
                os.rename(final, aside)
            os.rename(tmp, final)
        except OSError as error:
            if aside is not None and not osp.exists(final):
                os.rename(aside, final)
            _abandon(self, error)
        fsync_dir(osp.dirname(final))
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
        from mmengine.logging import print_log
        print_log(f'The prediction maps have been saved to {final}.', logger='current')
        return metrics

    cls = type(f'Safe{base.__name__}', (base,), dict(
        __init__=__init__, process=process, compute_metrics=compute_metrics, __module__=__name__,
        __doc__=f'{base.__name__} whose output_dir is written atomically (mmpola.runtime.dump_results).'))
    _OUTPUT_CLASSES[base] = cls
    return cls


@METRICS.register_module(name='SafeOutputDir')
def build_safe_output_dir(output_dir, metric_type='mmseg.IoUMetric', **kwargs):
    """The metric ``metric_type`` (``'mmseg.IoUMetric'``) writing its ``output_dir`` of prediction maps
    atomically (see the module doc)."""
    return _output_dir_class(_metric_class(metric_type, 'SafeOutputDir metric_type'))(output_dir=output_dir, **kwargs)
