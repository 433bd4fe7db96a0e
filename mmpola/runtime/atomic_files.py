"""Files that are either complete or absent: write under a temporary name, flush to disk, rename.

A rename within one folder is atomic on POSIX file systems, so a reader (or a run resumed after a
kill) sees the old file or the new one, never a partial write. The temporary name
(``.<name>.<pid>.part``) says which file it was for; leftovers of a killed writer are recognised by
:func:`is_part_file`.
"""
import os
import os.path as osp
import re

__all__ = ['part_name', 'is_part_file', 'fsync_file', 'fsync_dir', 'write_atomic', 'write_text_atomic']

_PART_RE = re.compile(r'^\..+\.\d+\.part$')


def part_name(filename):
    """The temporary name under which ``filename`` is written (in the same folder)."""
    return f'.{filename}.{os.getpid()}.part'


def is_part_file(name):
    """Whether ``name`` (a file name) is the temporary file of an unfinished write."""
    return bool(_PART_RE.match(name))


def fsync_dir(path):
    """Flush a folder's entries (a rename in it) to disk, where the file system allows it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse fsync on directories; the rename is still atomic
        pass
    finally:
        os.close(fd)


def fsync_file(path):
    with open(path, 'rb+') as f:
        os.fsync(f.fileno())


def write_atomic(path, write, mode='wb'):
    """Call ``write(f)`` on the temporary file of ``path`` (opened with ``mode``), flush it to disk and
    rename it to ``path``: a reader sees the old file or the complete new one, never a partial write.
    When ``write`` fails (a full disk), the temporary file is removed, ``path`` is left as it was, and
    the error propagates."""
    folder, name = osp.split(osp.abspath(path))
    tmp = osp.join(folder, part_name(name))
    try:
        with open(tmp, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if osp.exists(tmp):
            os.remove(tmp)
        raise
    fsync_dir(folder)


def write_text_atomic(path, text):
    """Write ``text`` to ``path`` so that a reader sees the old or the new content, never a mix."""
    write_atomic(path, lambda f: f.write(text), mode='w')
