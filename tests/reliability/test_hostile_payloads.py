"""Hostile webhook payloads through the real endpoints (uvicorn on 127.0.0.1, SQLite and PostgreSQL).

Every delivery is signed correctly, so the parser and the database see it: each must answer 2xx
or 4xx, never 5xx, and nothing malformed may create a job. Duplicated JSON keys: the last one
wins, as in Ruby (GitLab), Go (Gitea) and JavaScript, and the signature covers the exact bytes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest
from sqlalchemy import func, select

from app.db import session_scope
from app.migrate import upgrade
from app.models import Job, WebhookDelivery
from tests.conftest import configure
from tests.reliability.rawhttp import Connection
from tests.servers import uvicorn_app
from tests.webhook_requests import gitea_headers, gitlab_headers

pytestmark = pytest.mark.timeout(120)

MIB = 1024 * 1024


def gitlab_doc(**attrs: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "object_kind": "issue",
        "user": {"username": "dana"},
        "project": {"id": 42, "path_with_namespace": "acme/calc", "git_http_url": "https://git.test/acme/calc.git"},
        "object_attributes": {"iid": 7, "state": "opened", "action": "update", "title": "t", "description": "d"},
        "labels": [{"title": "frognano-fix"}],
        "changes": {"labels": {"previous": [], "current": [{"title": "frognano-fix"}]}},
    }
    doc["object_attributes"].update(attrs)
    return doc


def gitea_doc(**issue: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "action": "label_updated",
        "number": 7,
        "issue": {"number": 7, "title": "t", "body": "b", "state": "open", "labels": [{"name": "frognano-fix"}]},
        "repository": {"id": 1, "full_name": "acme/calc", "clone_url": "https://gitea.test/acme/calc.git"},
        "sender": {"login": "dana"},
    }
    doc["issue"].update(issue)
    return doc


def with_(doc: dict[str, Any], edit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    edit(doc)
    return doc


def dumps(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def nested(depth: int, inner: str = "1") -> str:
    return '{"a":' * depth + inner + "}" * depth


@dataclass
class Case:
    name: str
    forge: str  # gitlab or gitea
    body: bytes
    headers: dict[str, str] | None = None  # extra or overriding headers
    valid: bool = False  # True: well-formed (if odd), so it may create a job; False: it must not


def gitlab_cases() -> list[Case]:
    g = "gitlab"
    huge = "x" * (MIB - 4096)
    return [
        Case("huge description inside 1 MiB", g, dumps(gitlab_doc(description=huge)), valid=True),
        Case("huge title inside 1 MiB", g, dumps(gitlab_doc(title=huge)), valid=True),
        Case(
            "huge project path",
            g,
            dumps(with_(gitlab_doc(), lambda d: d["project"].update(path_with_namespace="a/" + huge))),
        ),
        Case("huge key", g, dumps({**gitlab_doc(), huge: 1}), valid=True),
        Case("many keys", g, dumps({**gitlab_doc(), **{f"k{i}": i for i in range(40_000)}}), valid=True),
        Case("one byte over 1 MiB", g, b" " * (MIB + 1)),
        Case("10,000 levels of objects", g, nested(10_000).encode()),
        Case("10,000 levels of arrays", g, ("[" * 10_000 + "]" * 10_000).encode()),
        Case("10,000 levels inside the issue", g, dumps(gitlab_doc()).replace(b'"d"', nested(10_000).encode())),
        Case("non-UTF-8 bytes", g, dumps(gitlab_doc()).replace(b'"t"', b'"\xff\xfe\xc3("')),
        Case("Latin-1 body", g, json.dumps(gitlab_doc(title="café"), ensure_ascii=False).encode("latin-1")),
        Case("raw NUL byte in a string", g, dumps(gitlab_doc()).replace(b'"t"', b'"a\x00b"')),
        Case("NUL outside strings", g, dumps(gitlab_doc()) + b"\x00"),
        Case(
            "escaped NUL in title and description",
            g,
            dumps(gitlab_doc(title="a\0b", description="\0" * 50)),
            valid=True,
        ),
        Case(
            "escaped NUL in username",
            g,
            dumps(with_(gitlab_doc(), lambda d: d["user"].update(username="da\0na"))),
            valid=True,
        ),
        Case("escaped NUL in action", g, dumps(gitlab_doc(action="up\0date")), valid=True),
        Case(
            "escaped NUL in project path",
            g,
            dumps(with_(gitlab_doc(), lambda d: d["project"].update(path_with_namespace="acme/ca\0lc"))),
        ),
        Case("lone surrogate in title", g, dumps(gitlab_doc()).replace(b'"t"', b'"\\ud800"'), valid=True),
        Case("lone low surrogate in description", g, dumps(gitlab_doc()).replace(b'"d"', b'"x\\udfff"'), valid=True),
        Case("lone surrogate in username", g, dumps(gitlab_doc()).replace(b'"dana"', b'"\\udbff"'), valid=True),
        Case("lone surrogate in action", g, dumps(gitlab_doc()).replace(b'"update"', b'"\\ud800"'), valid=True),
        Case(
            "lone surrogate in a label",
            g,
            dumps(gitlab_doc()).replace(b'"frognano-fix"}]}', b'"\\ud800"}]}'),
            valid=True,
        ),
        Case("lone surrogate in project path", g, dumps(gitlab_doc()).replace(b'"acme/calc"', b'"acme/\\ud800"')),
        Case("lone surrogate in object_kind", g, dumps(gitlab_doc()).replace(b'"issue"', b'"\\ud800"'), valid=True),
        Case("iid 1e400", g, dumps(gitlab_doc()).replace(b'"iid": 7', b'"iid": 1e400')),
        Case("iid -1e400", g, dumps(gitlab_doc()).replace(b'"iid": 7', b'"iid": -1e400')),
        Case("iid NaN", g, dumps(gitlab_doc()).replace(b'"iid": 7', b'"iid": NaN')),
        Case("iid true", g, dumps(gitlab_doc(iid=True))),
        Case("iid 7.0", g, dumps(gitlab_doc(iid=7.0))),
        Case("iid 2**31", g, dumps(gitlab_doc(iid=2**31))),
        Case("iid 10**30", g, dumps(gitlab_doc(iid=10**30))),
        Case("iid with 5000 digits", g, dumps(gitlab_doc()).replace(b'"iid": 7', b'"iid": ' + b"9" * 5000)),
        Case("iid as a string", g, dumps(gitlab_doc(iid="7"))),
        Case("iid 0", g, dumps(gitlab_doc(iid=0))),
        Case("iid negative", g, dumps(gitlab_doc(iid=-7))),
        Case("title 1e400", g, dumps(gitlab_doc()).replace(b'"t"', b"1e400"), valid=True),
        Case(
            "labels a string",
            g,
            dumps(
                with_(
                    gitlab_doc(),
                    lambda d: d.update(
                        labels="frognano-fix", changes={"labels": {"previous": [], "current": "frognano-fix"}}
                    ),
                )
            ),
        ),
        Case(
            "labels an object",
            g,
            dumps(
                with_(
                    gitlab_doc(),
                    lambda d: d.update(
                        labels={"title": "frognano-fix"},
                        changes={"labels": {"previous": {}, "current": {"title": "frognano-fix"}}},
                    ),
                )
            ),
        ),
        Case(
            "label titles not strings",
            g,
            dumps(
                with_(
                    gitlab_doc(),
                    lambda d: d.update(
                        labels=[{"title": ["frognano-fix"]}],
                        changes={"labels": {"previous": None, "current": [{"title": {"x": 1}}, 5, None]}},
                    ),
                )
            ),
        ),
        Case(
            "path ../",
            g,
            dumps(with_(gitlab_doc(), lambda d: d["project"].update(path_with_namespace="../../etc/passwd"))),
        ),
        Case(
            "path with ../ inside",
            g,
            dumps(with_(gitlab_doc(), lambda d: d["project"].update(path_with_namespace="acme/../../admin"))),
        ),
        Case("path ..", g, dumps(with_(gitlab_doc(), lambda d: d["project"].update(path_with_namespace="..")))),
        Case(
            "path with a newline",
            g,
            dumps(with_(gitlab_doc(), lambda d: d["project"].update(path_with_namespace="acme/calc\nx"))),
        ),
        Case("project not an object", g, dumps(with_(gitlab_doc(), lambda d: d.update(project="acme/calc")))),
        Case("object_attributes a list", g, dumps(with_(gitlab_doc(), lambda d: d.update(object_attributes=[7])))),
        Case("top level a list", g, dumps([gitlab_doc()])),
        Case("empty body", g, b""),
        Case("long event header", g, dumps(gitlab_doc()), {"X-Gitlab-Event": "Issue Hook" + " " * 8000 + "x"}),
        Case("long delivery header", g, dumps(gitlab_doc(iid=8)), {"Idempotency-Key": "k" * 8000}, valid=True),
        Case("header over 64 KiB", g, dumps(gitlab_doc(iid=10)), {"X-Filler": "f" * 70_000}, valid=True),
        Case(
            "Latin-1 header bytes",
            g,
            dumps(gitlab_doc(iid=9)),
            {"Idempotency-Key": "d\u00e9j\u00e0-\u00ff"},
            valid=True,
        ),
        Case("long content type", g, dumps(gitlab_doc()), {"Content-Type": "application/" + "j" * 8000}),
    ]


def gitea_cases() -> list[Case]:
    t = "gitea"
    huge = "y" * (MIB - 4096)
    return [
        Case("huge body inside 1 MiB", t, dumps(gitea_doc(body=huge)), valid=True),
        Case("huge full_name", t, dumps(with_(gitea_doc(), lambda d: d["repository"].update(full_name="a/" + huge)))),
        Case("10,000 levels of objects", t, nested(10_000).encode()),
        Case("10,000 levels inside the issue", t, dumps(gitea_doc()).replace(b'"b"', nested(10_000).encode())),
        Case("non-UTF-8 bytes", t, dumps(gitea_doc()).replace(b'"t"', b'"\x80\x80"')),
        Case("raw NUL byte", t, dumps(gitea_doc()).replace(b'"t"', b'"\x00"')),
        Case(
            "escaped NUL in title, body, login",
            t,
            dumps(with_(gitea_doc(title="\0", body="a\0"), lambda d: d["sender"].update(login="\0"))),
            valid=True,
        ),
        Case(
            "escaped NUL in full_name",
            t,
            dumps(with_(gitea_doc(), lambda d: d["repository"].update(full_name="acme/\0"))),
        ),
        Case(
            "lone surrogates everywhere",
            t,
            dumps(gitea_doc()).replace(b'"t"', b'"\\ud800"').replace(b'"dana"', b'"\\udc00"'),
            valid=True,
        ),
        Case(
            "lone surrogate in clone_url",
            t,
            dumps(gitea_doc()).replace(b'"https://gitea.test/acme/calc.git"', b'"\\ud800"'),
            valid=True,
        ),
        Case("lone surrogate in full_name", t, dumps(gitea_doc()).replace(b'"acme/calc"', b'"acme/\\ud800"')),
        Case("number 1e400", t, dumps(gitea_doc()).replace(b'"number": 7', b'"number": 1e400')),
        Case("number Infinity", t, dumps(gitea_doc()).replace(b'"number": 7', b'"number": Infinity')),
        Case("number false", t, dumps(gitea_doc(number=False))),
        Case("number 7.5", t, dumps(gitea_doc(number=7.5))),
        Case("number 10**30", t, dumps(gitea_doc(number=10**30))),
        Case("labels a string", t, dumps(with_(gitea_doc(labels="frognano-fix"), lambda d: None))),
        Case("labels an object", t, dumps(gitea_doc(labels={"name": "frognano-fix"}))),
        Case("label names not strings", t, dumps(gitea_doc(labels=[{"name": ["frognano-fix"]}, 3, None]))),
        Case("full_name ../", t, dumps(with_(gitea_doc(), lambda d: d["repository"].update(full_name="../../etc")))),
        Case(
            "full_name with ../ inside",
            t,
            dumps(with_(gitea_doc(), lambda d: d["repository"].update(full_name="acme/../admin"))),
        ),
        Case("action 1e400", t, dumps(gitea_doc()).replace(b'"label_updated"', b"1e400")),
        Case("long signature header", t, dumps(gitea_doc()), {"X-Gitea-Signature": "0" * 8000}),
        Case("long delivery header", t, dumps(gitea_doc(number=8)), {"X-Gitea-Delivery": "d" * 8000}, valid=True),
        Case(
            "form body with a deep payload",
            t,
            b"payload=" + nested(10_000).encode(),
            {"Content-Type": "application/x-www-form-urlencoded"},
        ),
        Case("form body not UTF-8", t, b"payload=\xff", {"Content-Type": "application/x-www-form-urlencoded"}),
    ]


def signed(case: Case) -> tuple[str, dict[str, str]]:
    headers = gitlab_headers() if case.forge == "gitlab" else gitea_headers(case.body)
    headers.update(case.headers or {})
    if case.forge == "gitea" and case.headers and "X-Gitea-Signature" in case.headers:
        pass  # the case sets its own (bad) signature
    return f"/webhooks/{case.forge}", headers


def _count(model: Any) -> int:
    with session_scope() as s:
        return int(s.execute(select(func.count()).select_from(model)).scalar_one())


async def _send(port: int, path: str, body: bytes, headers: dict[str, str]) -> int | str:
    conn = Connection("127.0.0.1", port)
    try:
        return (await conn.post(path, body, headers, timeout=30)).status
    except (TimeoutError, OSError, asyncio.IncompleteReadError) as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        await conn.close()


@pytest.fixture(params=["sqlite", "postgres"])
def served(request: pytest.FixtureRequest, frogfix_env: dict[str, Any]) -> Any:
    if request.param == "postgres":
        pg = request.getfixturevalue("pg")
        url = pg.create_database("reliability_hostile")
        configure(frogfix_env["monkeypatch"], database_url=url)
        upgrade(url)
    from app.web.main import create_app

    with uvicorn_app(create_app(run_sweep=False)) as base:
        yield int(urlsplit(base).port or 0)


@pytest.mark.parametrize("cases", [gitlab_cases, gitea_cases], ids=["gitlab", "gitea"])
def test_hostile_payloads_never_5xx_and_malformed_never_make_a_job(
    served: int, cases: Callable[[], list[Case]]
) -> None:
    problems: list[str] = []
    for case in cases():
        path, headers = signed(case)
        jobs_before = _count(Job)
        status = asyncio.run(_send(served, path, case.body, headers))
        made_job = _count(Job) > jobs_before
        if not isinstance(status, int) or not (200 <= status < 500):
            problems.append(f"{case.forge} {case.name}: answered {status}")
        elif made_job and not case.valid:
            problems.append(f"{case.forge} {case.name}: malformed but made a job ({status})")
        if made_job:  # leave no active job behind, so the next valid case can make one again
            with session_scope() as s:
                s.execute(Job.__table__.update().values(status="failed"))
    assert not problems, "\n".join(problems)


def test_duplicated_keys_last_wins_and_the_signature_covers_the_exact_bytes(served: int) -> None:
    # GitLab: the token is not a signature; the parser reads the last `object_kind`.
    body = dumps(gitlab_doc())
    note_last = b'{"object_kind": "issue", ' + body[1:-1] + b', "object_kind": "note"}'
    issue_last = b'{"object_kind": "note", ' + body[1:-1] + b', "object_kind": "issue"}'
    assert asyncio.run(_send(served, "/webhooks/gitlab", note_last, gitlab_headers())) == 200
    assert _count(Job) == 0
    assert asyncio.run(_send(served, "/webhooks/gitlab", issue_last, gitlab_headers())) == 202
    assert _count(Job) == 1

    # Gitea: the HMAC of one ordering does not verify the other, so nobody can swap which key wins.
    doc = dumps(gitea_doc(number=9))
    closed_last = (
        b'{"action": "label_updated", '
        + doc[1:-1].replace(b'"action": "label_updated", ', b"")
        + b', "action": "closed"}'
    )
    start_last = (
        b'{"action": "closed", '
        + doc[1:-1].replace(b'"action": "label_updated", ', b"")
        + b', "action": "label_updated"}'
    )
    forged = gitea_headers(closed_last)
    assert asyncio.run(_send(served, "/webhooks/gitea", start_last, forged)) == 401
    assert asyncio.run(_send(served, "/webhooks/gitea", closed_last, gitea_headers(closed_last))) == 200
    assert _count(Job) == 1
    assert asyncio.run(_send(served, "/webhooks/gitea", start_last, gitea_headers(start_last))) == 202
    assert _count(Job) == 2
    assert _count(WebhookDelivery) == 4  # the forged one is recorded nowhere


def test_nul_and_lone_surrogates_are_stored_as_replacement_characters(served: int) -> None:
    # Regression: PostgreSQL answered 503 (NUL in text) and both databases 500 (lone surrogates).
    body = dumps(gitlab_doc(title="a\0b")).replace(b'"d"', b'"x\\ud800y"')
    assert b"\\ud800" in body and b"\\u0000" in body
    assert asyncio.run(_send(served, "/webhooks/gitlab", body, gitlab_headers())) == 202
    with session_scope() as s:
        title, text = s.execute(select(Job.title, Job.body)).one()
    assert (title, text) == ("a\ufffdb", "x\ufffdy")
