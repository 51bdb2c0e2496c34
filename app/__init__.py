"""FrogFix's application core: what the web app, the worker and manage.py share.

Inside:
- settings.py (FROGFIX_* environment), db.py (engine and `session_scope`), logs.py, migrate.py
  (Alembic, migrations/ at the top level), auth.py (dashboard operators and signed cookies).
- statuses.py: the one list of job and attempt statuses, exit reasons and `fix` outcomes, their
  groups and the labels people read.
- usage.py: `UsageFigures`, the one shape of what a run cost (tokens, calls, steps, model and
  sandbox seconds), for trajectories, `fix --json`, the API, `show`, the pages and /metrics.
- textcalls.py: the one reader of tool calls a model wrote as text (qwen3_coder form, inline
  `<think>`): the agent loop runs what it reads and the trajectory page shows the same calls.
- endings.py: how a job ended, typed (`Ending`: an `EndingKind` and its detail and facts), made
  where the job ends and kept with it (`jobs.ending_kind`, `fix --json`'s `ending`).
- answers.py: one typed schema (pydantic) per answer about a job: a job, its detail, an attempt,
  the one `tests` shape, evidence, usage, an ending, `fix --json`'s object; the API's
  `response_model`s, and what `fix --json`, `jobs --json`, `show --json`, local job records and the
  dashboard read. Older stored shapes are read into these by its validators, nowhere else.
- outcome_words.py: a job's ending in plain words (why it failed, how its agent ended, what its
  tests said), for `fix`, `show` and the job page alike.
- moments.py: a moment in time, one way (aware, UTC, written ISO 8601 with its offset); the
  database's `UtcDateTime` column type (models.py) hands every datetime back that way.
- redaction.py: the one place a secret becomes `[REDACTED]`, for the logs, the forge's text,
  trajectories and job records.
- retrying.py: `RetryPolicy`, the one way a call is tried again (forge, model, git and database
  calls): attempts and seconds, backoff with jitter, Retry-After as seconds or an HTTP-date, on
  tenacity. (Polling until something is true is sandbox/polling.py: the sandbox imports no app/.)
- models.py: the ORM tables. jobs/: every SQL statement about jobs (records, transitions,
  webhook intake, the dashboard's read model, requeue-and-send, local.py: local (`fix`, `demo`)
  jobs' rows and the one import of older local records, and scheduler.py: the fair queue
  and per-project budgets; `production_load`, which eval gives way to), evaluations.py
  (`manage.py eval`'s selector, its SQL and rows).
- evaluation_report.py: the one computation of an evaluation's figures and its Markdown.
- queue.py: the Celery app and the task names (tasks are sent by name); sweep.py sends again
  jobs whose task was lost.
- forge/: the Forge seam: webhook parsing (pure, no I/O), the GitLab and Gitea API clients, and
  reviews.py, the rounds' shared vocabulary (a review comment, a thread note, a CI result, the
  `/frogfix` commands) that the parsers, the clients and the worker's rounds all read.
- attestations/: the signed record of every published change (issue 41): keys, the in-toto statement
  in its DSSE envelope (securesystemslib), the append-only log, bundles and verify's checks.
- web/: FastAPI: webhooks, the JSON API, health and metrics, the dashboard.

What may import what:
- Nothing in app/ imports worker/ or sandbox/: the worker depends on app, never the reverse, and
  the web layer reaches the worker only through task names on the queue.
- app/forge imports nothing else of ours but redaction.py and retrying.py (which imports only
  logs.py), so the worker's pipeline can use it on its own.
- statuses.py, endings.py, trajectory.py, usage.py, textcalls.py, outcome_words.py, moments.py and
  redaction.py (and any other pure
  vocabulary module added beside them) import only the standard library (and each other), so
  worker/leaf, which must not import a database or web code, may use them; worker/leaf also logs
  through logs.py (structlog) and retries its model calls through retrying.py (tenacity).
- web/ uses the core; the core never imports web/.
"""
