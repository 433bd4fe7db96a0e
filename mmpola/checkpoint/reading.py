"""Reading checkpoint files: weights only, with an allowlist, and a clear word on files that cannot be read.

torch (>= 2.6 by default) reads checkpoints with ``weights_only=True``: every pickled global it does
not know is refused. Two kinds of checkpoints our users load carry a few such globals:

* checkpoints written by mmengine runs (resume, test, init from a checkpoint) store numpy arrays and
  scalars and mmengine's ``HistoryBuffer`` in ``meta`` / ``message_hub``; ``HistoryBuffer`` pickles
  its statistics methods as ``getattr(HistoryBuffer, 'mean')``;
* official PolaFormer checkpoints store the training config as a ``yacs.config.CfgNode``.

Instead of falling back to ``weights_only=False`` (which runs whatever code the pickle names), exactly
those types are allowlisted (:func:`allowlist`). ``getattr`` is replaced by a stand-in that only
resolves the statistics methods of ``HistoryBuffer``, and ``CfgNode`` by a plain dict subclass, so yacs
does not need to be installed and nothing from the file is executed. Any other global is still
refused. ``import mmpola`` adds the allowlist to torch's global one (:func:`register_safe_globals`,
through torch's public ``add_safe_globals``), so every loader that reads weights-only (mmengine's,
timm's, plain ``torch.load``) reads these files; nothing of torch, mmengine or timm is replaced.

mmpola's own entry points name the file when it cannot be used:

* :func:`safe_torch_load` reads weights-only whatever ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` says, and
  turns a refusal into :class:`UnsafeCheckpointError` and an unreadable file into
  :class:`CheckpointFileError`, both naming the file, the reason and the fix;
* :func:`checkpoint_file_problem` and :func:`refused_globals` look at a file cheaply (its first bytes,
  its zip directory, its pickle's globals) before anything loads it; the tools check every checkpoint a
  run will read this way (:mod:`mmpola.runtime.preflight.checkpoints`);
* :func:`download_checkpoint` fetches a URL into torch's hub cache, where mmengine's and timm's
  loaders look too, with an error saying how to go on without network.
"""
import collections
import contextlib
import os
import os.path as osp
import pickle
import re
import zipfile

import numpy as np
import torch

from mmpola.errors import MMPolaUserError

from .sources import cache_file_name

__all__ = ['allowlist', 'register_safe_globals', 'safe_torch_load', 'OfficialConfigNode', 'UnsafeCheckpointError',
           'CheckpointFileError', 'MissingCheckpointError', 'checkpoint_file_problem', 'checkpoint_file_error',
           'check_checkpoint_file', 'refused_globals', 'download_checkpoint', 'download_error',
           'unsafe_checkpoint_error', 'is_weights_only_refusal']

# where a checkpoint path comes from, for the messages that say how to pass another one
_CHECKPOINT_OPTIONS = ('init_cfg.checkpoint, load_from, --resume, the checkpoint argument of tools/test.py '
                       'or checkpoint_path')


class UnsafeCheckpointError(MMPolaUserError, RuntimeError):
    """A checkpoint names Python objects outside the allowlist; it was not loaded."""


class CheckpointFileError(MMPolaUserError, OSError):
    """A checkpoint file that cannot be read at all (empty, truncated, a directory, text, a failed
    download); the message names the file, the problem and the fix."""


class MissingCheckpointError(CheckpointFileError, FileNotFoundError):
    """The checkpoint path does not exist."""


# the first bytes of what torch.save writes: a zip archive (torch >= 1.6) or a pickle (legacy)
_ZIP_MAGIC = b'PK\x03\x04'
_PICKLE_MAGIC = b'\x80'


def _describe_text(head):
    """What a text file that should have been a checkpoint probably is, from its first bytes."""
    text = head.decode('utf-8', 'replace').lstrip()
    if text.startswith('version https://git-lfs'):
        return 'a Git LFS pointer, not the file itself: fetch it with `git lfs pull`'
    if text[:15].lower().startswith(('<!doctype html', '<html', '<?xml', '<head')):
        return 'an HTML/XML page, e.g. the error or login page of a failed download: download the file again'
    if text.startswith(('{', '[')):
        return 'a JSON file: download the checkpoint itself again'
    first = text.splitlines()[0][:60] if text else ''
    return f'a text file starting with {first!r}: download or copy the checkpoint again'


