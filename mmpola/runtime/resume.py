"""Which checkpoint a resumed run continues from, and whether a file can be resumed at all.

* ``--resume`` without a path (``resume=True`` and no ``load_from``): mmengine continues from the file
  ``last_checkpoint`` names. :func:`choose_resume_checkpoint` (called by
  :class:`mmpola.runtime.saving.SafeCheckpointHook` before mmengine reads it) keeps that file when it is
  readable; otherwise it warns and makes ``last_checkpoint`` name the newest readable ``epoch_*.pth`` /
  ``iter_*.pth`` of the work dir (:func:`find_resumable_checkpoint`).
* ``--resume`` into a work dir that holds no checkpoint (a mistyped ``--work-dir``, a run that ended
  before its first save): :func:`check_resume_work_dir` stops the run (mmengine would train from
  scratch after one log line), naming work dirs of similar name that hold checkpoints, unless the
  config's ``resume_or_start=True`` (tools/train.py ``--resume-or-start``) says that a new run may
  start there (job scripts that always pass ``--resume``);
* a new run (no ``--resume``) into a work dir that holds checkpoints: :func:`check_new_run_work_dir` (called by
  tools/train.py) stops it, since it would overwrite them one by one;
* ``--resume CHECKPOINT``: :func:`check_resumable` refuses a file that holds weights only (an official
  or pretrained file), saying how to start a new run from its weights instead.

* ``--resume`` after the config's lr was changed: mmengine restores the checkpoint's optimizer and lr
  scheduler states, lr included, so the new value is dropped; :func:`lr_change_note` (logged once by
  :class:`mmpola.runtime.saving.SafeCheckpointHook`) says so and how to train with the new lr.

A checkpoint written in the middle of an epoch (on SIGTERM) records in its meta how many batches of
that epoch were trained (:data:`EPOCH_BATCHES_DONE`); :class:`mmpola.runtime.random_state.RandomStateHook`
skips exactly those when the run is resumed.
"""
import glob
import os
import os.path as osp
import re
import zipfile

from mmengine import dist as mmdist

from mmpola.checkpoint.reading import refused_globals, safe_torch_load
from mmpola.errors import UserError, close_matches

from .atomic_files import write_text_atomic
from .options import RESUME_OR_START

__all__ = ['LAST_CHECKPOINT', 'EPOCH_BATCHES_DONE', 'RESUME_OR_START', 'find_resumable_checkpoint',
           'choose_resume_checkpoint', 'check_new_run_work_dir', 'check_resume_work_dir', 'check_resumable',
           'loaded_checkpoint', 'lr_change_note']

LAST_CHECKPOINT = 'last_checkpoint'
# meta key of a checkpoint taken in the middle of an epoch: the batches of that epoch already trained
EPOCH_BATCHES_DONE = 'mmpola_epoch_batches_done'
_STEP_RE = re.compile(r'^(?:epoch|iter)_(\d+)\.pth$')


def _readable(path):
    """Whether ``path`` is a complete checkpoint file that loads weights-only (cheap for zip files: the
    zip directory, read last, is intact and the pickle names no refused global)."""
    if not osp.isfile(path) or osp.getsize(path) == 0:
        return False, 'missing' if not osp.isfile(path) else 'empty'
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except (zipfile.BadZipFile, OSError) as e:
            return False, f'unreadable ({e})'
        if not any(n.endswith('data.pkl') for n in names):
            return False, 'not a torch checkpoint'
        refused = refused_globals(path)
        return (False, f"refused (it names {', '.join(refused[:3])})") if refused else (True, '')
    try:  # a legacy (non-zip) torch file: only a full load tells
        safe_torch_load(path)
    except Exception as e:  # noqa: BLE001  (any failure means: not usable for resuming)
        return False, f'unreadable ({type(e).__name__}: {e})'
    return True, ''


