"""Dashboard accounts, signed session cookies and CSRF tokens.

Passwords are stored as scrypt hashes with a per-user salt, so a copy of the database does not give
the passwords away. Sessions are stateless cookies signed with HMAC-SHA256 under the secret key;
each one carries a random session id, and the CSRF token is an HMAC of that id, so a token is only
good for the session it was issued with. A session also carries a fingerprint of the operator's
password hash: changing the password (or deleting the account) ends every session at once.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from sqlalchemy import delete, select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.models import Operator, utcnow
from app.settings import Settings

MIN_PASSWORD_LENGTH = 12
MAX_PASSWORD_LENGTH = 1024  # bounds the work a sign-in attempt can ask of scrypt
USERNAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")

# scrypt cost: ~16 MiB and a few tens of milliseconds per hash; stored with the hash so it can grow later.
SCRYPT_N = 2**14
SCRYPT_R = 8
SCRYPT_P = 1
SCRYPT_DKLEN = 32

SESSION_COOKIE = "frogfix_session"
FLASH_COOKIE = "frogfix_flash"


# -- passwords --------------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def hash_password(password: str, *, salt: bytes | None = None) -> str:
    """`scrypt$N$r$p$salt$hash`: the parameters travel with the hash so they can be raised later."""
    salt = salt or secrets.token_bytes(16)
    digest = hashlib.scrypt(
        password.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, dklen=SCRYPT_DKLEN, maxmem=64 * 1024 * 1024
    )
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${_b64(salt)}${_b64(digest)}"


def check_password(password: str, stored: str) -> bool:
    """Constant-time comparison against a stored hash; a malformed hash never matches."""
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        expected = _unb64(digest)
        actual = hashlib.scrypt(
            password.encode()[: MAX_PASSWORD_LENGTH * 4],
            salt=_unb64(salt),
            n=int(n),
            r=int(r),
            p=int(p),
            dklen=len(expected),
            maxmem=64 * 1024 * 1024,
        )
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(actual, expected)


# A hash to check against when the username is unknown, so both failures take the same time.
_DUMMY_HASH = hash_password("not-a-real-password", salt=b"frogfix-dummy-salt")


def validate_new_credentials(username: str, password: str) -> None:
    """Raise ValueError with the reason when a username or password is not acceptable."""
    if not USERNAME_PATTERN.match(username):
        raise ValueError(
            "a username is 1 to 64 characters: letters, digits and . _ @ - (starting with a letter or digit)"
        )
    if len(password) < MIN_PASSWORD_LENGTH:
        raise ValueError(f"the password is too short: use at least {MIN_PASSWORD_LENGTH} characters")
    if len(password) > MAX_PASSWORD_LENGTH:
        raise ValueError(f"the password is too long: at most {MAX_PASSWORD_LENGTH} characters")
    if password.strip() == "" or len(set(password)) < 4:
        raise ValueError("the password is too weak: use a passphrase with more than a few distinct characters")
    if password.casefold() == username.casefold():
        raise ValueError("the password must not be the username")


def create_operator(session: Session, username: str, password: str) -> None:
    """Add an operator account; ValueError (with the reason) on a taken username or a weak password.

    The caller owns the transaction, as with app/jobs/.
    """
    validate_new_credentials(username, password)
    if get_operator(session, username) is not None:
        raise ValueError(f"an operator named {username!r} already exists")
    session.add(Operator(username=username, password_hash=hash_password(password), created_at=utcnow()))
    try:
        session.flush()
    except IntegrityError as exc:  # a concurrent create won the race; the caller's transaction rolls back
        raise ValueError(f"an operator named {username!r} already exists") from exc


def set_password(session: Session, username: str, password: str) -> None:
    """Replace an operator's password; every session signed for the old one stops working."""
    validate_new_credentials(username, password)
    done = cast(
        CursorResult[Any],
        session.execute(
            update(Operator).where(Operator.username == username).values(password_hash=hash_password(password))
        ),
    )
    if not done.rowcount:
        raise ValueError(f"no operator named {username!r}")


class LastOperator(ValueError):
    """Removing this operator would leave nobody who can sign in to the dashboard."""


def list_operators(session: Session) -> list[Operator]:
    """Every operator account, by name."""
    return list(session.execute(select(Operator).order_by(Operator.username)).scalars())


def remove_operator(session: Session, username: str) -> None:
    """Delete an operator (its sessions end with it: they carry its password's fingerprint); ValueError for an
    unknown name, LastOperator for the last one. Every row is locked first (PostgreSQL), so two removals at
    once cannot each leave the other as the last and remove it too."""
    names = list(session.execute(select(Operator.username).with_for_update()).scalars())
    if username not in names:
        raise ValueError(f"no operator named {username!r}")
    if len(names) == 1:
        raise LastOperator(f"{username} is the last operator: create another first (create-admin), "
                           "or nobody could sign in to the dashboard")
    session.execute(delete(Operator).where(Operator.username == username))


def get_operator(session: Session, username: str) -> Operator | None:
    return session.execute(select(Operator).where(Operator.username == username)).scalar_one_or_none()


def verify_operator(session: Session, username: str, password: str) -> Operator | None:
    """The operator when the password is right (and its last sign-in is stamped), else None.

    Unknown usernames cost a hash too, so timing does not tell which usernames exist.
    """
    if len(password) > MAX_PASSWORD_LENGTH or len(username) > 64:
        check_password(password[:MAX_PASSWORD_LENGTH], _DUMMY_HASH)
        return None
    operator = get_operator(session, username)
    if operator is None:
        check_password(password, _DUMMY_HASH)
        return None
    if not check_password(password, operator.password_hash):
        return None
    operator.last_login_at = utcnow()
    return operator


