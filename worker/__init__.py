"""The worker: what happens to a job after the webhook service recorded it.

- `tasks.py`: thin Celery tasks on `app.queue`'s app; they claim a job, start its heartbeat
  (`heartbeat.py`, light on imports so it beats from the claim on) and call `runs.py`, which picks
  its pipeline and runs it.
- `pipeline.py`: one run of one job, stage by stage (admit, prepare, attempts, choose, publish, end),
  with no Celery inside: the one job core; its attempts go through `attempt.py` with an observer that
  writes the database. `local_pipeline.py` is the same core for a local job (forge `local`): the
  checkout folder as its source, a publisher that publishes nothing; `localfix.py` is `manage.py fix`
  and `demo`'s front (the row, the core run in-process, `fix`'s words).
- `rounds.py`: the pipelines of rounds on an MR FrogFix opened (review and CI rounds, update
  rounds that merge a moved target in) and the MR's rounds section; `triage.py` judges each round
  request once (and, with FROGFIX_AUTO_UPDATE, asks whether the MR conflicts with its target);
  `merging.py` is git's side of an update round.
- `job_context.py`: what a run of a job holds beside its stages (its seams, flags).
- `attempt.py`: one attempt, owned in one place (workspace, `.frogfix.yml` and the repository's
  AGENTS.md guidance, trajectory, sandbox, Leaf, patch, review rules, verification), its spec made
  in one function (`attempt_spec`). The job core (forge and local jobs) and `replay.py` (`manage.py
  replay`, eval's live run) all run attempts through it and differ only in their observer and their
  workspace source (`workspaces.py`); its test runs are `verifier.py`'s.
- `recorded.py`: a recorded task (the attempt to run again, its repository and start), which
  `replay.py` (compare) and `evaluate.py` (score) share.
- `wiring.py`: settings to seams: the model client, the sandbox and the forge client.
- `embedded.py`: the worker `manage.py serve` starts beside the app (embedded broker), held by a
  lifeline pipe so it stops itself however serve ends.
- `evaluate.py`: `manage.py eval`: a candidate model re-runs recorded tasks through `replay.py`'s
  live attempt, sharing model slots with production (it goes last), never publishing.
- `doctor/`: `manage.py doctor`'s checks of the configuration, end to end (database, broker,
  forges, model server, sandbox, disk).
- `gitcalls.py` (the isolated git environment every git call of a job uses, bounded, and the
  mirror locks), `mirrors.py` (the forge's repositories mirrored on the worker), `workspace_pool.py`
  (per-job workspaces and the warm pool), `publishing.py` (the fix commit and its push),
  `patch_evidence.py` (what git stores for the sandbox's patch, taken
  outside the sandbox, and git's regeneration of it), `ci_config.py` (which paths are CI
  configuration), `repo_config.py` (`.frogfix.yml`, AGENTS.md guidance, test-command detection,
  review rules over the evidence), `report.py` (what is written on the forge), `issue_text.py`,
  `demo.py`.
- `leaf/`: the agent loop, its model client, tools and trajectory writer.

Imports flow one way: worker/ uses app's core (settings, db, jobs, statuses, trajectory, patches,
forge) and sandbox/; nothing in app/ or sandbox/ imports worker/. `worker/leaf` imports no
database, queue or web code: only sandbox's protocol, app's standard-library document modules
(`app.statuses`, `app.trajectory`, `app.usage`, `app.textcalls`: the one reader of text tool
calls, which the dashboard shares; `app.outcome_words`: a server's URL without credentials) and
`app.logs` (structlog: loop.py and model.py log one way).
"""
