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


# The tests of mmpola/models, mmpola/ops and mmpola/checkpoint mirror the package: tests/<path>/test_<name>.py
# tests mmpola/<path>/<name>.py, or a topic that spans modules, named here (the file's name starts or ends
# with it).
MIRRORED = ('models', 'ops', 'checkpoint')
TOPICS = {
    'golden': 'the official models reproduced from the golden mini models of tests/data',
    'timm': "timm's entries and model conventions",
    'gradient_layout': "every gradient with its parameter's strides (DDP's buckets)",
    'triton_paths': "whole models on every Triton path against the library's (on a GPU where there is one)",
    'dense_forward': 'docs/design.md, "Dense forward"',
    'kinds_on_architectures': 'every attention kind on every architecture',
    'official_keys': "every release's official parameter names, shapes and counts",
    'user_kind': "a user's own attention kind, registered and used from configs",
    'layout': 'checkpoints of other blocks than the model, on every loading path',
    'empty_inputs': 'every attention op and implementation on inputs without tokens',
}


def _names_a_topic(stem):
    return any(stem == t or stem.startswith(t + '_') or stem.endswith('_' + t) for t in TOPICS)


def test_test_files_mirror_the_package():
    unmatched = []
    for folder in MIRRORED:
        for dirpath, dirnames, filenames in os.walk(osp.join(REPO, 'tests', folder)):
            dirnames[:] = [d for d in dirnames if d != '__pycache__']
            package_dir = osp.join(REPO, 'mmpola', osp.relpath(dirpath, osp.join(REPO, 'tests')))
            for name in filenames:
                if not (name.startswith('test_') and name.endswith('.py')):
                    continue
                stem = name[len('test_'):-len('.py')]
                module = osp.join(package_dir, stem)
                if not (osp.isfile(module + '.py') or osp.isdir(module) or _names_a_topic(stem)):
                    unmatched.append(osp.relpath(osp.join(dirpath, name), REPO))
    assert not unmatched, ('test files that name neither a module of the folder they mirror under mmpola/ nor a '
                           'topic of TOPICS (rename them after what they test, or add the topic):\n'
                           + '\n'.join(unmatched))


TEST_PATH = re.compile(r'\btests/[\w/]+\.py\b')
OTHER_REPOSITORY = re.compile(r"timm's|of the timm repository")  # timm's own tests/test_models.py


def test_named_test_files_exist():
    """A test file named in the package, the tools, the docs or the README exists (tests are renamed as the
    package changes; a stale name sends a reader nowhere)."""
    paths = list(_files()) + [osp.join(REPO, 'README.md')]
    for dirpath, _, filenames in os.walk(osp.join(REPO, 'docs')):
        paths += [osp.join(dirpath, name) for name in filenames if name.endswith('.md')]
    stale = []
    for path in paths:
        with open(path, encoding='utf-8', errors='replace') as f:
            for number, line in enumerate(f, 1):
                for named in ([] if OTHER_REPOSITORY.search(line) else TEST_PATH.findall(line)):
                    if not osp.isfile(osp.join(REPO, named)):
                        stale.append(f'{osp.relpath(path, REPO)}:{number}: {named}')
    assert not stale, 'test files named but not in the repository (renamed?):\n' + '\n'.join(stale)
