"""Jobs: every SQL statement about jobs, their attempts, events and webhook deliveries.

- records.py: the job, attempt and event rows: reads, and writes that change no status.
- transitions.py: the guarded status changes (claim, set_status, cancel, retry, recover_stale_jobs)
  and the enqueue stamps.
- intake.py: webhook deliveries recorded once, and the job each one starts, cancels or notes.
- answer_gate.py: the webhook's only forge calls, for a `/frogfix` answer: may its author trigger
  FrogFix, and the one reply a refused author gets on an issue (issue 36).
- rounds.py: review rounds: an MR's thread of jobs, the comments and CI results that ask for rounds
  (`round_requests`), and starting a thread's next round.
- read_model.py: the dashboard's job list and overview (read-only).
- scheduler.py: the fair queue and per-project budgets: which queued job a free worker claims,
  why a job waits (`hold_reason`), and releasing held jobs when the budget allows.
- requeue.py: queue a job again and send its task after the commit (owns its transactions).

Callers import from the module that owns a name; this package re-exports nothing.
"""
