"""Orbax checkpoints of the train state in `WORKDIR/checkpoints`.

The state (params, optimizer state, step, RNG) is the whole checkpoint: the
input position is a function of the step (see
`input_pipeline.make_train_dataset`). Saves are asynchronous and atomic
(Orbax commits a step only once every process has written it), so a
half-written checkpoint is never restored. Restoring takes the shardings of
the current mesh, so a checkpoint written on one device count loads on
another. The workdir may be local or on object storage (`vit_jax.paths`).
"""

from __future__ import annotations

import logging as logging_lib
import signal
import sys
from typing import Any

from absl import logging
import flax
import jax
from jax.experimental import multihost_utils
import ml_collections

from vit_jax import console
from vit_jax import paths
from vit_jax.config import imports
from vit_jax.errors import CheckpointError
from vit_jax.errors import UserError

ocp = imports.lazy("orbax.checkpoint")  # Loaded where a run starts.


def make_manager(workdir: str,
                 config: ml_collections.ConfigDict) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(
      max_to_keep=config.keep_checkpoints,
      keep_period=config.keep_checkpoint_every_steps or None, create=True,
      enable_async_checkpointing=True)
  return ocp.CheckpointManager(
      paths.resolve(workdir) / paths.CHECKPOINTS_DIR, options=options)


def has_saved_steps(workdir) -> bool:
  """Whether WORKDIR/checkpoints holds a finished step (read only: nothing
  is created, unlike `make_manager`)."""
  directory = paths.resolve(workdir) / paths.CHECKPOINTS_DIR
  return directory.is_dir() and bool(ocp.path.step.checkpoint_steps(directory))


def restore_latest(manager: ocp.CheckpointManager, state, state_sharding):
  """The newest restorable saved state placed on `state_sharding`, or
  `state` if none was saved.

  A step that cannot be restored because it is damaged (a truncated or
  garbled file) is said in one line and set aside as STEP.damaged; in one
  process the step before is tried at once. With several processes, which
  restore together, the one that failed marks the step and the run stops
  (exit 75): the rerun sets it aside and resumes from the step before. A
  read that may pass (storage unavailable, a timeout) sets nothing aside:
  one line, exit 75. None restorable, or one of another model: one line,
  and nothing set aside.
  """
  _quiet_failed_reads(manager.directory)
  _set_aside(manager, _marked_damaged(manager))
  steps = sorted(manager.all_steps(), reverse=True)
  if not steps:
    return state
  abstract = jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state,
      state_sharding)
  failed = []  # (step, why)
  for step in steps:
    try:
      restored = _restore(manager, step, abstract)
    except Exception as e:  # noqa: BLE001 Orbax and TensorStore raise many.
      why = _reason(e)
      if _saved_shapes(manager, step) not in (None, _shapes(state)):
        raise UserError(
            f"The checkpoint at step {step} in {manager.directory} does not "
            "match this config's model or optimizer. Use a new --workdir, or "
            f"the config that wrote it. ({why})") from e
      if _may_pass(e):
        raise CheckpointError(
            f"The checkpoint at step {step} in {manager.directory} could not "
            f"be read ({why}); nothing was set aside. Rerun to try "
            "again.") from e
      if jax.process_count() > 1:
        (manager.directory / f"{step}{_MARK}").write_text(why)
        raise CheckpointError(
            f"The checkpoint at step {step} in {manager.directory} cannot be "
            f"restored ({why}); it is marked damaged, and rerunning every "
            "process resumes from the step before.") from e
      failed.append((step, why))
      continue
    for bad, why in failed:
      console.say(
          "The checkpoint at step %d cannot be restored (%s); it is set "
          "aside as %s.damaged, and the run resumes from step %d, the newest "
          "intact one.", bad, why, bad, step)
    _set_aside(manager, [bad for bad, _ in failed])
    console.say("Resuming at step %d from %s.", step, manager.directory)
    return restored
  raise UserError(
      f"No checkpoint in {manager.directory} can be restored: " +
      "; ".join(f"step {step}: {why}" for step, why in failed) +
      ". Move the folder aside (or use a new --workdir) to start afresh.")


