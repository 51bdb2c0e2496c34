"""Doctor's package-mirror check: FROGFIX_PIP_INDEX_URL answers a PEP 503 simple-index request.

Asked the way the setup phase asks it (through the same URL parts, with the credentials sent by
FrogFix, never shown): the project page of `pip`, which every mirror of PyPI serves.
"""

from __future__ import annotations

import httpx

from app.settings import Settings
from worker.commands.doctor.results import CheckResult, DoctorOptions, failed, passed, skipped, warned
from worker.environment.relay import MirrorURL

PROBE_PROJECT = "pip"
TIMEOUT_S = 15.0
SIMPLE_TYPES = ("text/html", "application/vnd.pypi.simple")
NOT_AN_INDEX = (
    "use the simple index URL (devpi: .../+simple/, Nexus: .../simple/, Artifactory: .../api/pypi/<repo>/simple/)"
)
ROOT_BYTES = 64 * 1024


def check_mirror(settings: Settings, options: DoctorOptions) -> list[CheckResult]:
    raw = settings.pip_index_url.get_secret_value()
    if not raw:
        return [skipped("mirror", "FROGFIX_PIP_INDEX_URL is not set: no test environment is built")]
    try:
        mirror = MirrorURL(raw)
    except ValueError as exc:
        return [failed("mirror", str(exc), "set FROGFIX_PIP_INDEX_URL to the mirror's simple index, e.g. "
                       "https://devpi.example/root/pypi/+simple/")]
    url = f"{mirror.without_credentials()}{PROBE_PROJECT}/"
    shown = mirror.shown()
    try:
        response = httpx.get(url, auth=mirror.auth(), timeout=TIMEOUT_S, follow_redirects=False,
                             headers={"Accept": "application/vnd.pypi.simple.v1+html, text/html"})
    except httpx.HTTPError as exc:
        return [failed("mirror", f"nothing answers at {shown}: {type(exc).__name__}",
                       "start the mirror, or correct FROGFIX_PIP_INDEX_URL (host, port, scheme)")]
    if response.status_code in (401, 403):
        return [failed("mirror", f"{shown} refused FrogFix's credentials (HTTP {response.status_code})",
                       "put the mirror's user and password in FROGFIX_PIP_INDEX_URL (https://user:password@host/...)")]
    if response.is_redirect or response.status_code == 404:  # a partial mirror without pip: is it an index?
        return [_root_line(mirror)]
    if response.status_code != 200:
        return [failed("mirror", f"{shown}{PROBE_PROJECT}/ answered HTTP {response.status_code}", NOT_AN_INDEX)]
    kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
    if not kind.startswith(SIMPLE_TYPES) or PROBE_PROJECT not in response.text.lower():
        return [failed("mirror", f"{shown} did not answer like a simple index (content type {kind or 'none'})",
                       "point FROGFIX_PIP_INDEX_URL at the simple index, not the mirror's web page")]
    if mirror.password and len(mirror.password) < 4:
        return [warned("mirror", f"{shown} serves the simple index, but its password is too short to redact",
                       "use a mirror password of 4 characters or more")]
    return [passed("mirror", f"{shown} serves the simple index ({PROBE_PROJECT} listed)")]


def _root_line(mirror: MirrorURL) -> CheckResult:
    """The index root (its first bytes only: a whole mirror of PyPI lists every project)."""
    shown = mirror.shown()
    try:
        with httpx.stream("GET", mirror.without_credentials(), auth=mirror.auth(), timeout=TIMEOUT_S) as response:
            head = b""
            for chunk in response.iter_bytes():
                head += chunk
                if len(head) >= ROOT_BYTES:
                    break
            kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
            status = response.status_code
    except httpx.HTTPError as exc:
        return failed("mirror", f"{shown} broke off: {type(exc).__name__}", "check the mirror's logs")
    if status != 200 or not kind.startswith(SIMPLE_TYPES) or b"<a" not in head.lower():
        return failed("mirror", f"{shown} does not answer like a simple index (HTTP {status}, {kind or 'no type'})",
                      NOT_AN_INDEX)
    return warned("mirror", f"{shown} serves a simple index, but not `{PROBE_PROJECT}`",
                  "mirror what the repositories need (a PyPI mirror serves everything); FrogFix follows no redirect")
