"""mmpola's version, and the oldest torch it is tested with.

Only the standard library is imported here: tools/setup_env.py reads this file before anything is installed.
"""
import re

__version__ = '0.1.0'

# The oldest torch release the suite runs on (requirements/compat.txt, `make test-compat`); pyproject.toml
# asks for the same. Older releases lack what mmpola calls: torch 2.4, for one, has no
# nn.Module.register_load_state_dict_pre_hook and no (class, name) pairs in the weights-only allowlist, and
# its Triton no `triton.knobs`.
MIN_TORCH = (2, 11)


def torch_too_old(torch_version):
    """Why this torch version is older than :data:`MIN_TORCH` ('' when it is not): '2.10.1+cu128', '2.12.0a0'."""
    found = re.match(r'(\d+)\.(\d+)', str(torch_version))
    if found is None or (int(found.group(1)), int(found.group(2))) >= MIN_TORCH:
        return ''
    need = '.'.join(map(str, MIN_TORCH))
    return (f'torch {torch_version} is older than {need}, the oldest torch mmpola is tested with; '
            f'upgrade torch and torchvision together (torch >= {need}, docs/install.md)')
