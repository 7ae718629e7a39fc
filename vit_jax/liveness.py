"""A process of a multi-process run that dies (SIGKILL, an OOM kill, a lost
host) ends the others quickly, with one line naming it.

Left alone, the survivors of a dead process wait in their next collective
until JAX's coordination service misses the dead one's heartbeats for
`heartbeat_timeout_seconds`, and then abort with a C++ stack trace. Here
each process's `Watch` thread beats every few seconds into the
coordination service's key-value store and reads the others' beats: when
one has not beaten for `timeout_s`, or the service itself (process 0) is
gone, it prints one line and exits with EX_TEMPFAIL (75): a retry, for
a launcher's restart policy, that resumes from the last checkpoint. JAX's
own heartbeat timeout is set above `timeout_s`, so this answer comes first.
A process that stops with an error says so in its beat
(`fail_and_exit`), and the others stop at once, naming it and the error.
"""

import os
import sys
import threading
import time

import jax
from jax._src import distributed  # Its client: the one multihost_utils uses.

EXIT_CODE = 75  # EX_TEMPFAIL: rerunning every process resumes the run.
_PREFIX = "vit_jax/alive/"
_DONE = "done"
_FAILED = "failed: "


def jax_heartbeat_timeout(timeout_s: float) -> int:
  """JAX's own heartbeat timeout for a watch of `timeout_s`: later, so the
  watch names the lost process before JAX aborts."""
  return int(2 * timeout_s + 10)


class Watch:
  """Beats for this process and watches the others' beats (module doc)."""

  def __init__(self, timeout_s: float, interval_s: float = None):
    self.timeout_s = timeout_s
    self.interval_s = interval_s or max(0.5, min(5.0, timeout_s / 5))
    self._client = distributed.global_state.client
    # The console's stderr, kept: TensorFlow loads with file descriptor 2
    # closed (config/imports.py), and a line said then must still be seen.
    self._console = os.dup(2)
    self._me = jax.process_index()
    self._count = jax.process_count()
    self._beats = 0
    # process -> (last beat read, local time it changed); set by start().
    self._seen = {}
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True,
                                    name="vit_jax liveness")

  def start(self) -> "Watch":
    self._beat()
    now = time.monotonic()
    self._seen = {p: (None, now) for p in range(self._count) if p != self._me}
    self._thread.start()
    return self

  def stop(self):
    """This process is done (its run ended): the others stop watching it."""
    self._leave(_DONE)

  def _leave(self, last_beat: str):
    """Stops beating, leaving `last_beat` for the others to read."""
    self._stop.set()
    try:
      self._client.key_value_set(f"{_PREFIX}{self._me}", last_beat,
                                 allow_overwrite=True)
    except Exception:  # noqa: BLE001 The service may be gone already.
      pass

  def _beat(self):
    self._beats += 1
    self._client.key_value_set(f"{_PREFIX}{self._me}", str(self._beats),
                               allow_overwrite=True)

  def _run(self):
    while not self._stop.wait(self.interval_s):
      try:
        self._beat()
        beats = dict(self._client.key_value_dir_get(_PREFIX))
      except Exception as e:  # noqa: BLE001 The service is unreachable.
        if self._stop.is_set():
          return
        self._lost("process 0, which runs the coordination service, is "
                   f"unreachable ({str(e).splitlines()[0][:200]})")
      now = time.monotonic()
      for process, (last, since) in self._seen.items():
        beat = beats.get(f"{_PREFIX}{process}")
        if beat == _DONE:
          continue
        if beat is not None and beat.startswith(_FAILED):
          self._lost(f"process {process} of {self._count} stopped: "
                     f"{beat[len(_FAILED):]}")
        if beat != last:
          self._seen[process] = (beat, now)
        elif now - since > self.timeout_s:
          self._lost(f"process {process} of {self._count} has sent no "
                     f"heartbeat for {now - since:.0f} s (killed, crashed "
                     "or its host is gone)")

  def fail(self, line: str):
    """This process stops with an error (`line`): the others stop at once
    too, rather than wait in a collective for one that never comes."""
    self._leave(_FAILED + line[:500])

  def _lost(self, why: str):
    if self._stop.is_set():  # The run is ending anyway.
      return
    line = (f"error: {why}; process {self._me} stops too. Rerun every "
            "process to resume from the last checkpoint.")
    sys.stderr.flush()  # What this process said before comes first.
    os.write(self._console, (line + "\n").encode())  # One write, one line.
    self.fail(line)  # Process 0 waits for this before it goes.
    os._exit(EXIT_CODE)  # Not sys.exit: the main thread may be in a collective.

  def wait_for_the_others(self, limit_s: float):
    """Until every other process has stopped (failed or done), at most
    `limit_s`: process 0 runs the coordination service, and when it goes
    first JAX aborts the others before they can say their line."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
      try:
        beats = dict(self._client.key_value_dir_get(_PREFIX))
      except Exception:  # noqa: BLE001 Nothing more to wait for.
        return
      if all(
          beats.get(f"{_PREFIX}{p}", "").startswith((_FAILED, _DONE))
          for p in range(self._count)
          if p != self._me):
        return
      time.sleep(0.2)


_watch = None


def start(timeout_s: float):
  """Starts this process's watch (after jax.distributed.initialize)."""
  global _watch
  _watch = Watch(timeout_s).start()


def finish():
  """Ends this process's watch, telling the others it is done."""
  global _watch
  if _watch is not None:
    _watch.stop()
    _watch = None


def active() -> bool:
  return _watch is not None


def fail_and_exit(line: str, status: int):
  """Tells the other processes this one stops with `line`, then exits with
  `status` at once: JAX's exit would wait in its shutdown barrier for
  processes that are stuck in a collective with this one."""
  if _watch is not None:
    _watch.fail(line)
    if jax.process_index() == 0:
      _watch.wait_for_the_others(_watch.timeout_s + 3 * _watch.interval_s)
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)


def await_verdict():
  """Gives the watch time to name a lost process (it then ends this one):
  a collective that failed because a peer died (CPU and GPU report a reset
  connection) is said in its one line, not as a traceback."""
  if _watch is not None:
    time.sleep(_watch.timeout_s + 3 * _watch.interval_s)
