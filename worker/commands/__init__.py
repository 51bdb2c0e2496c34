"""The worker side of manage.py's commands that run jobs or check them.

- `fix`: `manage.py fix` (and `demo`'s run): one job on a local checkout; `demo`: the demo's
  repository and scripted model.
- `replay`: `manage.py replay`, comparing a recording with a new run; `recorded`: a recorded task
  (the attempt to run again, its repository, its start), shared by replay and eval.
- `evaluate`: `manage.py eval`: a candidate model re-runs recorded tasks, giving way to production.
- `doctor/`: `manage.py doctor`'s end-to-end checks of the configuration.
- `verify`: `manage.py verify`'s checks of an attestation bundle, with a checkout's commits.
- `cli/`: the command line itself (manage.py is a thin entry over it): the Typer app and its
  commands; an entry like the Celery tasks (it starts workers), so no room imports it.
- `bootstrap`: which Python runs manage.py (standard library only, before anything else).

Room rule (tests/test_import_graph.py): may import every room below (`worker.job`,
`worker.attempts`, `worker.texts`, `worker.git`, `worker.environment`, `worker.leaf`,
`worker.wiring`); no room imports it, only the entries (`worker.tasks`, manage.py).
"""
