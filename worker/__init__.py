"""The worker: what happens to a job after it was recorded, in rooms whose imports run one way.

From the bottom up (a room may import the rooms listed before it, never one after it;
tests/test_import_graph.py checks it):

- `leaf/`: the Leaf agent loop, its model client, tools, prompts (with `issue_text`, the issue as
  the model reads it) and trajectory writer. It imports no database, queue or web code: only
  sandbox's protocol, app's standard-library document modules (`app.statuses`, `app.trajectory`,
  `app.usage`, `app.textcalls`, `app.outcome_words`, `app.endings`), `app.logs` and `app.retrying` (the one
  retry policy, which the model client's tries go through).
- `git/`: every git call, the mirrors, the workspaces and the pool, merging, the push.
- `environment/`: a repository's test environment from the company's package mirror.
- `wiring.py`: settings to seams (the model client, the sandbox, the forge client).
- `attempts/`: one attempt and its evidence (tests, verdict, patch, review rules), the typed
  events it reports (`attempt_events`) and the exceptions a run meets as typed endings (`failures`).
- `texts/`: what is written on the forge.
- `job/`: the job core (pipeline, its context, rounds on an MR, questions).
- `commands/`: `fix`, `demo`, `replay`, `eval`, `doctor`.
- Entries: `tasks.py` (thin Celery tasks: claim, heartbeat, `job.runs`), `heartbeat.py` (light
  on imports, so it beats from the claim on), `embedded.py` (the worker `manage.py serve` starts
  beside the app, held by a lifeline pipe).

Nothing in app/ or sandbox/ imports worker/.
"""