def checkpoint_file_problem(path):
    """Why the local file ``path`` cannot be a checkpoint, as ``(error class, message)``, or None.

    Cheap (a ``stat`` and the first bytes): a missing path, a directory, an empty file, a text
    file (an HTML page of a failed download, a Git LFS pointer), a zip archive without its end
    (interrupted download or copy). A file that passes may still fail to unpickle.
    """
    where = os.fspath(path)
    if osp.isdir(where):
        inside = sorted(n for n in os.listdir(where) if n.endswith(('.pth', '.pt', '.bin', '.ckpt')))
        found = f' (it holds {", ".join(inside[:5])})' if inside else ''
        return CheckpointFileError, (f'checkpoint {where!r} is a directory{found}; pass the checkpoint file '
                                     'inside it, e.g. work_dirs/<config>/epoch_12.pth')
    if not osp.isfile(where):
        return MissingCheckpointError, (f'checkpoint file {where!r} does not exist; check the path '
                                        f'({_CHECKPOINT_OPTIONS})')
    size = os.path.getsize(where)
    if size == 0:
        return CheckpointFileError, (f'checkpoint file {where!r} is empty (0 bytes): an interrupted download '
                                     'or copy; download or copy it again')
    with open(where, 'rb') as f:
        head = f.read(64)
    if head.startswith(_ZIP_MAGIC):
        if not zipfile.is_zipfile(where):  # the central directory at the end is missing
            return CheckpointFileError, (
                f'checkpoint file {where!r} is a truncated or damaged zip archive ({size} bytes, no end '
                'record): an interrupted download or copy; download or copy it again')
        return None
    if head.startswith(_PICKLE_MAGIC):
        return None
    try:
        head.decode('utf-8')
        is_text = b'\x00' not in head
    except UnicodeDecodeError:
        is_text = False
    what = _describe_text(head) if is_text else (
        f'its first bytes are {head[:8]!r}, neither a zip archive nor a pickle; download or copy it again')
    return CheckpointFileError, f'checkpoint file {where!r} is not a PyTorch checkpoint: {what}'


def checkpoint_file_error(path, error=None):
    """The :class:`CheckpointFileError` for ``path`` (local) when the file is unreadable, or None.

    ``error`` (what torch raised while reading, if anything) fills in a truncated file that the
    first bytes did not give away."""
    problem = checkpoint_file_problem(path)
    if problem is not None:
        return problem[0](problem[1])
    if error is None:
        return None
    msg = str(error)
    damaged = ('truncated', 'unexpected EOF', 'might be corrupted', 'failed finding central directory',
               'failed reading', 'invalid header or archive is corrupted')
    if isinstance(error, EOFError) or any(marker in msg for marker in damaged):
        reason = msg.splitlines()[0] if msg else type(error).__name__
        return CheckpointFileError(
            f'checkpoint file {os.fspath(path)!r} is truncated or damaged ({type(error).__name__}: {reason}): '
            'an interrupted download or copy; download or copy it again')
    return None


CONFIG_LOCAL_FILE = ('--cfg-options load_from=checkpoints/file.pth or model.backbone.init_cfg.checkpoint=checkpoints/'
                     'file.pth, or the local path as tools/test.py CHECKPOINT')


def download_error(url, error, cache_path=None, local_file=CONFIG_LOCAL_FILE):
    """A :class:`CheckpointFileError` for a checkpoint URL that could not be fetched (no network,
    a proxy, a 404), or None when ``error`` is no download failure. ``cache_path``: where the download
    would have gone, where a copy put by hand is used without downloading; ``local_file``: how the
    caller takes a local file instead (examples)."""
    import socket
    import urllib.error
    chain, e = [], error
    while e is not None and len(chain) < 5:
        chain.append(e)
        e = e.__cause__ or e.__context__
    network = (urllib.error.URLError, socket.timeout, socket.gaierror, ConnectionError, TimeoutError)
    cause = next((c for c in chain if isinstance(c, network)), None)
    if cause is None:
        cause = next((c for c in chain if type(c).__module__.startswith(('requests', 'urllib3', 'huggingface_hub'))
                      and 'Error' in type(c).__name__), None)
    if cause is None:
        return None
    reason = getattr(cause, 'reason', None) or cause
    cache = f"; or copy it to {cache_path} (torch hub's cache), where it is used without downloading" \
        if cache_path else ''
    return CheckpointFileError(
        f'downloading checkpoint {url!r} failed ({type(cause).__name__}: {reason}). Without network access, '
        f'download it on another machine and pass the local file instead of the URL (e.g. {local_file}){cache}')


class OfficialConfigNode:
    """Stand-in for ``yacs.config.CfgNode`` (the training config inside official checkpoints).

    torch's weights-only unpickler fills only exact ``dict``/``OrderedDict`` instances, so the
    stand-in creates an ``OrderedDict``: the config comes back as nested ordered dicts (yacs' own
    attributes such as ``__immutable__`` land in the instance ``__dict__``). yacs need not be
    installed and nothing from the file runs.
    """

    def __new__(cls, *args, **kwargs):
        return collections.OrderedDict()


