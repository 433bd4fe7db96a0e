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
  :class:`ResultsSaveError`, naming the file, the cause and that nothing was lost.
"""
import os
import os.path as osp
import pickle

from mmpola.errors import MMPolaUserError, UserError
from mmpola.registry import METRICS

from .atomic_files import write_atomic

__all__ = ['ResultsSaveError', 'check_out_path', 'write_results', 'build_safe_dump_results']


class ResultsSaveError(MMPolaUserError, OSError):
    """The predictions could not be written (disk full, quota); an earlier file of that name is intact."""

    exit_code = 1


def check_out_path(out, folder=False, option='--out'):
    """Raise :class:`mmpola.errors.UserError` unless ``out`` can be written: its folder exists and is
    writable, and it is no folder itself (``folder``: it is a folder of outputs, mmseg's prediction
    maps: an existing one must be a writable folder)."""
    path = osp.abspath(out)
    parent = osp.dirname(path)
    if folder:
        if osp.exists(path) and not osp.isdir(path):
            raise UserError(f'{option} {out!r} is a file; the predictions are written as one map per image into a '
                            'folder: pass a folder path')
        if osp.isdir(path):
            parent = path
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
    from mmengine.registry import METRICS as ROOT_METRICS
    base = ROOT_METRICS.get(dump_type)
    if base is None:
        raise UserError(f'no metric {dump_type!r} is registered (SafeDumpResults dump_type)')
    return _atomic_class(base)(out_file_path=out_file_path, **kwargs)
