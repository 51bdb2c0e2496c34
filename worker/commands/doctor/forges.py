"""Doctor's forge checks: the URL answers, the token works, who the bot is, what it may reach.

These are read-only diagnostic calls over httpx, not the Forge protocol: doctor needs the raw
status of each answer (a 401 and a refused connection have different fixes) and no retries.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from app.settings import Settings
from worker.commands.doctor.results import CheckResult, DoctorOptions, failed, passed, skipped

TIMEOUT_S = 10.0
MAX_PAGES = 5  # projects looked through when FROGFIX_ALLOWED_PROJECTS holds only patterns
PUSH_LEVEL = 30  # GitLab's Developer: may push a branch and open a merge request


class Unreachable(Exception):
    """The forge did not answer at all (connection refused, DNS, TLS, timeout)."""


@dataclass(frozen=True)
class ForgeSpec:
    """What differs between GitLab and Gitea for these checks."""

    key: str  # gitlab, gitea: check names and FROGFIX_<KEY>_* settings
    title: str
    api: str
    auth: Callable[[str], dict[str, str]]
    login_field: str
    token_fix: str
    access_fix: str
    visible: Callable[[httpx.Client, str], list[str]]  # pushable projects visible to the token
    reach: Callable[[httpx.Client, str, str], str | None]  # None when the bot may push there, else why not

    def env(self, field: str) -> str:
        return f"FROGFIX_{self.key.upper()}_{field}"


def _get(client: httpx.Client, path: str, params: dict[str, Any] | None = None) -> httpx.Response:
    try:
        return client.get(path, params=params)
    except httpx.HTTPError as exc:
        raise Unreachable(f"{type(exc).__name__}: {exc}") from None


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _gitlab_visible(client: httpx.Client, api: str) -> list[str]:
    found: list[str] = []
    for page in range(1, MAX_PAGES + 1):
        params = {"membership": "true", "min_access_level": PUSH_LEVEL, "simple": "true", "per_page": 100, "page": page}
        batch = _json(_get(client, f"{api}/projects", params))
        if not isinstance(batch, list) or not batch:
            break
        found += [str(p.get("path_with_namespace")) for p in batch if isinstance(p, dict)]
    return found


def _project(client: httpx.Client, url: str) -> dict[str, Any] | str:
    """The project as the bot sees it, or why it cannot."""
    response = _get(client, url)
    if response.status_code == 404:
        return "not found, or the bot may not see it"
    data = _json(response)
    if response.status_code != 200 or not isinstance(data, dict):
        return f"HTTP {response.status_code}"
    return data


def _gitlab_reach(client: httpx.Client, api: str, project: str) -> str | None:
    data = _project(client, f"{api}/projects/{quote(project, safe='')}")
    if isinstance(data, str):
        return data
    permissions = data.get("permissions")
    if not isinstance(permissions, dict):
        return None  # an older GitLab that does not say: the project is at least visible
    levels = [(permissions.get(k) or {}).get("access_level") or 0 for k in ("project_access", "group_access")]
    best = max(int(level) for level in levels)
    return None if best >= PUSH_LEVEL else f"access level {best}, below Developer ({PUSH_LEVEL})"


def _gitea_visible(client: httpx.Client, api: str) -> list[str]:
    found: list[str] = []
    for page in range(1, MAX_PAGES + 1):
        body = _json(_get(client, f"{api}/repos/search", {"limit": 50, "page": page}))
        batch = body.get("data") if isinstance(body, dict) else None
        if not isinstance(batch, list) or not batch:
            break
        found += [
            str(r.get("full_name"))
            for r in batch
            if isinstance(r, dict) and (r.get("permissions") or {}).get("admin")
        ]
    return found


def _gitea_reach(client: httpx.Client, api: str, project: str) -> str | None:
    owner, _, name = project.partition("/")
    data = _project(client, f"{api}/repos/{quote(owner, safe='')}/{quote(name, safe='')}")
    if isinstance(data, str):
        return data
    permissions = data.get("permissions")
    if isinstance(permissions, dict) and not permissions.get("admin"):
        # Pushing needs write, but reading another user's permission (who may trigger) needs admin.
        return "the bot is not admin there (Gitea lets only repository admins read who may trigger)"
    return None


GITLAB = ForgeSpec(
    key="gitlab",
    title="GitLab",
    api="/api/v4",
    auth=lambda token: {"PRIVATE-TOKEN": token},
    login_field="username",
    token_fix="create a token with the `api` scope for the FrogFix bot account and set FROGFIX_GITLAB_TOKEN",
    access_fix="add the bot account to the project as Developer (or higher)",
    visible=_gitlab_visible,
    reach=_gitlab_reach,
)
GITEA = ForgeSpec(
    key="gitea",
    title="Gitea",
    api="/api/v1",
    auth=lambda token: {"Authorization": f"token {token}"},
    login_field="login",
    token_fix="create an access token for the FrogFix bot account (scopes: repository and issue read/write, "
    "organization read) and set FROGFIX_GITEA_TOKEN",
    access_fix="give the bot account admin on the repository (Gitea shows another user's permission only to admins)",
    visible=_gitea_visible,
    reach=_gitea_reach,
)


def check_gitlab(settings: Settings, options: DoctorOptions) -> list[CheckResult]:
    return check_forge(GITLAB, settings, settings.gitlab_url, settings.gitlab_token.get_secret_value(),
                       bool(settings.gitlab_webhook_secret.get_secret_value()))


def check_gitea(settings: Settings, options: DoctorOptions) -> list[CheckResult]:
    return check_forge(GITEA, settings, settings.gitea_url, settings.gitea_token.get_secret_value(),
                       bool(settings.gitea_webhook_secret.get_secret_value()))


def check_forge(spec: ForgeSpec, settings: Settings, url: str, token: str, has_secret: bool) -> list[CheckResult]:
    """URL, token and identity, project access, webhook secret; a forge not configured is skipped."""
    k = spec.key
    if not url and not token:
        return [skipped(k, f"not configured ({spec.env('URL')} is empty)")]
    if not url:
        return [failed(f"{k}.url", f"{spec.env('TOKEN')} is set but {spec.env('URL')} is empty",
                       f"set {spec.env('URL')} to the {spec.title} root URL, e.g. https://{k}.example.com")]
    secret = (
        passed(f"{k}.webhook_secret", f"{spec.env('WEBHOOK_SECRET')} is set")
        if has_secret
        else failed(f"{k}.webhook_secret", f"{spec.env('WEBHOOK_SECRET')} is empty: every {spec.title} webhook "
                    "would be refused", f"set {spec.env('WEBHOOK_SECRET')} to the secret of the project's webhook")
    )
    base = url.rstrip("/")
    with httpx.Client(base_url=base, timeout=TIMEOUT_S, follow_redirects=False) as anonymous:
        answered = _url_line(spec, anonymous, base)
    if answered.outcome != "pass":
        return [answered, skipped(f"{k}.token", "not checked: the URL does not answer"),
                skipped(f"{k}.project", "not checked: the URL does not answer"), secret]
    with httpx.Client(base_url=base, timeout=TIMEOUT_S, follow_redirects=False, headers=spec.auth(token)) as client:
        identity = _token_line(spec, client, token)
        if identity.outcome != "pass":
            return [answered, identity, skipped(f"{k}.project", "not checked: the token does not work"), secret]
        try:
            project = _project_line(spec, client, settings)
        except Unreachable as exc:
            project = failed(f"{k}.project", f"{spec.title} stopped answering: {exc}", f"check {spec.env('URL')}")
    return [answered, identity, project, secret]


def _url_line(spec: ForgeSpec, client: httpx.Client, base: str) -> CheckResult:
    name = f"{spec.key}.url"
    fix = f"set {spec.env('URL')} to the {spec.title} root URL (not a project or API URL), reachable from here"
    try:
        response = _get(client, f"{spec.api}/version")
    except Unreachable as exc:
        return failed(name, f"{base} does not answer: {exc}"[:400], fix)
    if 300 <= response.status_code < 400:
        where = response.headers.get("location", "elsewhere")
        return failed(name, f"{base} redirects to {where}", f"set {spec.env('URL')} to where it redirects")
    if response.status_code in (200, 401, 403):
        version = _json(response)
        shown = f" ({spec.title} {version['version']})" if isinstance(version, dict) and "version" in version else ""
        return passed(name, f"{base} answers{shown}")
    return failed(name, f"{base}{spec.api}/version answers HTTP {response.status_code}: no {spec.title} API there", fix)


def _token_line(spec: ForgeSpec, client: httpx.Client, token: str) -> CheckResult:
    name = f"{spec.key}.token"
    if not token:
        return failed(name, f"{spec.env('TOKEN')} is empty", spec.token_fix)
    try:
        response = _get(client, f"{spec.api}/user")
    except Unreachable as exc:
        return failed(name, f"{spec.title} stopped answering: {exc}", f"check {spec.env('URL')}")
    user = _json(response)
    if response.status_code == 200 and isinstance(user, dict) and user.get(spec.login_field):
        return passed(name, f"the token works: bot account @{user[spec.login_field]}")
    if response.status_code in (401, 403):
        why = "rejected" if response.status_code == 401 else "lacks the scope to read its own user"
        return failed(name, f"the token was {why} (HTTP {response.status_code})", spec.token_fix)
    return failed(name, f"reading the token's user answered HTTP {response.status_code}", spec.token_fix)


def _project_line(spec: ForgeSpec, client: httpx.Client, settings: Settings) -> CheckResult:
    """Exact names in FROGFIX_ALLOWED_PROJECTS are each tried; patterns need one visible match."""
    from worker.job.job_context import project_allowed

    name = f"{spec.key}.project"
    entries = [p.strip() for p in settings.allowed_projects.split(",") if p.strip()]
    exact = [p for p in entries if not any(c in p for c in "*?[")]
    if exact:
        refused = {p: why for p in exact if (why := spec.reach(client, spec.api, p)) is not None}
        if not refused:
            return passed(name, f"the bot may push to {', '.join(exact)}")
        shown = "; ".join(f"{p}: {why}" for p, why in refused.items())
        fix = f"{spec.access_fix}, or remove the project from FROGFIX_ALLOWED_PROJECTS"
        return failed(name, f"allowed project(s) out of the bot's reach: {shown}", fix)
    visible = spec.visible(client, spec.api)
    matching = [p for p in visible if project_allowed(settings, p)]
    if matching:
        more = f" and {len(matching) - 3} more" if len(matching) > 3 else ""
        scope = f"FROGFIX_ALLOWED_PROJECTS={settings.allowed_projects}" if entries else "all projects allowed"
        return passed(name, f"the bot may push to {', '.join(matching[:3])}{more} ({scope})")
    if not visible:
        return failed(name, "the bot may push to no project", spec.access_fix)
    patterns = ", ".join(entries)
    example = visible[0]
    return failed(name, f"none of the {len(visible)} project(s) the bot may push to matches {patterns}",
                  f"set FROGFIX_ALLOWED_PROJECTS to match them (e.g. {example}), or {spec.access_fix}")
