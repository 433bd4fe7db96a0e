"""One training run per work dir: a lock file that names the run holding it.

Two runs started into the same work dir would both exit 0 while overwriting each other's
checkpoints, ``last_checkpoint`` and config dump. :func:`lock_work_dir` (called by tools/train.py
before the Runner writes anything) takes an exclusive ``flock`` on ``<work_dir>/.mmpola_train.lock``
and writes the holder's PID, host and start time into it. A second run stops with
:class:`WorkDirInUseError` naming that PID and host. The kernel drops the lock when its process
ends, however it ends, so the lock of a killed run is taken over (with a warning naming the dead
run). Only rank 0 of a distributed run takes the lock.

:func:`check_work_dir` (called by the tools before anything is built) refuses a work dir the run
could not write into: a file of that name, a file on its path, a read-only folder or disk.

:class:`WorkDirHook` (in the shipped configs) keeps a run going when its work dir is deleted while it
runs (``rm -rf work_dirs/x`` by mistake, a cleanup job): mmengine would stop at the next log write with a
``FileNotFoundError`` traceback (its scalar log is opened per write) and the coming checkpoint could not
be saved, so the run's progress since its last checkpoint, which went with the folder, would be lost too.
Before mmengine's hooks write (its priority is ``VERY_HIGH``), after every iteration and epoch, it checks
that the work dir and the run's log folders exist (one ``stat`` each); when one is gone it recreates
them, copies the run's log back from the still open, deleted file (Linux) into a new file of the same
name, dumps the config again, takes the work dir's lock again, and says so in one warning. The next
checkpoint is then saved as planned: nothing more is lost than what was deleted.
"""
import atexit
import errno
import fcntl
import os
import os.path as osp
import socket
import tempfile
import time

from mmengine.hooks import Hook

from mmpola.errors import MMPolaUserError
from mmpola.registry import HOOKS

__all__ = ['LOCK_NAME', 'WorkDirInUseError', 'WorkDirHook', 'check_work_dir', 'lock_work_dir', 'relock_work_dir']

LOCK_NAME = '.mmpola_train.lock'
_HELD = {}  # real path of the lock file -> open file descriptor (kept open for the process lifetime)


class WorkDirInUseError(MMPolaUserError):
    """Another training run holds the work dir."""


def _launcher_rank(launcher):
    """This process's rank before the process group exists (torchrun / slurm / mpi environment)."""
    names = {'pytorch': ('RANK',), 'slurm': ('SLURM_PROCID', 'RANK'),
             'mpi': ('OMPI_COMM_WORLD_RANK', 'PMI_RANK', 'RANK')}.get(launcher, ())
    for name in names:
        if os.environ.get(name, '').isdigit():
            return int(os.environ[name])
    return 0


def _holder(text):
    fields = dict(line.split('=', 1) for line in text.splitlines() if '=' in line)
    return fields


def _describe(fields):
    if not fields.get('pid'):
        return 'an unknown process'
    text = f"PID {fields['pid']} on host {fields.get('host', '?')}"
    if fields.get('started'):
        text += f", started {fields['started']}"
    return text


def check_work_dir(work_dir):
    """Raise :class:`MMPolaUserError` when the run could not create ``work_dir`` or write into it; creates
    nothing (a temporary file in the work dir, or in the folder it would be created in, is the probe)."""
    if '://' in str(work_dir):  # a remote work dir (a storage backend's): its backend reports
        return
    fix = 'Fix: give this run another --work-dir (a folder on a writable disk)'
    existing = osp.abspath(work_dir)
    while not osp.lexists(existing):
        existing = osp.dirname(existing)
    if not osp.isdir(existing):
        if existing == osp.abspath(work_dir):
            raise MMPolaUserError(f'work dir {work_dir!r} is a file, not a folder: the run writes its checkpoints and '
                                  f'logs into a folder of that name. {fix}, or move the file away.')
        raise MMPolaUserError(f'work dir {work_dir!r} cannot be created: {existing!r} on its path is a file, not a '
                              f'folder. {fix}, or move that file away.')
    try:
        with tempfile.TemporaryFile(dir=existing, prefix='.mmpola_probe_'):
            pass
    except OSError as e:
        where = f'the work dir {work_dir!r}' if existing == osp.abspath(work_dir) else \
            f'{existing!r}, where the work dir {work_dir!r} would be created,'
        raise MMPolaUserError(f'{where} is not writable ({e.strerror or e}): the run could not write its '
                              f'checkpoints and logs there. {fix}, or make it writable.') from None


