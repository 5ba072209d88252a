"""gpusched's errors: one root, ``GpuschedError``, under which every error raised on purpose sits.

An error under the root says "this input, setting or environment cannot be used as given" and its
message names what and where; the command line prints it as one ``error:`` line and exits 2
(``gpusched.cli.run_cli``). Anything else that escapes is a bug and keeps its traceback, as do the
invariant checks (``AccountingError``, ``StatementClosed``) and the internal control-flow signals.

Each class keeps the builtin base it had before the root existed (``ValueError``, ``RuntimeError``,
``OSError``), so code that catches those is unchanged.
"""

from __future__ import annotations


class GpuschedError(Exception):
    """The root of every error gpusched raises on purpose; the message names what and where."""


class InvalidInput(GpuschedError, ValueError):
    """Input or settings that cannot be used as given (a file, an option, an argument)."""


class InvalidSpec(InvalidInput):
    """A node or pod spec that cannot be scheduled as written. The message names the field."""


class ResourceError(GpuschedError, OSError):
    """Something outside the program that a command needs cannot be used: a file or folder to
    write, an address to listen on, a certificate to load. The message names it."""
