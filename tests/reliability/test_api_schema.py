"""schemathesis over the served OpenAPI schema (uvicorn on 127.0.0.1, admin token): no operation
answers 5xx to any input the schema allows or nearly allows."""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable

from app.migrate import upgrade
from tests.conftest import ADMIN_TOKEN, configure
from tests.servers import uvicorn_app
from tests.webhook_requests import gitea_headers, gitlab_headers, payload

schemathesis = pytest.importorskip("schemathesis")  # a dev extra (pyproject's [dev])
requests = pytest.importorskip("requests")
GenerationMode = schemathesis.GenerationMode

pytestmark = pytest.mark.timeout(180)

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
EXAMPLES_PER_OPERATION = 100
BUDGET_S = 90.0  # all operations together (about 10 s on a quiet runner); running past it fails the test, never skips


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, frogfix_env: dict[str, Any]) -> str:
    if request.param == "postgres":
        pg = request.getfixturevalue("pg")
        url = pg.create_database("reliability_schema")
        configure(frogfix_env["monkeypatch"], database_url=url)
        upgrade(url)
    return str(request.param)


INT32 = 2**31 - 1
INT64 = 2**63 - 1


def test_ids_offsets_and_filters_the_database_cannot_hold_are_not_5xx(database: str) -> None:
    from fastapi.testclient import TestClient

    from app.web.main import create_app

    with TestClient(create_app(run_sweep=False), raise_server_exceptions=False) as client:
        codes = [
            client.get(url, headers=AUTH).status_code
            for url in (
                "/api/jobs/2147483648",
                "/api/jobs/99999999999999999999",
                "/api/jobs?offset=9223372036854775808",
                "/api/jobs?project=a%00b",
                "/jobs/2147483648",
                "/jobs?q=a%00b",
            )
        ]
    assert codes[:4] == [422] * 4, codes  # a clear refusal, never a 500 (the dashboard ones redirect to sign-in)
    assert max(codes) < 500, codes


def test_no_operation_answers_5xx(database: str) -> None:
    from app.web.main import create_app

    with uvicorn_app(create_app(run_sweep=False)) as base:
        seeded = requests.post(
            f"{base}/webhooks/gitlab", data=payload("gitlab_label_added.json"), headers=gitlab_headers(), timeout=10
        )
        gitea = payload("gitea_label_updated.json")
        seeded_gitea = requests.post(f"{base}/webhooks/gitea", data=gitea, headers=gitea_headers(gitea), timeout=10)
        assert (seeded.status_code, seeded_gitea.status_code) == (202, 202)  # jobs 1 and 2 exist for the id routes
        assert requests.get(f"{base}/openapi.json", timeout=10).status_code == 401

        schema = schemathesis.openapi.from_url(f"{base}/openapi.json", headers=AUTH, timeout=10)
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) >= 5
        http = requests.Session()
        failures: list[str] = []
        calls = 0
        started = time.monotonic()

        def checker(strategy: Any, label: str) -> Any:
            @settings(
                max_examples=EXAMPLES_PER_OPERATION,
                deadline=None,
                database=None,
                derandomize=True,  # the same cases on every run: CI must not flake
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @given(case=strategy)
            def check(case: Any) -> None:
                nonlocal calls
                response = case.call(base_url=base, session=http, headers=AUTH, timeout=10)
                calls += 1
                if response.status_code >= 500:
                    failures.append(
                        f"{label}: {response.status_code} for path={case.path_parameters} "
                        f"query={case.query} body={str(case.body)[:200]}: {response.text[:200]}"
                    )

            return check

        for operation, mode in [(op, m) for op in operations for m in GenerationMode]:
            if time.monotonic() - started > BUDGET_S:
                failures.append(f"out of time before {operation.label} ({mode})")
                break

            check = checker(operation.as_strategy(generation_mode=mode), f"{operation.label} ({mode})")
            try:
                check()
            except Unsatisfiable:  # nothing to break: an operation without parameters has no negative cases
                assert mode == GenerationMode.NEGATIVE, operation.label
        print(
            f"\nschemathesis ({database}): {len(operations)} operations, {calls} calls, "
            f"{time.monotonic() - started:.1f}s"
        )
    assert not failures, "\n".join(failures[:20])