def find_resumable_checkpoint(work_dir):
    """``(path or None, warnings)``: the checkpoint ``--resume`` without a path continues from.

    The file named in ``last_checkpoint`` when it is readable (the work dir's own file of that name when the marker
    names another folder's and the work dir has it: a copied or moved work dir); otherwise the newest readable
    ``epoch_*.pth`` / ``iter_*.pth`` of ``work_dir`` (by modification time, then step number), with
    a warning for each file skipped. ``(None, [])`` when the work dir holds no checkpoint at all.
    """
    warnings = []
    named = None
    marker = osp.join(work_dir, LAST_CHECKPOINT)
    if osp.isfile(marker):
        with open(marker) as f:
            named = f.read().strip() or None
        if named is None:
            warnings.append(f'{marker} is empty')
    own = osp.join(work_dir, osp.basename(named)) if named is not None else None
    if named is not None and osp.realpath(osp.dirname(named)) != osp.realpath(work_dir) and osp.isfile(own):
        # a copied or moved work dir: its marker names the file in the old folder, whose run may go on there
        warnings.append(f'{LAST_CHECKPOINT} names {named}, outside the work dir (a copied or moved work dir), '
                        f'which holds its own {osp.basename(named)}')
        named = own
    if named is not None:
        ok, why = _readable(named)
        if ok:
            return named, warnings
        warnings.append(f'{LAST_CHECKPOINT} names {named}, which is {why}')
    candidates = []
    for path in glob.glob(osp.join(work_dir, '*.pth')):
        match = _STEP_RE.match(osp.basename(path))
        if match and (named is None or osp.abspath(path) != osp.abspath(named)):
            candidates.append((osp.getmtime(path), int(match.group(1)), path))
    for _, _, path in sorted(candidates, reverse=True):
        ok, why = _readable(path)
        if ok:
            return path, warnings
        warnings.append(f'{path} is {why}')
    return None, warnings


def _holds_checkpoints(folder):
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    return LAST_CHECKPOINT in names or any(_STEP_RE.match(n) for n in names)


def check_new_run_work_dir(work_dir):
    """A new run (no ``--resume``) into a work dir that holds an earlier run's checkpoints would overwrite them
    one by one (``last_checkpoint`` at its first save) and leave the others: two runs' files in one folder, the
    earlier run's first checkpoints lost. Stop before the Runner writes, naming them and the ways on."""
    if not _holds_checkpoints(work_dir):
        return
    names = sorted((n for n in os.listdir(work_dir) if _STEP_RE.match(n)),
                   key=lambda n: (n.split('_', 1)[0], int(_STEP_RE.match(n).group(1))))
    names += [LAST_CHECKPOINT] if osp.exists(osp.join(work_dir, LAST_CHECKPOINT)) else []
    shown = ', '.join(names[:4] + (['...', names[-1]] if len(names) > 5 else names[4:]))
    raise UserError(
        f"the work dir {work_dir} holds an earlier run's checkpoints ({shown}): a new run there would overwrite "
        "them one by one and mix the two runs' files. --resume continues that run (--resume-or-start in job "
        'scripts), --work-dir DIR starts the new one elsewhere; to start over in this folder, move or delete '
        f'its *.pth files and {LAST_CHECKPOINT} first.')


def check_resume_work_dir(work_dir, allow_new=False, logger=None):
    """``--resume`` without a file continues from the work dir's checkpoints: when it holds none, stop
    (mmengine would log "Auto resumed from the latest checkpoint None" and train from scratch), unless
    ``allow_new`` (the config's ``resume_or_start``), which starts a new run there with a warning.

    The message names work dirs next to it whose names are close and that hold checkpoints."""
    if _holds_checkpoints(work_dir):
        return
    if allow_new:
        if logger is not None:
            logger.warning(f'[mmpola] --resume: no checkpoint in {work_dir} yet; a new run starts there '
                           f'({RESUME_OR_START}=True).')
        return
    parent = osp.dirname(osp.abspath(work_dir))
    try:
        siblings = [n for n in os.listdir(parent) if osp.isdir(osp.join(parent, n))
                    and _holds_checkpoints(osp.join(parent, n))]
    except OSError:
        siblings = []
    close = close_matches(osp.basename(osp.abspath(work_dir)), siblings)
    state = 'does not exist' if not osp.isdir(work_dir) else (
        'holds no checkpoint (no last_checkpoint, no epoch_*.pth or iter_*.pth)')
    hint = (f" Did you mean {' or '.join(repr(osp.join(osp.dirname(work_dir.rstrip('/')) or '.', n)) for n in close)}"
            ' (holding checkpoints)?' if close else '')
    raise UserError(
        f'--resume: the work dir {work_dir} {state}, so there is nothing to resume: the run would start from '
        f'scratch. A mistyped --work-dir, or a run that ended before its first checkpoint?{hint} To start a new '
        'run there when it holds no checkpoint yet (a job script that always resumes), use --resume-or-start '
        f'(with another train.py: --resume --cfg-options {RESUME_OR_START}=True).')


