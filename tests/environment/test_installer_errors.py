"""The one-line reason an environment could not be built quotes the installer's first error, and its cause."""

from __future__ import annotations

import pytest

from worker.environment.builder import _first_error

UV_BOXED = (
    "Using Python 3.11\n"
    "  \u00d7 No solution found when resolving dependencies:\n"
    "  \u2570\u2500\u25b6 Because frogfix-no-such-package was not found in the package registry and you require\n"
    "      frogfix-no-such-package==3.1, we can conclude that your requirements are unsatisfiable.\n"
)
UV_PLAIN = "error: No solution found when resolving dependencies\n  cause: Because frogfix-x was not found\n"
PIP = "Looking in indexes: http://mirror/simple\nERROR: Could not find a version that satisfies the requirement foo\n"


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        (UV_BOXED, ": \u00d7 No solution found when resolving dependencies: Because frogfix-no-such-package was not "
                   "found in the package registry and you require"),
        (UV_PLAIN, ": error: No solution found when resolving dependencies: Because frogfix-x was not found"),
        (PIP, ": ERROR: Could not find a version that satisfies the requirement foo"),
        ("Collecting foo\nInstalled 3 packages\n", ""),
        ("error: the build backend failed\nTraceback (most recent call last):\n", ": error: the build backend failed"),
    ],
    ids=["uv-boxed", "uv-plain", "pip", "no-error-line", "no-cause-line"],
)
def test_the_reason_names_what_the_installer_could_not_find(log: str, expected: str) -> None:
    assert _first_error(log) == expected


def test_the_reason_stays_one_bounded_line() -> None:
    reason = _first_error("error: x:\n" + "y" * 5000 + "\n")
    assert "\n" not in reason and len(reason) <= 302