def _history_buffer_getattr(obj, name):
    """``getattr`` restricted to what mmengine's HistoryBuffer pickles: its statistics methods."""
    from mmengine.logging import HistoryBuffer
    allowed = {'min', 'max', 'current', 'mean'} | set(HistoryBuffer._statistics_methods)
    if obj is HistoryBuffer and name in allowed:
        return getattr(obj, name)
    raise UnsafeCheckpointError(
        f'checkpoint asks for getattr({obj!r}, {name!r}); only the statistics methods of '
        'mmengine.logging.HistoryBuffer are allowed')


def _numpy_globals():
    out = [np.ndarray, np.dtype]
    try:  # numpy 1.x
        from numpy.core.multiarray import _reconstruct, scalar
    except ImportError:  # numpy 2.x
        from numpy._core.multiarray import _reconstruct, scalar
    out += [_reconstruct, scalar]
    # numpy >= 1.25 pickles dtype instances by their class (numpy.dtypes.Float64DType ...)
    dtypes = getattr(np, 'dtypes', None)
    if dtypes is not None:
        out += [getattr(dtypes, n) for n in dir(dtypes) if n.endswith('DType')]
    # numpy 1.x pickles arrays with numpy.core.*; numpy 2 with numpy._core.*; a checkpoint written
    # with either must load with the other, so register both spellings.
    named = []
    for mod in ('numpy.core.multiarray', 'numpy._core.multiarray'):
        named += [(_reconstruct, f'{mod}._reconstruct'), (scalar, f'{mod}.scalar')]
    return out, named


_ALLOWLIST = []


def allowlist():
    """The globals mmengine and official PolaFormer checkpoints contain, as ``add_safe_globals`` takes them."""
    if not _ALLOWLIST:
        plain, named = _numpy_globals()
        safe = list(plain) + named
        try:
            from mmengine.logging import HistoryBuffer
            safe += [HistoryBuffer, (_history_buffer_getattr, 'builtins.getattr')]
        except ImportError:  # mmengine is optional for plain timm users
            pass
        safe.append((OfficialConfigNode, 'yacs.config.CfgNode'))
        _ALLOWLIST.extend(safe)
    return list(_ALLOWLIST)


def register_safe_globals():
    """Add :func:`allowlist` to torch's weights-only allowlist (what ``import mmpola`` does; idempotent).

    Returns whether torch has such an allowlist (torch >= 2.4)."""
    if not hasattr(torch.serialization, 'add_safe_globals'):
        return False
    registered = torch.serialization.get_safe_globals()
    missing = [g for g in allowlist() if g not in registered]
    if missing:
        torch.serialization.add_safe_globals(missing)
    return True


def _refusal_detail(path, error):
    """What the unpickler refused, in a few words (the globals it names, or torch's own reason)."""
    names = []
    if isinstance(path, (str, os.PathLike)) and hasattr(torch.serialization,
                                                        'get_unsafe_globals_in_checkpoint'):
        try:  # every global outside the allowlist, not only the first one the unpickler met
            allowed = {f'{g.__module__}.{g.__qualname__}' if not isinstance(g, tuple) else g[1]
                       for g in torch.serialization.get_safe_globals()}
            names = [n for n in torch.serialization.get_unsafe_globals_in_checkpoint(os.fspath(path))
                     if n not in allowed]
        except Exception:  # legacy (non-zip) files, unreadable archives
            names = []
    if names:
        return 'globals: ' + ', '.join(names[:5]) + (' ...' if len(names) > 5 else '')
    msg = str(error)
    msg = msg.split('WeightsUnpickler error:', 1)[-1]
    lines = [line.strip() for line in msg.splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith(
        ('Weights only load failed', 'Check the documentation', 'Please file an issue'))]
    for line in lines:
        if re.search(r'GLOBAL|[Uu]nsupported|getattr|blocked', line):
            return line
    return lines[0] if lines else type(error).__name__


def is_weights_only_refusal(error):
    """Whether ``error`` is torch's (or timm's) refusal of a global under ``weights_only=True``."""
    msg = str(error)
    return (isinstance(error, (pickle.UnpicklingError, UnsafeCheckpointError)) or
            'Weights only load failed' in msg or 'Unsupported global' in msg or
            'weights_only=True blocked' in msg or 'UnpicklingError' in msg)


