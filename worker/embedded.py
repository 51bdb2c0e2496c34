"""The worker `manage.py serve` runs beside the app with the embedded broker, tied to serve's life.

No code of serve's can be relied on to stop that worker: a service manager stops serve with
SIGTERM and uvicorn re-raises it after its own shutdown, SIGHUP ends a process unasked, and
SIGKILL runs nothing at all. An orphaned worker would go on consuming the broker with old
settings and old code. So serve holds the write end of a pipe it never writes (the lifeline),
and the worker holds the read end: however serve ends, the kernel closes the write end, the
worker reads end-of-file and stops itself. A pipe, not PR_SET_PDEATHSIG, because it has no race
with a parent that dies before the child is watching, and follows the process, not one thread.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence

from app.logs import get_logger

log = get_logger("frogfix.embedded")

# How long a running job may take to finish once serve is gone, before the worker is killed
# (its sandboxes die with it; the sweep re-queues a job whose heartbeat stopped).
STOP_GRACE_S = 20.0
LIFELINE_OPTION = "--lifeline-fd"


class EmbeddedWorker:
    """serve's side: the worker process and the write end of its lifeline."""

    def __init__(self, argv: Sequence[str]) -> None:
        read_end, self._lifeline = os.pipe()  # both ends close on exec: only the worker gets one
        try:
            self.proc = subprocess.Popen([*argv, LIFELINE_OPTION, str(read_end)], pass_fds=(read_end,))
        except BaseException:
            os.close(self._lifeline)
            raise
        finally:
            os.close(read_end)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        """Close the lifeline, exactly as serve's end would, and wait for the worker to be gone."""
        if self._lifeline >= 0:
            os.close(self._lifeline)
            self._lifeline = -1
        try:
            self.proc.wait(timeout=STOP_GRACE_S + 10)
        except subprocess.TimeoutExpired:  # it should have killed itself by now
            self.proc.kill()
            self.proc.wait(10)


def watch_lifeline(fd: int, grace_s: float = STOP_GRACE_S) -> threading.Thread:
    """The worker's side: stop this process once `fd` reads end-of-file, i.e. serve is gone.

    SIGTERM first, Celery's warm shutdown: it stops consuming at once and lets a running job
    finish. SIGKILL when that takes longer than `grace_s`.
    """
    os.set_inheritable(fd, False)  # never handed on to git or a sandbox

    def watch() -> None:
        try:
            while os.read(fd, 512):
                pass  # serve never writes; anything read is ignored
        except OSError:
            pass  # a broken lifeline counts as a closed one
        log.warning("serve_gone", message="serve has ended or is stopping: so does its worker")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        log.error("serve_gone_kill", message=f"still running {grace_s:.0f} s after serve ended; killing")
        os.kill(os.getpid(), signal.SIGKILL)

    thread = threading.Thread(target=watch, name="lifeline", daemon=True)
    thread.start()
    return thread
