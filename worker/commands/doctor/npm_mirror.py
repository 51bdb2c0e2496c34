"""Doctor's npm-mirror check: FROGFIX_NPM_REGISTRY_URL answers and takes FrogFix's credentials.

Two requests, with the credentials sent by FrogFix (HTTP Basic, as the relay sends them) and never
shown: `-/ping` (is an npm registry there), then the package document of PROBE_PACKAGE, because
a registry answers ping to anyone (Verdaccio does, even with a wrong password) and only a package
proves the credentials. Its headers suffice: the body is not read.
"""

from __future__ import annotations

import httpx

from app.settings import Settings
from worker.commands.doctor.results import CheckResult, DoctorOptions, failed, passed, skipped, warned
from worker.environment.relay import MirrorURL

NAME = "npm mirror"
# Yarn classic, which FrogFix itself installs from the mirror for Yarn repositories; every npm mirror serves it.
PROBE_PACKAGE = "yarn"
TIMEOUT_S = 15.0
PACKAGE_TYPES = ("application/json", "application/vnd.npm.install-v1+json")
NOT_A_REGISTRY = "point FROGFIX_NPM_REGISTRY_URL at the npm registry itself (the URL `npm --registry` takes)"
EXAMPLE = "https://user:password@npm.example/repository/npm-proxy/"


def check_npm_mirror(settings: Settings, options: DoctorOptions) -> list[CheckResult]:
    raw = settings.npm_registry_url.get_secret_value()
    if not raw:
        return [skipped(NAME, "FROGFIX_NPM_REGISTRY_URL is not set: JavaScript and TypeScript repositories get "
                              "no environment (no node_modules, so no test evidence)")]
    try:
        registry = MirrorURL(raw)
    except ValueError:
        return [failed(NAME, "FROGFIX_NPM_REGISTRY_URL is not an http:// or https:// URL",
                       f"set FROGFIX_NPM_REGISTRY_URL to the registry's URL, e.g. {EXAMPLE}")]
    shown = registry.shown()
    ping = _get(registry, "-/ping")
    if isinstance(ping, str):
        return [failed(NAME, f"nothing answers at {shown}: {ping}",
                       "start the registry, or correct FROGFIX_NPM_REGISTRY_URL (host, port, scheme, path)")]
    refused = _refused(shown, ping)
    if refused is not None:
        return [refused]
    probe = _get(registry, PROBE_PACKAGE)
    if isinstance(probe, str):
        return [failed(NAME, f"{shown} broke off on {PROBE_PACKAGE}: {probe}", "check the registry's logs")]
    refused = _refused(shown, probe)
    if refused is not None:
        return [refused]
    if probe.status_code == 404 and ping.status_code != 200:
        return [failed(NAME, f"{shown} does not answer like an npm registry (-/ping: HTTP {ping.status_code}, "
                             f"{PROBE_PACKAGE}: HTTP 404)", NOT_A_REGISTRY)]
    if probe.status_code == 404:
        return [warned(NAME, f"{shown} answers, but does not serve `{PROBE_PACKAGE}`",
                       "proxy the public npm registry (FrogFix installs the package managers from it)")]
    kind = probe.headers.get("content-type", "").split(";")[0].strip().lower()
    if probe.status_code != 200 or not kind.startswith(PACKAGE_TYPES):
        return [failed(NAME, f"{shown}{PROBE_PACKAGE} answered HTTP {probe.status_code} ({kind or 'no type'})",
                       NOT_A_REGISTRY)]
    if registry.password and len(registry.password) < 4:
        return [warned(NAME, f"{shown} serves packages, but its password is too short to redact",
                       "use a registry password of 4 characters or more")]
    return [passed(NAME, f"{shown} serves packages ({PROBE_PACKAGE} found)")]


def _get(registry: MirrorURL, path: str) -> httpx.Response | str:
    """The response, its body unread; or why none came (the exception's name: never a URL)."""
    url = f"{registry.without_credentials()}{path}"
    try:
        with httpx.stream("GET", url, auth=registry.auth(), timeout=TIMEOUT_S, follow_redirects=False,
                          headers={"Accept": "application/vnd.npm.install-v1+json, application/json"}) as response:
            return response
    except httpx.HTTPError as exc:
        return type(exc).__name__


def _refused(shown: str, response: httpx.Response) -> CheckResult | None:
    if response.status_code not in (401, 403):
        return None
    given = "FrogFix's credentials" if "@" in shown else "a request without credentials"
    return failed(NAME, f"{shown} refused {given} (HTTP {response.status_code})",
                  "put the registry's user and password in FROGFIX_NPM_REGISTRY_URL (https://user:password@host/...)")