def _quiet_failed_reads(directory):
  """Keep a failed restore's TensorStore noise off the console.

  When a restore fails, Orbax stops waiting while TensorStore still
  completes the step's other reads: asyncio logs each unawaited failure
  ("Task exception was never retrieved") and each late completion fails to
  call back into Orbax's closed loop (an unraisable `Event loop is closed`)
  -- a hundred tracebacks around the one line that decides. Only those two
  are dropped, and the first only for reads under `directory`.
  """
  if not getattr(sys.unraisablehook, "_drops_closed_loop", False):
    previous = sys.unraisablehook

    def hook(unraisable):
      value = unraisable.exc_value
      if not (isinstance(value, RuntimeError) and
              str(value) == "Event loop is closed"):
        previous(unraisable)

    hook._drops_closed_loop = True
    sys.unraisablehook = hook
  asyncio_logger = logging_lib.getLogger("asyncio")
  if not any(isinstance(f, _UnretrievedReads) for f in asyncio_logger.filters):
    asyncio_logger.addFilter(_UnretrievedReads(str(directory)))


class _UnretrievedReads(logging_lib.Filter):
  """Drops asyncio's report of an unawaited failed read of a checkpoint."""

  def __init__(self, directory: str):
    super().__init__()
    self.directory = directory

  def filter(self, record) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    return not (
        record.getMessage().startswith("Task exception was never retrieved") and
        self.directory in str(error))


_MARK = ".damaged.txt"  # Next to a step another process could not restore.
_PASSING = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED",
            "Connection reset", "timed out", " 503", " 429")


def _may_pass(error: BaseException) -> bool:
  """Whether a failed restore may succeed when tried again: storage out of
  reach, not a damaged file."""
  while error is not None:
    # A reset connection, a timeout: OSErrors, but not a file gone.
    if isinstance(error, OSError) and not isinstance(error, FileNotFoundError):
      return True
    if any(word in str(error) for word in _PASSING):
      return True
    error = error.__cause__ or error.__context__
  return False


def _marked_damaged(manager) -> list[int]:
  """Steps another process of an earlier run marked damaged."""
  if jax.process_index() != 0:
    return []
  return sorted(
      int(p.name[:-len(_MARK)])
      for p in manager.directory.glob(f"*{_MARK}")
      if p.name[:-len(_MARK)].isdigit())


def _reason(error: Exception) -> str:
  """The first line of an error, short enough for a one-line message."""
  lines = str(error).strip().splitlines() or [type(error).__name__]
  line = lines[0].split(" See full TensorStore details")[0]
  return line if len(line) <= 300 else line[:297] + "..."


def _shapes(state) -> list:
  return sorted((tuple(x.shape), str(x.dtype)) for x in jax.tree.leaves(state))


def _saved_shapes(manager, step):
  """The shapes and dtypes a step holds, from its metadata; None if that
  cannot be read (a damaged step: an error, or no arrays at all)."""
  try:
    metadata = ocp.StandardCheckpointer().metadata(
        manager.directory / str(step) / "default")
    shapes = sorted((tuple(m.shape), str(m.dtype))
                    for m in jax.tree.leaves(metadata.item_metadata))
  except Exception:  # noqa: BLE001 As above.
    return None
  return shapes or None


def _set_aside(manager, steps):
  """Renames each step's folder to STEP.damaged (STEP.damaged.N if that is
  taken; Orbax ignores them), so the run saves that step again when it gets
  there, and drops the step's mark. Process 0 renames; all wait."""
  if jax.process_count() == 1 and not steps:
    return
  if jax.process_index() == 0:
    for step in steps:
      folder = manager.directory / str(step)
      aside, n = manager.directory / f"{step}.damaged", 0
      while aside.exists():
        n += 1
        aside = manager.directory / f"{step}.damaged.{n}"
      if folder.exists():
        folder.rename(aside)
      mark = manager.directory / f"{step}{_MARK}"
      if mark.exists():
        mark.unlink()
  multihost_utils.sync_global_devices("damaged checkpoints set aside")
  manager.reload()


