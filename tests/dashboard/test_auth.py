"""Operator accounts, password hashes, signed sessions, CSRF tokens and the secret key file."""

from __future__ import annotations

import stat
import time
from pathlib import Path
from typing import Any

import pytest

from app import auth
from app.db import session_scope
from app.models import Operator
from app.settings import get_settings
from tests.conftest import configure

KEY = b"k" * 32


def test_password_hashes_are_salted_scrypt_and_verify() -> None:
    one, two = auth.hash_password("correct horse battery"), auth.hash_password("correct horse battery")
    assert one != two and one.startswith("scrypt$16384$8$1$")
    assert auth.check_password("correct horse battery", one) and auth.check_password("correct horse battery", two)
    assert not auth.check_password("correct horse batterY", one)
    assert not auth.check_password("anything", "not-a-hash") and not auth.check_password("x", "md5$1$2$3$4$5")


def test_create_operator_stores_a_hash_and_verify_stamps_the_sign_in(frogfix_env: dict[str, Any]) -> None:
    with session_scope() as s:
        auth.create_operator(s, "alice", "correct horse battery")
    with session_scope() as s:
        row = s.query(Operator).one()
        assert row.username == "alice" and "correct horse" not in row.password_hash and row.last_login_at is None
        assert auth.verify_operator(s, "alice", "wrong password here") is None
        assert auth.verify_operator(s, "nobody", "correct horse battery") is None
        assert auth.verify_operator(s, "alice", "correct horse battery") is not None
    with session_scope() as s:
        assert s.query(Operator).one().last_login_at is not None


@pytest.mark.parametrize(
    ("username", "password", "reason"),
    [
        ("alice", "short", "too short"),
        ("alice", "aaaaaaaaaaaaaaaa", "too weak"),
        ("alice", "x" * 2000, "too long"),
        ("", "correct horse battery", "username"),
        ("bad name", "correct horse battery", "username"),
        ("alice-the-operator", "alice-the-operator", "must not be the username"),
    ],
)
def test_create_operator_refuses_weak_or_bad_credentials(
    frogfix_env: dict[str, Any], username: str, password: str, reason: str
) -> None:
    with session_scope() as s, pytest.raises(ValueError, match=reason):
        auth.create_operator(s, username, password)


def test_create_operator_refuses_a_duplicate(frogfix_env: dict[str, Any]) -> None:
    with session_scope() as s:
        auth.create_operator(s, "alice", "correct horse battery")
    with session_scope() as s, pytest.raises(ValueError, match="already exists"):
        auth.create_operator(s, "alice", "another long password")


def test_sessions_are_signed_and_expire() -> None:
    session = auth.new_session("alice", "password", "fp")
    value = auth.encode_session(KEY, session)
    assert auth.decode_session(KEY, value, 3600) == session
    assert auth.decode_session(b"x" * 32, value, 3600) is None  # another key
    body, mac = value.split(".")
    tampered = auth.sign(b"x" * 32, "session", {"s": "a", "u": "mallory", "t": int(time.time()), "k": "password"})
    assert auth.decode_session(KEY, tampered, 3600) is None
    assert auth.decode_session(KEY, body + "." + mac[:-2] + "AA", 3600) is None
    assert auth.decode_session(KEY, value, 3600, now=time.time() + 3601) is None  # expired
    assert auth.decode_session(KEY, "garbage", 3600) is None and auth.decode_session(KEY, None, 3600) is None
    # a value signed for another purpose (a flash message) is not a session
    assert auth.decode_session(KEY, auth.sign(KEY, "flash", {"s": "a", "u": "x", "t": 1, "k": "p"}), 3600) is None


def test_csrf_tokens_are_bound_to_their_session() -> None:
    mine, theirs = auth.new_session(None, "anonymous"), auth.new_session(None, "anonymous")
    token = auth.csrf_token(KEY, mine)
    assert auth.check_csrf(KEY, mine, token)
    assert not auth.check_csrf(KEY, theirs, token)
    assert not auth.check_csrf(KEY, mine, "") and not auth.check_csrf(KEY, mine, None)
    assert not auth.check_csrf(KEY, None, token)


def test_the_secret_key_is_generated_once_with_mode_0600(frogfix_env: dict[str, Any]) -> None:
    settings = get_settings()
    key = auth.secret_key(settings)
    path: Path = settings.data_dir / "secret_key"
    assert path.is_file() and stat.S_IMODE(path.stat().st_mode) == 0o600 and len(key) == 32
    auth._key_cache.clear()
    assert auth.secret_key(settings) == key  # read back, not regenerated
    configure(frogfix_env["monkeypatch"], secret_key="a-configured-secret-key-value")
    configured = auth.secret_key(get_settings())
    assert configured != key and len(configured) == 32
    assert "a-configured-secret-key-value" in get_settings().secret_values()


def test_the_login_throttle_blocks_after_repeated_failures() -> None:
    throttle = auth.LoginThrottle(limit=3, window=60)
    for _ in range(3):
        assert not throttle.blocked("user:a")
        throttle.failed("user:a", "addr:1")
    assert throttle.blocked("user:a") and throttle.blocked("addr:1") and not throttle.blocked("user:b")
    throttle.succeeded("user:a")
    assert not throttle.blocked("user:a")
