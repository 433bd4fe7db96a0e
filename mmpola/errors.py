"""The errors a user can fix, under one base class.

Every error mmpola raises for a problem on the user's side (a path, a flag, a config value, a
checkpoint of another model, bad data, a diverging run) derives from :class:`MMPolaUserError`.
Its message names the problem and the fix, so the tools print it as one ``error: ...`` line with
no traceback (:func:`mmpola.runtime.cli.exit_on_user_error`) and exit with :attr:`exit_code`.
Each subclass also derives from the builtin type code would naturally catch (``ValueError`` for
a bad argument, ``RuntimeError`` for a refused file ...), so existing ``except`` clauses keep
working.
"""

import difflib

__all__ = ['MMPolaUserError', 'UserError', 'close_matches']


class MMPolaUserError(Exception):
    """Base of every error the user can fix; the tools print its message and exit with ``exit_code``."""

    exit_code = 2


class UserError(MMPolaUserError):
    """A problem with the tools' inputs (a missing file, a flag that does not fit the config, data)."""


def close_matches(word, candidates, n=3, cutoff=0.6):
    """The candidates close to ``word`` (difflib's, best first; case-insensitively when none is close as
    written): what the messages offer as "did you mean ...?"."""
    candidates = list(candidates)
    close = difflib.get_close_matches(word, candidates, n=n, cutoff=cutoff)
    if not close:
        lowered = {c.lower(): c for c in candidates}
        close = [lowered[c] for c in difflib.get_close_matches(word.lower(), list(lowered), n=n, cutoff=cutoff)]
    return close