def password_fingerprint(key: bytes, password_hash: str) -> str:
    """A short value that changes when the password does; sessions carry it (never the hash)."""
    return _b64(hmac.new(key, b"pw:" + password_hash.encode(), hashlib.sha256).digest()[:12])


# -- the secret key ---------------------------------------------------------------------------

_key_lock = threading.Lock()
_key_cache: dict[str, bytes] = {}


def secret_key(settings: Settings) -> bytes:
    """FROGFIX_SECRET_KEY, else a key generated once and kept in data_dir/secret_key (mode 0600)."""
    configured = settings.secret_key.get_secret_value()
    if configured:
        return hashlib.sha256(b"frogfix-secret-key:" + configured.encode()).digest()
    path = settings.data_dir / "secret_key"
    cache_key = str(path)
    with _key_lock:
        if cache_key not in _key_cache:
            _key_cache[cache_key] = _load_or_create_key(path)
        return _key_cache[cache_key]


def _load_or_create_key(path: Path) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        for _ in range(50):  # another process may be writing it right now
            text = path.read_text().strip()
            if text:
                return bytes.fromhex(text)
            time.sleep(0.02)
        raise RuntimeError(f"{path} is empty; delete it to generate a new key") from None
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_hex(32) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    return bytes.fromhex(path.read_text().strip())


# -- signed values: sessions, CSRF tokens, flash messages --------------------------------------


def sign(key: bytes, purpose: str, payload: dict[str, object]) -> str:
    """`payload.signature`, both URL-safe; the purpose keeps a value signed for one use from another."""
    body = _b64(json.dumps(payload, separators=(",", ":"), sort_keys=True).encode())
    mac = hmac.new(key, f"{purpose}|{body}".encode(), hashlib.sha256).digest()
    return f"{body}.{_b64(mac)}"


def unsign(key: bytes, purpose: str, value: str | None) -> dict[str, object] | None:
    if not value or value.count(".") != 1 or len(value) > 4096:
        return None
    body, mac = value.split(".")
    expected = hmac.new(key, f"{purpose}|{body}".encode(), hashlib.sha256).digest()
    try:
        if not hmac.compare_digest(_unb64(mac), expected):
            return None
        data = json.loads(_unb64(body))
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


@dataclass(frozen=True)
class SessionData:
    """What a session cookie says: who (None before sign-in), a random id, when, and how."""

    sid: str
    user: str | None
    issued_at: int
    source: str = "password"  # "password", "proxy" or "anonymous"
    fingerprint: str = ""

    @property
    def signed_in(self) -> bool:
        return self.user is not None


def new_session(user: str | None, source: str, fingerprint: str = "") -> SessionData:
    """A fresh session id every time: signing in never keeps the id the sign-in page was given."""
    return SessionData(secrets.token_urlsafe(18), user, int(time.time()), source, fingerprint)


def encode_session(key: bytes, data: SessionData) -> str:
    return sign(key, "session", {"s": data.sid, "u": data.user, "t": data.issued_at, "k": data.source,
                                 "f": data.fingerprint})


def decode_session(key: bytes, value: str | None, max_age: int, now: float | None = None) -> SessionData | None:
    """The session, or None when the cookie is missing, forged or older than `max_age` seconds."""
    data = unsign(key, "session", value)
    if data is None:
        return None
    sid, user, issued, source, fp = data.get("s"), data.get("u"), data.get("t"), data.get("k"), data.get("f", "")
    if not isinstance(sid, str) or not isinstance(issued, int) or not isinstance(source, str):
        return None
    if user is not None and not isinstance(user, str):
        return None
    if not isinstance(fp, str):
        return None
    age = (now if now is not None else time.time()) - issued
    if age > max_age or age < -300:
        return None
    return SessionData(sid, user, issued, source, fp)


def csrf_token(key: bytes, session: SessionData) -> str:
    """The token forms must send back; bound to the session id, so another session's token fails."""
    return _b64(hmac.new(key, f"csrf|{session.sid}".encode(), hashlib.sha256).digest())


def check_csrf(key: bytes, session: SessionData | None, token: str | None) -> bool:
    if session is None or not token:
        return False
    return hmac.compare_digest(token.encode(), csrf_token(key, session).encode())


# -- sign-in throttling -------------------------------------------------------------------------


class LoginThrottle:
    """At most `limit` failed sign-ins per username (and per client address) in `window` seconds.

    In memory, per process: enough to make guessing slow; a locked-out name frees itself.
    """

    def __init__(self, limit: int = 10, window: float = 300.0) -> None:
        self.limit = limit
        self.window = window
        self._failures: dict[str, list[float]] = {}
        self._lock = threading.Lock()

    def _recent(self, key: str, now: float) -> list[float]:
        kept = [t for t in self._failures.get(key, []) if now - t < self.window]
        if kept:
            self._failures[key] = kept
        else:
            self._failures.pop(key, None)
        return kept

    def blocked(self, *keys: str) -> bool:
        now = time.monotonic()
        with self._lock:
            return any(len(self._recent(k, now)) >= self.limit for k in keys)

    def failed(self, *keys: str) -> None:
        now = time.monotonic()
        with self._lock:
            if len(self._failures) > 10_000:  # bounded memory under a spray of names
                self._failures.clear()
            for key in keys:
                self._failures.setdefault(key, []).append(now)

    def succeeded(self, *keys: str) -> None:
        with self._lock:
            for key in keys:
                self._failures.pop(key, None)
