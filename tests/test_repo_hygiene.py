"""The code speaks of the project alone: no references to design material outside the repository,
no issue numbers, no absolute paths of one machine (design notes live in docs/)."""
import os
import os.path as osp
import re

from tests.fixtures.paths import REPO  # noqa: E402

FOLDERS = ('mmpola', 'tools', 'tests', 'configs')
SUFFIXES = ('.py', '.sh', '.md', '.txt', '.toml', '.cfg', '.ini', '.yaml', '.yml')

# spelled in pieces so that this file does not match itself
FORBIDDEN = {
    'a spec section': re.compile('spec ' + '\u00a7'),
    'a section sign reference': re.compile('\u00a7' + r'\s*\d'),
    'design material outside the repo': re.compile(r'shared/' + 'design|' + r'\.\./' + 'shared'),
    'an issue number': re.compile(r'\(#\d+\)|\bissue\s+#\d+|\(issue\s+\d+\)', re.IGNORECASE),
    'an absolute machine path': re.compile(r'(?<![\w.])/(work|root|home/\w+)/'),
}


def _files():
    for folder in FOLDERS:
        for dirpath, dirnames, filenames in os.walk(osp.join(REPO, folder)):
            dirnames[:] = [d for d in dirnames if d != '__pycache__']
            for name in filenames:
                if name.endswith(SUFFIXES):
                    yield osp.join(dirpath, name)


def test_no_references_to_how_the_project_was_made():
    found = []
    for path in _files():
        with open(path, encoding='utf-8', errors='replace') as f:
            for number, line in enumerate(f, 1):
                for what, pattern in FORBIDDEN.items():
                    if pattern.search(line):
                        found.append(f'{osp.relpath(path, REPO)}:{number}: {what}: {line.strip()[:100]}')
    assert not found, 'write design notes in docs/ instead:\n' + '\n'.join(found)
