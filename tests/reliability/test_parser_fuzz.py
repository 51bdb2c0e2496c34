"""Fuzzing the pure parsers directly: the webhook parsers only ever raise WebhookError subclasses,
and the text tool-call reader never raises and returns only well-formed calls."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from dataclasses import fields
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from app.forge.gitea_webhook import parse_gitea
from app.forge.gitlab_webhook import parse_gitlab, standard_webhook_signature
from app.forge.webhook import WebhookError, WebhookEvent, WebhookMalformed, project_path
from app.textcalls import (
    CLOSE_CALL,
    CLOSE_FUNCTION,
    CLOSE_PARAM,
    CLOSE_THINK,
    OPEN_CALL,
    OPEN_THINK,
    TextCall,
    extract_text_calls,
    parse_tool_calls,
)

pytestmark = pytest.mark.timeout(120)

SECRET = "fuzz-secret"
SIGNING = "whsec_" + base64.b64encode(b"standard-webhooks-key").decode()
# derandomize: the same examples on every run, so CI cannot flake; raise max_examples to explore locally.
fuzz = settings(
    max_examples=300, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)

# Text as JSON carries it: NUL, lone surrogates and the rest.
odd_text = st.text(max_size=12) | st.sampled_from(["\x00", "\ud800", "a\udfffb", "../..", "", " ", "frognano-fix"])
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**31 - 2, max_value=2**70)
    | st.floats()
    | odd_text
)
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(odd_text, children, max_size=4),
    max_leaves=15,
)
label_list = st.lists(
    st.fixed_dictionaries({}, optional={"title": odd_text | values, "name": odd_text | values}) | values, max_size=3
)
attrs = st.fixed_dictionaries(
    {},
    optional={
        "iid": scalars,
        "state": st.sampled_from(["opened", "closed"]) | values,
        "action": st.sampled_from(["open", "update", "close"]) | values,
        "confidential": values,
        "title": values,
        "description": values,
        "labels": label_list | values,
        "url": values,
    },
)
project = st.fixed_dictionaries(
    {}, optional={"path_with_namespace": odd_text | values, "full_name": odd_text | values, "id": values}
)
gitlab_doc = st.fixed_dictionaries(
    {"object_kind": st.sampled_from(["issue", "note"]) | values},
    optional={
        "object_attributes": attrs | values,
        "project": project | values,
        "labels": label_list | values,
        "user": st.fixed_dictionaries({}, optional={"username": values}) | values,
        "changes": st.fixed_dictionaries(
            {}, optional={"labels": st.fixed_dictionaries({}, optional={"previous": label_list, "current": label_list})}
        )
        | values,
    },
)
gitea_doc = st.fixed_dictionaries(
    {"action": st.sampled_from(["opened", "label_updated", "label_cleared", "closed"]) | values},
    optional={
        "number": scalars,
        "issue": st.fixed_dictionaries(
            {},
            optional={
                "number": scalars,
                "labels": label_list | values,
                "state": values,
                "pull_request": values,
                "title": values,
                "body": values,
            },
        )
        | values,
        "repository": project | values,
        "sender": st.fixed_dictionaries({}, optional={"login": values, "username": values}) | values,
    },
)


def mangle(data: bytes, cut: int, junk: bytes) -> bytes:
    """Broken JSON: a prefix, some junk, the rest."""
    cut = cut % (len(data) + 1)
    return data[:cut] + junk + data[cut:]


def bodies(docs: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    encoded = docs.map(lambda d: json.dumps(d).encode())
    return st.one_of(
        st.binary(max_size=200),
        encoded,
        encoded.map(lambda b: b.replace(b'"', b'"\\ud800', 1)),
        st.builds(mangle, encoded, st.integers(0, 10_000), st.binary(max_size=6)),
        st.integers(1, 3000).map(lambda n: ("[" * n + "]" * n).encode()),
        encoded.map(lambda b: b"payload=" + b),
    )


# Header values as Starlette hands them over: latin-1 text without CR or LF.
header_text = st.text(
    alphabet=st.characters(min_codepoint=1, max_codepoint=255, exclude_characters="\r\n"), max_size=30
)
content_types = (
    st.sampled_from(
        [
            "application/json",
            "application/json; charset=utf-8",
            "text/json",
            "application/vnd+json",
            "application/x-www-form-urlencoded",
            "text/plain",
            "",
        ]
    )
    | header_text
)


def check_event(event: WebhookEvent, forge: str) -> None:
    assert event.forge == forge
    assert event.intent in ("start", "cancel", "recheck", "ignore")
    assert event.issue is None or (type(event.issue) is int and 0 < event.issue < 2**31)
    if event.intent != "ignore":
        assert event.project is not None and event.issue is not None
    if event.project is not None:
        assert project_path(event.project, "project") == event.project
    for f in fields(event):
        value = getattr(event, f.name)
        for text in value if isinstance(value, tuple) else (value,):
            if isinstance(text, str) and f.name != "labels":
                assert "\x00" not in text, f.name
                text.encode("utf-8")  # no lone surrogates: the database must be able to store it


def run_parser(parse: Any, forge: str) -> None:
    try:
        event = parse()
    except WebhookError:
        return
    check_event(event, forge)


@fuzz
@given(
    body=bodies(gitlab_doc),
    event=st.sampled_from(["Issue Hook", "Confidential Issue Hook", "Note Hook", ""]) | header_text,
    token=st.sampled_from([SECRET, "", "wrong"]) | header_text,
    content_type=content_types,
    extra=st.dictionaries(
        st.sampled_from(
            ["Idempotency-Key", "X-Gitlab-Event-UUID", "webhook-id", "webhook-timestamp", "webhook-signature"]
        ),
        header_text,
        max_size=3,
    ),
    standard=st.sampled_from(["off", "signed", "garbled"]),
    allow_confidential=st.booleans(),
)
@example(
    body=b'{"object_kind":"issue","object_attributes":{"iid":1,"action":"open"},"labels":[{"title":"frognano-fix"}],'
    b'"project":{"path_with_namespace":"a/\\u0000"}}',
    event="Issue Hook",
    token=SECRET,
    content_type="application/json",
    extra={},
    standard="off",
    allow_confidential=False,
)
def test_parse_gitlab_raises_only_webhook_errors(
    body: bytes,
    event: str,
    token: str,
    content_type: str,
    extra: dict[str, str],
    standard: str,
    allow_confidential: bool,
) -> None:
    headers = {"X-Gitlab-Event": event, "X-Gitlab-Token": token, "Content-Type": content_type, **extra}
    signing = ""
    now = time.time()
    if standard != "off":
        signing = SIGNING if standard == "signed" else "not base64 !!"
        msg_id, ts = extra.get("webhook-id", "msg_1") or "msg_1", str(int(now))
        headers.update({"webhook-id": msg_id, "webhook-timestamp": ts})
        if standard == "signed":
            headers["webhook-signature"] = standard_webhook_signature(SIGNING, msg_id, ts, body)
    run_parser(
        lambda: parse_gitlab(
            headers, body, secret=SECRET, signing_token=signing, allow_confidential=allow_confidential, now=now
        ),
        "gitlab",
    )


@fuzz
@given(
    body=bodies(gitea_doc),
    event=st.sampled_from(["issues", "issue_comment", ""]) | header_text,
    event_type=st.sampled_from(["issues", "issue_label", ""]) | header_text,
    signature=st.sampled_from(["good", "hub", "upper", "none"]) | header_text,
    content_type=content_types,
    delivery=st.none() | header_text,
)
def test_parse_gitea_raises_only_webhook_errors(
    body: bytes, event: str, event_type: str, signature: str, content_type: str, delivery: str | None
) -> None:
    good = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    headers = {"X-Gitea-Event": event, "X-Gitea-Event-Type": event_type, "Content-Type": content_type}
    if delivery is not None:
        headers["X-Gitea-Delivery"] = delivery
    if signature == "good":
        headers["X-Gitea-Signature"] = good
    elif signature == "hub":
        headers["X-Hub-Signature-256"] = "sha256=" + good
    elif signature == "upper":
        headers["X-Forgejo-Signature"] = " " + good.upper() + " "
    elif signature != "none":
        headers["X-Gitea-Signature"] = signature
    run_parser(lambda: parse_gitea(headers, body, secret=SECRET), "gitea")


@pytest.mark.parametrize(
    "path",
    ["../x", "a/../b", "a/./b", "/a/b", "a//b", "a/b/", "a/\x00", "a/\nb", "a/\ud800", "a/" + "b" * 300, "", " "],
)
def test_project_paths_no_forge_sends_are_refused(path: str) -> None:
    with pytest.raises(WebhookMalformed):
        project_path(path, "project")


def test_real_project_paths_pass() -> None:
    for path in ("acme/calc", "group/sub/sub2/app.name", "a-b_c/d.e", " acme/calc "):
        assert project_path(path, "project") == path.strip()


# --- app.textcalls ------------------------------------------------------------------------------

fragments = st.sampled_from(
    [
        OPEN_CALL,
        CLOSE_CALL,
        "<function=Edit>",
        "<function=Read>\n",
        "<function=",
        "<function=>",
        "<function= >",
        CLOSE_FUNCTION,
        "<parameter=file_path>",
        "<parameter=content>\n",
        "<parameter=",
        "<parameter=>",
        CLOSE_PARAM,
        OPEN_THINK,
        CLOSE_THINK,
        "\n",
        " ",
        ">",
        "<",
        "=",
        '{"name": "Read", "arguments": {"file_path": "a.py"}}',
        '{"name": "Bash", "arguments": "{\\"command\\": 1}"}',
        '{"name": ""}',
        '{"name": 3}',
        '{"arguments": []}',
        "{",
        "}",
        '"',
        "[" * 50,
        "\x00",
        "\ud800",
    ]
) | st.text(max_size=8)
reply_text = st.lists(fragments, max_size=30).map("".join)


def check_calls(calls: list[TextCall]) -> None:
    assert isinstance(calls, list)
    for call in calls:
        assert isinstance(call, TextCall)
        assert isinstance(call.name, str) and isinstance(call.arguments, dict)
        assert all(isinstance(k, str) for k in call.arguments)
        if call.error is None:
            assert call.name.strip(), call
            if not call.typed:
                assert all(isinstance(v, str) for v in call.arguments.values()), call
        else:
            assert isinstance(call.error, str) and call.error


@settings(max_examples=500, deadline=None, derandomize=True, database=None)
@given(content=st.none() | reply_text)
@example(content='<tool_call>\n{"name": "", "arguments": {}}\n</tool_call>')
@example(content="<tool_call>" + "[" * 100_000 + "</tool_call>")
def test_extract_text_calls_never_raises_and_returns_well_formed_calls(content: str | None) -> None:
    parsed = extract_text_calls(content)
    check_calls(parsed.calls)
    assert isinstance(parsed.visible, str)
    assert parsed.inline_reasoning is None or isinstance(parsed.inline_reasoning, str)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(text=reply_text)
def test_parse_tool_calls_never_raises(text: str) -> None:
    check_calls(parse_tool_calls(text))


def test_a_json_call_with_a_blank_name_is_an_error_not_a_call() -> None:
    for name in ('""', '"  "'):
        [call] = parse_tool_calls(f'<tool_call>\n{{"name": {name}, "arguments": {{}}}}\n</tool_call>')
        assert call.error is not None and "needs a" in call.error
