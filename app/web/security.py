"""Sign-in and CSRF for everything but the webhooks, health and metrics: one ASGI middleware.

Deny by default: every path not listed as open needs a signed-in session (or, for /api, /docs and
/openapi.json, the admin bearer token), so a route added later is closed until someone opens it.
Every request that changes something and is not authenticated by the bearer token must carry the
session's CSRF token, in the `X-CSRF-Token` header or a `csrf_token` form field; webhooks are signed
by the forge and are not subject to it.

The middleware puts what it learnt in `request.state`: `operator` (the username or None), `session`
(auth.SessionData), `csrf_token`, and `auth_via` ("session", "proxy", "token" or None).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import MutableHeaders
from starlette.requests import Request

from app import auth
from app.db import session_scope
from app.settings import Settings, get_settings

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# /metrics checks FROGFIX_METRICS_TOKEN itself (app/web/health.py): Prometheus has no session.
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/favicon.ico"})
OPEN_PREFIXES = ("/webhooks/", "/static/")
SIGN_IN_PATHS = frozenset({"/login"})
TOKEN_PATHS = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
MAX_FORM_BYTES = 64 * 1024
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf_token"


def is_open(path: str) -> bool:
    return path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)


def is_token_path(path: str) -> bool:
    return path == "/api" or path.startswith("/api/") or path in TOKEN_PATHS


def bearer_problem(authorization: str | None, settings: Settings) -> str | None:
    """None when the header carries the admin token, else why not (the API's 401 detail)."""
    expected = settings.admin_token.get_secret_value()
    if not expected:
        return "the API is closed: FROGFIX_ADMIN_TOKEN is not set"
    return None if bearer_matches(authorization, expected) else "missing or wrong bearer token"


def bearer_matches(authorization: str | None, expected: str) -> bool:
    """The header is `Bearer <expected>` (compared in constant time); never true for an empty token."""
    scheme, _, token = (authorization or "").partition(" ")
    if not expected or scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(token.strip().encode(), expected.encode())


def safe_next(target: str | None) -> str:
    """Where to go after signing in: a path on this site only (no //host, no scheme)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def session_cookie_header(request: Request, value: str, max_age: int) -> str:
    """The Set-Cookie value: HttpOnly, SameSite=Lax (links from the forge still open job pages), Secure on https."""
    secure = request.url.scheme == "https" or request.headers.get("x-forwarded-proto", "").lower() == "https"
    parts = [f"{auth.SESSION_COOKIE}={value}", "Path=/", f"Max-Age={max_age}", "HttpOnly", "SameSite=Lax"]
    if secure:
        parts.append("Secure")
    return "; ".join(parts)


def clear_cookie_header(name: str) -> str:
    return f"{name}=; Path=/; Max-Age=0; HttpOnly; SameSite=Lax"


def _operator_still_valid(username: str, fingerprint: str, key: bytes) -> bool:
    """The account exists and its password is the one the session was signed in with."""
    with session_scope() as session:
        operator = auth.get_operator(session, username)
        if operator is None:
            return False
        return hmac.compare_digest(auth.password_fingerprint(key, operator.password_hash), fingerprint)


@dataclass
class _Identity:
    """Who a request comes from: its session, how it signed in (None: it did not), and whether to set the cookie."""

    session: auth.SessionData
    via: str | None
    issue_cookie: bool


async def _identify(request: Request, settings: Settings, key: bytes) -> _Identity:
    """A trusted proxy's user header wins; else a valid password session; else a fresh anonymous session."""
    session = auth.decode_session(key, request.cookies.get(auth.SESSION_COOKIE), settings.session_max_age_seconds)
    issue_cookie = False
    via: str | None = None
    proxy_header = settings.trust_proxy_user_header.strip()
    proxy_user = request.headers.get(proxy_header, "").strip()[:64] if proxy_header else ""
    if proxy_user:
        if session is None or session.user != proxy_user or session.source != "proxy":
            session = auth.new_session(proxy_user, "proxy")
            issue_cookie = True
        via = "proxy"
    elif session is not None and session.user is not None:
        valid = session.source == "password" and await run_in_threadpool(
            _operator_still_valid, session.user, session.fingerprint, key
        )
        if valid:
            via = "session"
        else:
            session = None
    if session is None or (via is None and session.user is not None):
        session = auth.new_session(None, "anonymous")
        issue_cookie = True
    return _Identity(session, via, issue_cookie)


async def _admitted(scope: Scope, request: Request, settings: Settings, who: _Identity, send: Send) -> bool:
    """Whether the request may go on; if not, its answer (401 or a redirect to sign in) is sent.

    On the token paths, a valid bearer token admits the request as `token` (and sets no cookie).
    """
    path: str = scope["path"]
    if is_token_path(path):
        problem = bearer_problem(request.headers.get("authorization"), settings)
        if problem is None:
            who.via, who.issue_cookie = "token", False
        elif who.via is None:
            await _json(send, 401, {"detail": problem}, {"www-authenticate": "Bearer"})
            return False
        return True
    if path in SIGN_IN_PATHS or who.via is not None:
        return True
    if scope["method"] in ("GET", "HEAD") and "application/json" not in request.headers.get("accept", ""):
        target = path + (f"?{scope['query_string'].decode('latin-1')}" if scope.get("query_string") else "")
        await _redirect(send, "/login" if target == "/" else f"/login?next={quote(target, safe='')}")
    else:
        await _json(send, 401, {"detail": "sign in first"})
    return False


async def _csrf_checked(
    request: Request, key: bytes, who: _Identity, receive: Receive, send: Send
) -> Receive | None:
    """The `receive` to hand on when the request carries its CSRF token (or needs none); None once refused.

    The token comes from the header, or from the form field of a small urlencoded body; a body
    read for that is replayed to the app.
    """
    if request.method in SAFE_METHODS or who.via == "token":
        return receive
    token = request.headers.get(CSRF_HEADER)
    if token is None:
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type == "application/x-www-form-urlencoded":
            body = await _read_body(receive, MAX_FORM_BYTES)
            if body is None:
                await _json(send, 413, {"detail": "form too large"})
                return None
            receive = _replay(body, receive)
            token = next((v for k, v in parse_qsl(body.decode("utf-8", "replace")) if k == CSRF_FIELD), None)
    if not auth.check_csrf(key, who.session, token):
        await _json(send, 403, {"detail": "the CSRF token is missing or wrong: reload the page and try again"})
        return None
    return receive


def _sending_cookie(send: Send, cookie: str | None) -> Send:
    """A `send` that adds the session cookie to the response, unless the route set one itself."""

    async def send_with_cookie(message: Message) -> None:
        if cookie is not None and message["type"] == "http.response.start":
            headers = MutableHeaders(scope=message)
            already = any(v.startswith(f"{auth.SESSION_COOKIE}=") for v in headers.getlist("set-cookie"))
            if not already:
                headers.append("set-cookie", cookie)
        await send(message)

    return send_with_cookie


class DashboardSecurity:
    """The ASGI middleware described in the module docstring."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or is_open(scope["path"]):
            await self.app(scope, receive, send)
            return
        settings = get_settings()
        request = Request(scope)
        key = auth.secret_key(settings)
        who = await _identify(request, settings, key)
        if not await _admitted(scope, request, settings, who, send):
            return
        checked = await _csrf_checked(request, key, who, receive, send)
        if checked is None:
            return
        state = scope.setdefault("state", {})
        state["operator"] = who.session.user if who.via in ("session", "proxy") else None
        state["session"] = who.session
        state["csrf_token"] = auth.csrf_token(key, who.session)
        state["auth_via"] = who.via
        cookie = None
        if who.issue_cookie:
            value = auth.encode_session(key, who.session)
            cookie = session_cookie_header(request, value, settings.session_max_age_seconds)
        await self.app(scope, checked, _sending_cookie(send, cookie))


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that hands the app the body we already read, then defers to the real one."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _json(send: Send, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    payload = json.dumps(body).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})


async def _redirect(send: Send, location: str) -> None:
    headers = [(b"location", location.encode("latin-1")), (b"content-length", b"0"), (b"cache-control", b"no-store")]
    await send({"type": "http.response.start", "status": 303, "headers": headers})
    await send({"type": "http.response.body", "body": b""})