@flax.struct.dataclass
class _StateWithoutFp8:
  """The train state's fields before it had `fp8` (checkpoints written
  then have no such entry)."""
  step: Any
  params: Any
  opt_state: Any
  rng: Any
  ema_params: Any = None


def _restore(manager: ocp.CheckpointManager, step: int, abstract):
  """Step `step` restored into `abstract` (a TrainState of
  ShapeDtypeStructs); one written before the FP8 field, into the fields it
  has, where the state has no FP8 state."""
  try:
    return manager.restore(step, args=ocp.args.StandardRestore(abstract))
  except Exception as e:  # noqa: BLE001 Orbax's mismatch is a ValueError.
    if abstract.fp8 is not None or "tree structures do not match" not in str(e):
      raise
  older = _StateWithoutFp8(abstract.step, abstract.params, abstract.opt_state,
                           abstract.rng, abstract.ema_params)
  restored = manager.restore(step, args=ocp.args.StandardRestore(older))
  return abstract.replace(step=restored.step, params=restored.params,
                          opt_state=restored.opt_state, rng=restored.rng,
                          ema_params=restored.ema_params)


def save(manager: ocp.CheckpointManager, step: int, state, force=False):
  """Starts an async save (returns once the arrays are copied off-device)."""
  return manager.save(step, args=ocp.args.StandardSave(state), force=force)


class Saver:
  """The training loop's saves: a save that fails after the storage
  libraries' retries (Orbax's own synchronous part, or its background
  write, which Orbax reports at the next save) stops the run with one line
  naming the step that failed and the last one saved, rather than training
  on for days without a checkpoint."""

  def __init__(self, manager: ocp.CheckpointManager):
    self.manager = manager
    self.saved = manager.latest_step()  # Known complete.
    self._writing = None  # Started, not yet known complete.

  def save(self, step: int, state, force=False):
    self.wait()
    try:
      started = save(self.manager, step, state, force)
    except Exception as e:  # noqa: BLE001 Storage libraries raise many.
      raise self._failed(step, e) from e
    if started:
      self._writing = step

  def wait(self):
    """Until the save in progress is written (or it failed: one line)."""
    try:
      self.manager.wait_until_finished()
    except Exception as e:  # noqa: BLE001 As above.
      raise self._failed(self._writing, e) from e
    if self._writing is not None:
      self.saved, self._writing = self._writing, None

  def _failed(self, step, error) -> CheckpointError:
    last = ("no checkpoint was saved yet" if self.saved is None else
            f"the last checkpoint saved is step {self.saved}")
    return CheckpointError(
        f"The checkpoint of step {step} could not be saved to "
        f"{self.manager.directory} ({_reason(error)}); {last}. Rerun to "
        "resume from it once the storage works.")


class Preemption:
  """Tells the loop, at the same step on every process, to save and stop.

  One process: SIGTERM sets a flag. Several processes: JAX's preemption
  sync point. Its notifier catches SIGTERM on whichever host gets it, and
  the coordinator picks the next step that every process can still reach,
  so all of them save that step together and exit cleanly (a host that
  stopped alone would leave the others hanging in a collective).
  `reached(step)` must be called at every step.
  """

  def __init__(self):
    self._multi_process = jax.process_count() > 1
    self._raised = False
    self._previous = None
    if not self._multi_process:
      self._previous = signal.signal(signal.SIGTERM, self._handle)

  def _handle(self, signum, frame):
    del signum, frame
    logging.warning("SIGTERM: saving a checkpoint, then stopping.")
    self._raised = True

  def reached(self, step: int) -> bool:
    if self._multi_process:
      return multihost_utils.reached_preemption_sync_point(step)
    return self._raised

  def restore(self):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
