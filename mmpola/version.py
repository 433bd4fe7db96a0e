"""mmpola's version, and the oldest torch it is tested with.

Only the standard library is imported here: tools/setup_env.py reads this file before anything is installed.
"""
import re

__version__ = '0.1.0'

# The oldest torch release the suite runs on (requirements/compat.txt, `make test-compat`); pyproject.toml
# asks for the same. What older releases lack: docs/development.md, "A second torch".
MIN_TORCH = (2, 11)


def release(version):
    """(major, minor) of a version string: '2.10.1+cu128' -> (2, 10), '2.12.0a0+git1234' -> (2, 12); None if
    it starts with neither."""
    found = re.match(r'(\d+)\.(\d+)', str(version))
    return (int(found.group(1)), int(found.group(2))) if found else None


def torch_too_old(torch_version):
    """Why this torch version is older than :data:`MIN_TORCH` ('' when it is not)."""
    if (release(torch_version) or MIN_TORCH) >= MIN_TORCH:
        return ''
    need = '.'.join(map(str, MIN_TORCH))
    return (f'torch {torch_version} is older than {need}, the oldest torch mmpola is tested with; '
            f'upgrade torch and torchvision together (torch >= {need}, docs/install.md)')