def unsafe_checkpoint_error(path, error):
    """The :class:`UnsafeCheckpointError` a refusal of ``path`` is reported with (names the file,
    the reason, and what to do with a trusted file)."""
    where = os.fspath(path) if isinstance(path, (str, os.PathLike)) else 'the checkpoint'
    detail = _refusal_detail(path, error)
    if detail.startswith('Unsupported operand'):  # not a pickle stream torch's reader follows
        why = (f'it is not a checkpoint the weights-only unpickler can read ({detail}: a raw '
               'pickle, which could execute code, or not a checkpoint at all, e.g. an HTML error '
               'page saved by a failed download)')
    else:
        why = (f"it names Python objects outside the allowlist of mmpola's safe loader ({detail}); "
               'unpickling them would let the file execute code')
    return UnsafeCheckpointError(
        f'refused to load checkpoint {where!r}: {why}, so nothing from it was loaded. If you trust '
        'its origin, convert it once in a trusted environment: sd = torch.load('
        f'{where!r}, weights_only=False)["state_dict"]  (or ["model"]), then '
        'torch.save({"state_dict": sd}, "clean.pth"), and load clean.pth (tensors only).')


def safe_torch_load(path, map_location='cpu', mmap=False):
    """``torch.load(path, weights_only=True)`` with the allowlist and an actionable error.

    The allowlist applies to this call whether or not it was registered globally, and the load is
    weights-only whatever ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` says. ``mmap=True`` maps the tensors of
    a zip checkpoint instead of reading them (to look at its metadata cheaply).
    """
    local = isinstance(path, (str, os.PathLike))
    if local:
        problem = checkpoint_file_problem(path)  # missing, a directory, empty, text, a cut-off zip
        if problem is not None:
            raise problem[0](problem[1])
    try:
        with _allowlisted():
            extra = dict(mmap=True) if mmap and local and zipfile.is_zipfile(path) else {}
            return torch.load(path, map_location=map_location, weights_only=True, **extra)
    except UnsafeCheckpointError as e:  # raised by the getattr stand-in, not wrapped by torch
        raise unsafe_checkpoint_error(path, e) from e
    except Exception as e:  # torch raises UnpicklingError wrapped in various types
        damaged = checkpoint_file_error(path, e) if local else None
        if damaged is not None:  # a truncated legacy pickle reads as an unpickling error
            raise damaged from e
        if is_weights_only_refusal(e):
            raise unsafe_checkpoint_error(path, e) from e
        raise


def _allowlisted():
    """The allowlist for the calls inside the ``with`` block.

    After ``import mmpola`` torch's global allowlist has it already; the context is then skipped,
    because torch's ``safe_globals`` context removes its entries from the global list on exit, also
    entries that were there before it was entered.
    """
    registered = torch.serialization.get_safe_globals() if hasattr(torch.serialization, 'get_safe_globals') else []
    if all(g in registered for g in allowlist()):
        return contextlib.nullcontext()
    if hasattr(torch.serialization, 'safe_globals'):
        return torch.serialization.safe_globals(allowlist())
    torch.serialization.add_safe_globals(allowlist())  # torch 2.4: no context manager
    return contextlib.nullcontext()


def refused_globals(path):
    """The globals of the checkpoint file ``path`` that a weights-only load would refuse (cheap: the
    pickle is disassembled, no tensor is read), or None when the file is no zip archive (a legacy
    pickle: only loading it tells)."""
    if not zipfile.is_zipfile(path):
        return None
    with _allowlisted():  # torch compares against its current allowlist
        names = torch.serialization.get_unsafe_globals_in_checkpoint(os.fspath(path))
    return sorted(names)


def check_checkpoint_file(path):
    """Raise what loading the local file ``path`` would fail with, before anything loads it.

    :class:`MissingCheckpointError` / :class:`CheckpointFileError` for a missing, empty, text,
    truncated or directory path, :class:`UnsafeCheckpointError` for a pickle naming globals outside the
    allowlist; each names the file and the fix. Cheap for zip checkpoints (first bytes, zip directory,
    the pickle's globals); a legacy (non-zip) pickle is read with :func:`safe_torch_load`.
    """
    problem = checkpoint_file_problem(path)
    if problem is not None:
        raise problem[0](problem[1])
    names = refused_globals(path)
    if names is None:
        safe_torch_load(path)
    elif names:
        raise unsafe_checkpoint_error(path, pickle.UnpicklingError(f'Unsupported global: {names[0]}'))


def download_checkpoint(url):
    """The local copy of the checkpoint at ``url`` in torch's hub cache (``$TORCH_HOME/hub/checkpoints``,
    where ``torch.hub.load_state_dict_from_url``, mmengine's http loader and timm look), downloaded once,
    named by :func:`mmpola.checkpoint.sources.cache_file_name` (a file put there by hand is used as is).

    A failed download raises :class:`CheckpointFileError` saying how to pass a local file instead."""
    cache_dir = osp.join(torch.hub.get_dir(), 'checkpoints')
    os.makedirs(cache_dir, exist_ok=True)
    local = osp.join(cache_dir, cache_file_name(url))
    if not osp.isfile(local):
        try:
            torch.hub.download_url_to_file(url, local)
        except Exception as e:
            error = download_error(url, e, cache_path=local)
            if error is None:
                raise
            raise error from e
    return local
