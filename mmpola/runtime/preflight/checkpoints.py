"""The checkpoint files a run will read, checked before anything is built.

mmengine reads ``load_from`` / ``--resume`` / tools/test.py's CHECKPOINT, and the ``Pretrained`` inits
of necks and heads, with its own loader (plain ``torch.load``, weights-only by torch's default), whose
errors name no file. So the tools look at each file first (:func:`mmpola.checkpoint.reading.check_checkpoint_file`:
missing, a directory, empty, text, truncated, or a pickle naming globals outside the allowlist, which
would let the file run code) and stop with one line naming it, whatever
``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` says. A ``load_from`` URL is downloaded here, into torch's hub
cache where mmengine's loader then finds it, so that a failed download says how to go on.
"""
import os.path as osp

from mmpola.checkpoint.reading import check_checkpoint_file, download_checkpoint
from mmpola.errors import MMPolaUserError, UserError

from ..config import is_url
from ..resume import RESUME_OR_START, check_resumable, check_resume_work_dir

__all__ = ['checked_checkpoint', 'check_pretrained_files', 'check_run_checkpoints', 'pretrained_option']


def pretrained_option(cfg, path, where='model.backbone'):
    """The ``--cfg-options`` that make ``where`` (the backbone) start from the weights in ``path``,
    whatever its ``init_cfg`` is now: ``init_cfg.checkpoint=PATH`` for a ``Pretrained`` one; for none
    (``init_cfg=None``, e.g. the demo configs) or another kind, the whole dict is replaced
    (``init_cfg._delete_=True``): setting a key below ``None`` stops mmengine with a TypeError."""
    node = cfg.get('model') if cfg is not None else None
    for key in where.split('.')[1:]:
        node = node.get(key) if isinstance(node, dict) else None
    init = node.get('init_cfg') if isinstance(node, dict) else None
    option = f'{where}.init_cfg'
    if isinstance(init, dict) and init.get('type') == 'Pretrained':
        return f'{option}.checkpoint={path}'
    return f'{option}._delete_=True {option}.type=Pretrained {option}.checkpoint={path}'


def checked_checkpoint(path, what='checkpoint'):
    """The local file of checkpoint ``path`` (a URL is downloaded), checked; an error names ``what``
    (``'load_from checkpoint'`` ...) and the file. Other URL schemes (``s3://`` ...) are left to the
    loader."""
    try:
        if is_url(path):
            if not path.startswith(('http://', 'https://')):
                return path
            path = download_checkpoint(path)
        check_checkpoint_file(path)
    except MMPolaUserError as e:
        raise type(e)(f'{what}: {e}') from e
    return path


def _find_pretrained(node, where):
    """Yield (config key path, checkpoint) for every Pretrained init_cfg / pretrained= below node."""
    if isinstance(node, dict):
        if node.get('type') == 'Pretrained' and isinstance(node.get('checkpoint'), str):
            yield where, node['checkpoint']
        for key, value in node.items():
            if key == 'pretrained' and isinstance(value, str):
                yield f'{where}.pretrained', value
            else:
                yield from _find_pretrained(value, f'{where}.{key}')
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from _find_pretrained(value, f'{where}.{i}')


def check_pretrained_files(cfg):
    """Every ``Pretrained`` init checkpoint (and ``pretrained=``) of the model that is a local path
    must be a readable, safe checkpoint; a missing one says how to train without it. URLs are
    downloaded when the model is initialised."""
    for where, path in _find_pretrained(cfg.get('model', {}), 'model'):
        if is_url(path):
            continue
        if not osp.exists(path):
            raise UserError(
                f'pretrained checkpoint {path!r} ({where}) does not exist. Put the ImageNet '
                'checkpoint there (official PolaFormer release or our own classification run; see '
                "docs/models.md), or train from random initialisation with "
                f'--cfg-options {where}=None')
        checked_checkpoint(path, f'pretrained checkpoint ({where})')


def check_run_checkpoints(cfg, training):
    """The checkpoints the Runner will read for this config: ``load_from`` (an explicit ``--resume``
    file must also be a training checkpoint), and, when ``training``, the pretrained inits. A
    ``--resume`` without a file needs a work dir that holds checkpoints (or ``resume_or_start``:
    :func:`mmpola.runtime.resume.check_resume_work_dir`), checked here before the Runner creates the
    work dir; which of them it continues from is decided when the run starts
    (:func:`mmpola.runtime.resume.choose_resume_checkpoint`)."""
    load_from = cfg.get('load_from')
    if training and cfg.get('resume') and not load_from:
        check_resume_work_dir(cfg.work_dir, bool(cfg.get(RESUME_OR_START)))
    if load_from:
        resuming = training and cfg.get('resume')
        what = '--resume checkpoint' if resuming else ('load_from checkpoint' if training else 'checkpoint')
        local = checked_checkpoint(load_from, what)
        if resuming:
            check_resumable(local, pretrained_option(cfg, load_from))
    if training:
        check_pretrained_files(cfg)