def lock_work_dir(work_dir, launcher='none', logger=None):
    """Take the work dir's lock for this process (rank 0 only); returns the lock file path or None.

    Raises :class:`WorkDirInUseError` when another live run holds it. Calling it again in the same
    process for the same work dir is a no-op.
    """
    if _launcher_rank(launcher) != 0:
        return None
    os.makedirs(work_dir, exist_ok=True)
    path = osp.realpath(osp.join(work_dir, LOCK_NAME))
    if path in _HELD:
        return path
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            previous = os.pread(fd, 4096, 0).decode(errors='replace')
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise WorkDirInUseError(
                f'work dir {work_dir} is in use by another training run ({_describe(_holder(previous))}; lock '
                f'file {path}). Two runs in one work dir overwrite each other\'s checkpoints and logs: wait for '
                'that run to end or stop it, or give this run another --work-dir.') from None
        # the file may have been removed by its previous holder between our open and flock: retry
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    previous = _holder(os.pread(fd, 4096, 0).decode(errors='replace'))
    if previous.get('pid') and previous.get('pid') != str(os.getpid()):
        message = (f'[mmpola] work dir {work_dir}: took over the lock of a run that is no longer running '
                   f'({_describe(previous)}); it was killed or crashed, so its last save may be incomplete '
                   '(--resume picks the newest readable checkpoint).')
        if logger is not None:
            logger.warning(message)
        else:
            from mmengine.logging import print_log
            print_log(message, logger='current', level=30)
    text = (f'pid={os.getpid()}\nhost={socket.gethostname()}\n'
            f"started={time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n")
    os.ftruncate(fd, 0)
    os.pwrite(fd, text.encode(), 0)
    os.fsync(fd)
    _HELD[path] = fd
    if len(_HELD) == 1:
        atexit.register(_release_all)
    return path


def _release_all():
    """At a normal exit: remove the lock files (a killed run's stays, and is taken over by the next)."""
    for path, fd in list(_HELD.items()):
        try:
            os.remove(path)
        except OSError:
            pass
        os.close(fd)
        _HELD.pop(path, None)


def relock_work_dir(work_dir):
    """Take the lock of ``work_dir`` again when this process held it and its file was deleted (with the
    folder); returns whether it did."""
    path = osp.realpath(osp.join(work_dir, LOCK_NAME))
    fd = _HELD.get(path)
    if fd is None or osp.exists(path):
        return False
    os.close(_HELD.pop(path))
    lock_work_dir(work_dir)
    return True


def _reopen_deleted_log_files(logger):
    """The file handlers of ``logger`` whose file is gone write to a new file of that name, which starts
    with what the deleted file held (read through ``/proc/self/fd``, where there is one); returns their
    paths."""
    import logging
    reopened = []
    for handler in getattr(logger, 'handlers', []):
        if not isinstance(handler, logging.FileHandler) or handler.stream is None \
                or osp.exists(handler.baseFilename):
            continue
        old = handler.stream
        old.flush()
        try:
            with open(f'/proc/self/fd/{old.fileno()}', 'rb') as f:
                earlier = f.read()
        except OSError:
            earlier = b''
        os.makedirs(osp.dirname(handler.baseFilename), exist_ok=True)
        with open(handler.baseFilename, 'ab') as f:
            f.write(earlier)
        handler.setStream(open(handler.baseFilename, 'a', encoding=handler.encoding, errors=handler.errors))
        old.close()
        reopened.append(handler.baseFilename)
    return reopened


@HOOKS.register_module()
class WorkDirHook(Hook):
    """Recreates the work dir (and the run's log folders) when it is deleted during a run, before
    anything is written there again (see the module doc); one warning says what was done."""

    priority = 'VERY_HIGH'

    def __init__(self):
        self._folders = []

    def _record(self, runner):
        work_dir = osp.abspath(runner.work_dir)
        log_dir = osp.abspath(getattr(runner, 'log_dir', work_dir))
        folders = [work_dir] + [folder for folder, _, _ in os.walk(log_dir)]
        self._folders = list(dict.fromkeys(folders))

    def before_train(self, runner):
        self._record(runner)

    def before_val(self, runner):
        if not self._folders:
            self._record(runner)

    before_test = before_val

    def _check(self, runner):
        if all(osp.isdir(folder) for folder in self._folders):
            return
        work_dir = runner.work_dir
        for folder in self._folders:
            os.makedirs(folder, exist_ok=True)
        logs = _reopen_deleted_log_files(runner.logger)
        from mmengine.dist import is_main_process
        if is_main_process():
            runner.dump_config()
            relock_work_dir(work_dir)
        kept = f'its log {", ".join(logs)} was written back from the open file; ' if logs else ''
        runner.logger.warning(
            f'[mmpola] work dir {work_dir} was deleted while the run was writing into it; recreated it, so the '
            f'coming checkpoints and logs are saved as planned ({kept}the files deleted with it, earlier '
            'checkpoints included, are not restored). If the folder was removed on purpose, stop the run.')

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self._check(runner)

    def after_train_epoch(self, runner):
        self._check(runner)
        self._record(runner)  # folders made since (mmengine's logs are created on first use)

    def after_val_epoch(self, runner, metrics=None):
        self._check(runner)

    def after_test_epoch(self, runner, metrics=None):
        self._check(runner)
