"""Property-based: random bodies and headers at both endpoints never produce a 500."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import GITEA_SECRET, GITLAB_SECRET

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)
issue_like = st.fixed_dictionaries(
    {"object_kind": st.sampled_from(["issue", "note", "merge_request", 3, None])},
    optional={
        "object_attributes": json_values
        | st.fixed_dictionaries(
            {
                "iid": st.integers() | st.text(max_size=3),
                "state": st.sampled_from(["opened", "closed", 1]),
                "action": st.sampled_from(["open", "update", "close", None]),
            }
        ),
        "project": json_values | st.fixed_dictionaries({"path_with_namespace": st.text(max_size=30) | st.integers()}),
        "labels": json_values | st.lists(st.fixed_dictionaries({"title": st.text(max_size=12)}), max_size=3),
        "changes": json_values,
        "user": json_values,
        "issue": json_values,
        "repository": json_values,
        "action": st.sampled_from(["opened", "label_updated", "label_cleared", "closed"]) | st.text(max_size=8),
    },
)
bodies = st.one_of(
    st.binary(max_size=300),
    json_values.map(lambda v: json.dumps(v).encode()),
    issue_like.map(lambda v: json.dumps(v).encode()),
)
header_text = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=40)
fuzz_settings = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@fuzz_settings
@given(
    body=bodies,
    event=st.sampled_from(["Issue Hook", "Confidential Issue Hook", "Note Hook"]) | header_text,
    good_token=st.booleans(),
    content_type=st.sampled_from(["application/json", "text/plain", ""]) | header_text,
    extra=st.dictionaries(
        st.sampled_from(
            ["Idempotency-Key", "X-Gitlab-Event-UUID", "webhook-signature", "webhook-id", "webhook-timestamp"]
        ),
        header_text,
        max_size=3,
    ),
)
def test_gitlab_endpoint_never_500(
    client: Any, body: bytes, event: str, good_token: bool, content_type: str, extra: dict[str, str]
) -> None:
    headers = {
        "X-Gitlab-Event": event,
        "X-Gitlab-Token": GITLAB_SECRET if good_token else "nope",
        "Content-Type": content_type,
        **extra,
    }
    r = client.post("/webhooks/gitlab", content=body, headers=headers)
    assert r.status_code in (200, 202, 400, 401, 413, 415), r.text
    if not good_token:
        assert r.status_code == 401


@fuzz_settings
@given(
    body=bodies,
    event=st.sampled_from(["issues", "issue_comment", "pull_request"]) | header_text,
    event_type=st.sampled_from(["issues", "issue_label", ""]) | header_text,
    good_sig=st.booleans(),
    content_type=st.sampled_from(["application/json", "application/x-www-form-urlencoded"]) | header_text,
)
def test_gitea_endpoint_never_500(
    client: Any, body: bytes, event: str, event_type: str, good_sig: bool, content_type: str
) -> None:
    sig = hmac.new(GITEA_SECRET.encode(), body, hashlib.sha256).hexdigest() if good_sig else "00" * 32
    headers = {
        "X-Gitea-Event": event,
        "X-Gitea-Event-Type": event_type,
        "X-Gitea-Signature": sig,
        "Content-Type": content_type,
    }
    r = client.post("/webhooks/gitea", content=body, headers=headers)
    assert r.status_code in (200, 202, 400, 401, 413, 415), r.text
    if not good_sig:
        assert r.status_code == 401
