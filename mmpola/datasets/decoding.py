"""JPEG files whose body is damaged: found where the image is decoded, at no cost up front.

A JPEG with a valid header and end marker whose entropy-coded data are damaged in the middle (bytes
overwritten on a failing disk or by a bad copy) decodes to an image: libjpeg, the decoder of both of
mmcv's image backends, fills what it cannot decode with gray or noise and goes on. Pillow drops
libjpeg's warnings without a word; OpenCV (mmcv's default backend, ``imdecode_backend='cv2'``) leaves
them to libjpeg, which writes them to the process's standard error (``Corrupt JPEG data: premature
end of data segment``) without naming the file, and the image is trained on. Neither raises.

Finding such a file up front means decoding every image before the run (hours at COCO or ImageNet
scale); the pre-flight checks read only each file's ends (:mod:`mmpola.runtime.preflight.files`).
Here the decode that happens anyway is watched instead: ``LoadCheckedImage`` (:mod:`.checked_loading`) is mmcv's
``LoadImageFromFile`` whose decoding runs with the process's standard error (file descriptor 2, where
libjpeg writes) sent to a temporary file; a libjpeg message that says the data are corrupt stops the
pipeline with :class:`DamagedImageError` naming the file and the fix (or, with mmcv's
``ignore_empty=True``, leaves the image out with a warning, mmengine's dataset then taking another).
Every other line written there meanwhile is passed on to standard error unchanged. The cost is two
``dup2`` calls and a read of an empty file per image.
"""
import contextlib
import os
import sys
import tempfile
import threading

from mmpola.errors import MMPolaUserError

__all__ = ['DamagedImageError', 'UnreadableImageError', 'corrupt_jpeg_messages',
           'decoder_messages', 'unreadable_image']

# libjpeg's warnings that mean pixels were lost (jerror.h: JWRN_EXTRANEOUS_DATA, JWRN_HIT_MARKER,
# JWRN_HUFF_BAD_CODE, JWRN_MUST_RESYNC, JWRN_JPEG_EOF, the arithmetic decoder's); "Corrupt JPEG data: bad
# ICC marker" concerns the colour profile only
_CORRUPT = ('Corrupt JPEG data', 'Premature end of JPEG file')
_HARMLESS = ('bad ICC marker',)

_LOCK = threading.Lock()
_SINK = {}  # pid -> the temporary file that receives fd 2 while decoding (one per process: workers fork)


def _sink():
    pid = os.getpid()
    if pid not in _SINK:
        _SINK.clear()  # a forked worker must not share its parent's file (and its offset)
        _SINK[pid] = tempfile.TemporaryFile()
    return _SINK[pid]


@contextlib.contextmanager
def decoder_messages():
    """Collect what native code writes to standard error (fd 2) inside the block, as a list of lines.

    The lines are available once the block ends; each line is also written to standard error then,
    except those :func:`corrupt_jpeg_messages` recognises (the caller reports them)."""
    lines = []
    with _LOCK:
        try:
            saved = os.dup(2)
        except OSError:  # no standard error to watch (closed): nothing is said there either
            yield lines
            return
        sink = _sink()
        if sys.stderr is not None:
            sys.stderr.flush()
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            fd = sink.fileno()  # written through fd 2 (its offset shared), read and emptied at the OS level
            size = os.lseek(fd, 0, os.SEEK_CUR)
            if size:
                text = os.pread(fd, size, 0).decode(errors='replace')
                os.ftruncate(fd, 0)
                os.lseek(fd, 0, os.SEEK_SET)
                lines.extend(text.splitlines())
                others = [line for line in lines if line not in corrupt_jpeg_messages(lines)]
                if others:
                    os.write(2, ('\n'.join(others) + '\n').encode())


def corrupt_jpeg_messages(lines):
    """The lines of libjpeg's that say a JPEG's data are corrupt (pixels lost)."""
    return [line for line in lines
            if line.strip().startswith(_CORRUPT) and not any(h in line for h in _HARMLESS)]


class DamagedImageError(MMPolaUserError, ValueError):
    """An image file decodes only with parts lost (a damaged body)."""


class UnreadableImageError(MMPolaUserError, OSError):
    """An image file that cannot be read or decoded at all (permission denied, empty, no image, cut off)."""


def unreadable_image(path, error):
    """:class:`UnreadableImageError` naming ``path``, why (``error``) and the fix."""
    why = f'{type(error).__name__}: {error}' if str(error) else type(error).__name__
    return UnreadableImageError(
        f'image {path} cannot be loaded ({why}). Fix: replace it with the original file (download or copy it '
        'again), make it readable by this user, or remove it from the dataset')
