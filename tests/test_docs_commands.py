"""Every shell command in README.md and docs/*.md runs as written from a clone: each names an entry point
that exists (a make target, an executable script of the repository with a shebang, or a script called
through an interpreter), the config files it names exist, and its --options are the tool's own.
Placeholders in capitals (CONFIG, CHECKPOINT, PATH ...) and optional [--flags] are fine."""
import glob
import os
import os.path as osp
import re
import shlex

import pytest

from tests.fixtures.paths import REPO

FENCE = re.compile(r'^```(bash|sh|shell|console)\n(.*?)^```', re.S | re.M)
PLACEHOLDER = re.compile(r'^[A-Z][A-Z0-9_]*(/|$)')
ASSIGNMENT = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*=')
INTERPRETERS = {'python', 'python3', '.venv/bin/python'}
# programs a reader has that are not the repository's
EXTERNAL = {'pip', 'mim', 'git', 'cd', 'source', 'export', 'cp', 'ln', 'mkdir', 'ls', 'bash'}
# where a tool's command-line options are defined besides the script itself
OPTION_SOURCES = ('mmpola/runtime/*.py',)


def _doc_files():
    return [osp.join(REPO, 'README.md')] + sorted(glob.glob(osp.join(REPO, 'docs', '*.md')))


def _commands(path):
    """(line number, list of argv) of every command in the file's shell blocks."""
    with open(path) as f:
        text = f.read()
    for match in FENCE.finditer(text):
        first_line = text[:match.start(2)].count('\n') + 1
        lines = match.group(2).split('\n')
        i = 0
        while i < len(lines):
            number, line = first_line + i, lines[i]
            while line.rstrip().endswith('\\') and i + 1 < len(lines):
                i += 1
                line = line.rstrip()[:-1] + ' ' + lines[i]
            i += 1
            tokens = shlex.split(line, comments=True)
            command = []
            for token in tokens + ['&&']:
                if token in ('&&', ';', '||', '|'):
                    if command:
                        yield number, command
                    command = []
                else:
                    command.append(token)


def _make_targets():
    with open(osp.join(REPO, 'Makefile')) as f:
        return set(re.findall(r'^([\w-]+):', f.read(), re.M))


def _option_text(script):
    texts = [open(script).read()]
    for pattern in OPTION_SOURCES:
        texts += [open(p).read() for p in glob.glob(osp.join(REPO, pattern))]
    return '\n'.join(texts)


def _problems(argv):
    while argv and ASSIGNMENT.match(argv[0]):
        argv = argv[1:]
    if not argv:
        return []
    program, args = argv[0], argv[1:]
    if program == 'make':
        targets = [a for a in args if not ASSIGNMENT.match(a) and not a.startswith('-')]
        return [f'make target {t!r} does not exist' for t in targets if t not in _make_targets()]
    if program in EXTERNAL:
        return []
    script = None
    if program in INTERPRETERS or program.endswith('/python') or program.endswith('/python3'):
        if args and args[0] in ('-m', '-c'):
            return []
        if not args:
            return [f'{program} runs no script']
        script, args = args[0], args[1:]
        if not osp.isfile(osp.join(REPO, script)):
            return [f'{script} does not exist']
    elif not PLACEHOLDER.match(program):
        script = program
        path = osp.join(REPO, script)
        if not osp.isfile(path):
            return [f'{script} is neither a file of the repository nor a known program']
        if not os.access(path, os.X_OK):
            return [f'{script} is not executable (git mode 100755), yet the docs run it directly']
        with open(path) as f:
            if not f.readline().startswith('#!'):
                return [f'{script} has no shebang line, yet the docs run it directly']
    problems = []
    for arg in args:
        if arg.startswith('[') or PLACEHOLDER.match(arg):
            continue
        value = arg.split('=', 1)[-1]
        placeholder_part = any(PLACEHOLDER.match(part) for part in value[:-3].split('/'))
        if value.startswith('configs/') and value.endswith('.py') and not placeholder_part \
                and not osp.isfile(osp.join(REPO, value)):
            problems.append(f'config {value} does not exist')
        if script and script.endswith('.py') and re.match(r'^--[a-z][\w-]*$', arg.split('=', 1)[0]):
            option = arg.split('=', 1)[0]
            if f"'{option}'" not in _option_text(osp.join(REPO, script)):
                problems.append(f'{script} has no option {option}')
    return problems


def test_the_docs_have_shell_commands():
    assert sum(1 for path in _doc_files() for _ in _commands(path)) > 30


@pytest.mark.parametrize('path', _doc_files(), ids=lambda p: osp.relpath(p, REPO))
def test_every_documented_command_names_a_runnable_entry_point(path):
    found = [f'{osp.relpath(path, REPO)}:{number}: {" ".join(argv)}: {problem}'
             for number, argv in _commands(path) for problem in _problems(argv)]
    assert not found, '\n'.join(found)
