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
"""
import atexit
import errno
import fcntl
import os
import os.path as osp
import socket
import tempfile
import time

from mmpola.errors import MMPolaUserError

__all__ = ['LOCK_NAME', 'WorkDirInUseError', 'check_work_dir', 'lock_work_dir']

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