def loaded_checkpoint(runner):
    """The file ``runner`` loads: its ``load_from`` (a file to resume or start from), else, resuming without a
    file, the work dir's latest as mmengine finds it (``last_checkpoint``); None when it loads none."""
    path = getattr(runner, '_load_from', None)
    if not path and getattr(runner, '_resume', False):
        from mmengine.runner.checkpoint import find_latest_checkpoint
        path = find_latest_checkpoint(runner.work_dir)
    return path


def choose_resume_checkpoint(runner):
    """``--resume`` without a path: make ``last_checkpoint`` name a readable checkpoint before mmengine
    reads it (a hook's ``before_run``). Nothing to do for an explicit ``load_from``.

    Every rank looks at the same files; rank 0 rewrites ``last_checkpoint`` when it named a missing
    or unreadable file, and all ranks wait for it."""
    if not getattr(runner, '_resume', False) or getattr(runner, '_load_from', None) is not None:
        return
    path, warnings = find_resumable_checkpoint(runner.work_dir)
    for text in warnings:
        runner.logger.warning(f'[mmpola] --resume: {text}; skipped.')
    if path is None:
        if warnings:
            raise UserError(f'--resume: no readable checkpoint in {runner.work_dir} '
                            f'({"; ".join(warnings)}). Resume explicitly with --resume CHECKPOINT, '
                            'or start again without --resume.')
        cfg = getattr(runner, 'cfg', None)
        check_resume_work_dir(runner.work_dir, bool(cfg is not None and cfg.get(RESUME_OR_START)), runner.logger)
        return
    if warnings:
        if mmdist.is_main_process():
            write_text_atomic(osp.join(runner.work_dir, LAST_CHECKPOINT), path)
        mmdist.barrier()


def check_resumable(path, backbone_option=None):
    """An explicit ``--resume`` file must be a training checkpoint (weights + meta), not weights only.

    Reads the file weights-only with its tensors memory-mapped (no tensor is copied).
    ``backbone_option``: the ``--cfg-options`` that start the backbone from the file, for the message
    (:func:`mmpola.runtime.preflight.checkpoints.pretrained_option`)."""
    checkpoint = safe_torch_load(path, mmap=True)
    if not (isinstance(checkpoint, dict) and 'meta' in checkpoint and 'state_dict' in checkpoint):
        keys = sorted(checkpoint)[:5] if isinstance(checkpoint, dict) else type(checkpoint).__name__
        raise UserError(
            f'--resume {path}: this is not a training checkpoint written by tools/train.py (it has no '
            f'meta/state_dict, top-level keys: {keys}), so there is no iteration, optimizer or scheduler '
            f'state to resume. To start a new run from its weights, drop --resume and use '
            f'--cfg-options load_from={path} (weights of this same model) or '
            f"{backbone_option or f'model.backbone.init_cfg.checkpoint={path}'} "
            f'(official PolaFormer / ImageNet weights for the backbone).')


def _group_lr(group):
    """A param group's lr before any schedule (``initial_lr``, which mmengine's schedulers set), else its lr."""
    return group.get('initial_lr', group.get('lr'))


def lr_change_note(optimizer, checkpoint, filename='the checkpoint'):
    """The warning for a resume whose config's lr differs from the one the checkpoint's run started with
    (``optimizer``: the run's optimizer, built from the config, before the checkpoint's state is loaded;
    ``checkpoint``: the loaded dict), or None (same lr, several optimizers, or no optimizer state)."""
    import math
    state = checkpoint.get('optimizer') if isinstance(checkpoint, dict) else None
    groups = getattr(optimizer, 'param_groups', None)
    if not isinstance(state, dict) or not isinstance(state.get('param_groups'), list) or not groups \
            or len(groups) != len(state['param_groups']):
        return None
    for index, (group, saved) in enumerate(zip(groups, state['param_groups'])):
        new, old = _group_lr(group), _group_lr(saved)
        if isinstance(new, (int, float)) and isinstance(old, (int, float)) \
                and not math.isclose(new, old, rel_tol=1e-6, abs_tol=0.0):
            where = '' if len(groups) == 1 else f' (param group {index} of {len(groups)})'
            return (f'[mmpola] --resume: the config\'s lr is {new:g}{where}, but the run in {filename} started with '
                    f'{old:g}: resuming restores the checkpoint\'s optimizer and lr scheduler states, lr included, '
                    f'so this run goes on with {old:g} and its schedule; the new lr is not used. To train with the '
                    f'new lr, start a new run from the checkpoint\'s weights: drop --resume and add --cfg-options '
                    f'load_from={filename} (its schedule starts again at epoch / iteration 0).')
    return None
