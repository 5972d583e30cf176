"""A Ctrl-C while ``popgrad`` (the command) is still importing: one line and status 130, no traceback.

Imported first by ``popgrad/__init__.py``; it acts only when the program is the ``popgrad`` command
(or ``python -m popgrad.app.cli``), never for a library user, and only on ``KeyboardInterrupt``.
"""
import os
import sys

_CLI_MODULES = ("popgrad.app.cli", "popgrad")


def _is_cli() -> bool:
    argv = getattr(sys, "orig_argv", None) or sys.argv
    if sys.argv and os.path.basename(sys.argv[0]) == "popgrad":
        return True
    return any(a == "-m" and i + 1 < len(argv) and argv[i + 1] in _CLI_MODULES for i, a in enumerate(argv))


def _hook(exc_type, exc, tb, _previous=sys.excepthook):
    if issubclass(exc_type, KeyboardInterrupt):
        sys.stderr.write("popgrad: interrupted (nothing was written)\n")
        sys.stderr.flush()
        os._exit(130)
    _previous(exc_type, exc, tb)


if _is_cli() and sys.excepthook is sys.__excepthook__:
    sys.excepthook = _hook
