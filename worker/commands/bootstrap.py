"""Which Python runs manage.py: this interpreter when it has FrogFix's dependencies, else the checkout's
.venv (made by ./install.sh), so `./manage.py` works without anyone activating the environment.

Standard library only: it runs before anything third-party is imported."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout: manage.py, pyproject.toml, .venv
VENV = ROOT / ".venv"  # where ./install.sh puts FrogFix's Python dependencies
_REEXEC_MARK = "FROGFIX_MANAGE_REEXEC"  # set on the re-exec, so a broken .venv cannot loop


def _missing_dependencies() -> list[str]:
    """pyproject.toml's runtime dependencies that this interpreter has no distribution of.

    Looked up by name only (no import, no version check), so the wrong interpreter is told from
    the right one in milliseconds, before anything third-party is imported."""
    import importlib.metadata
    import re

    try:
        import tomllib
    except ImportError:
        return [f"Python 3.11 or newer, not {sys.version.split()[0]}"]
    try:
        declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    except (OSError, ValueError, KeyError):
        return []  # no pyproject.toml beside manage.py to go by: let the imports decide
    missing = []
    for requirement in declared:
        name = re.match(r"[A-Za-z0-9._-]+", requirement)
        if name is None:
            continue
        try:
            importlib.metadata.distribution(name.group())
        except importlib.metadata.PackageNotFoundError:
            missing.append(name.group())
    return missing


def use_checkout_venv() -> None:
    """Run under .venv/bin/python when this interpreter lacks the dependencies and .venv exists.

    So `./manage.py` works after ./install.sh without anyone activating the environment, while
    `python manage.py` under any interpreter that has the project installed runs right there."""
    reexeced = os.environ.pop(_REEXEC_MARK, None)  # popped, so no child of ours inherits it
    missing = _missing_dependencies()
    if not missing:
        return
    venv_python = VENV / "bin" / "python"
    in_venv = Path(sys.prefix).resolve() == VENV.resolve()  # a half-finished ./install.sh: nowhere better to go
    if in_venv or reexeced or not os.access(venv_python, os.X_OK):
        names = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        sys.exit(f"manage.py: {sys.executable} lacks FrogFix's dependencies ({names}); run ./install.sh")
    os.environ[_REEXEC_MARK] = "1"
    os.execv(venv_python, [str(venv_python), str(ROOT / "manage.py"), *sys.argv[1:]])
