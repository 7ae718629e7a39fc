"""Orbax checkpoints of the train state in `WORKDIR/checkpoints`.

The state (params, optimizer state, step, RNG) is the whole checkpoint: the
input position is a function of the step (see
`input_pipeline.make_train_dataset`). Saves are asynchronous and atomic
(Orbax commits a step only once every process has written it), so a
half-written checkpoint is never restored. Restoring takes the shardings of
the current mesh, so a checkpoint written on one device count loads on
another. The workdir may be local or on object storage (`vit_jax.paths`).
"""

import signal

from absl import logging
import jax
from jax.experimental import multihost_utils
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from vit_jax import console
from vit_jax import paths
from vit_jax.errors import CheckpointSaveError
from vit_jax.errors import UserError


def make_manager(workdir: str,
                 config: ml_collections.ConfigDict) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(
      max_to_keep=config.keep_checkpoints,
      keep_period=config.keep_checkpoint_every_steps or None, create=True,
      enable_async_checkpointing=True)
  return ocp.CheckpointManager(
      paths.resolve(workdir) / "checkpoints", options=options)


def restore_latest(manager: ocp.CheckpointManager, state, state_sharding):
  """The newest restorable saved state placed on `state_sharding`, or
  `state` if none was saved. A step that cannot be restored (a damaged
  file) is said in one line, set aside as STEP.damaged, and the previous
  step is tried; none restorable is a one-line error."""
  steps = sorted(manager.all_steps(), reverse=True)
  if not steps:
    return state
  abstract = jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state,
      state_sharding)
  failed = []  # (step, why)
  for step in steps:
    try:
      restored, why = manager.restore(
          step, args=ocp.args.StandardRestore(abstract)), None
    except Exception as e:  # noqa: BLE001 Orbax and TensorStore raise many.
      restored, why = None, _reason(e)
    if not _everywhere(why is None):  # Every process reads the same step.
      failed.append((step, why or "another process could not read it"))
      continue
    for bad, why in failed:
      console.say(
          "The checkpoint at step %d cannot be restored (%s); it is set "
          "aside as %s.damaged, and the run resumes from step %d, the newest "
          "intact one.", bad, why, bad, step)
    _set_aside(manager, [bad for bad, _ in failed])
    console.say("Resuming at step %d from %s.", step, manager.directory)
    return restored
  if _saved_shapes(manager, steps[0]) not in (None, _shapes(state)):
    raise UserError(
        f"The checkpoint at step {steps[0]} in {manager.directory} does not "
        "match this config's model or optimizer. Use a new --workdir, or the "
        f"config that wrote it. ({failed[0][1]})")
  raise UserError(
      f"No checkpoint in {manager.directory} can be restored: " +
      "; ".join(f"step {step}: {why}" for step, why in failed) +
      ". Move the folder aside (or use a new --workdir) to start afresh.")


def _reason(error: Exception) -> str:
  """The first line of an error, short enough for a one-line message."""
  lines = str(error).strip().splitlines() or [type(error).__name__]
  line = lines[0].split(" See full TensorStore details")[0]
  return line if len(line) <= 300 else line[:297] + "..."


def _everywhere(ok: bool) -> bool:
  if jax.process_count() == 1:
    return ok
  return bool(np.all(multihost_utils.process_allgather(np.bool_(ok))))


def _shapes(state) -> list:
  return sorted((tuple(x.shape), str(x.dtype)) for x in jax.tree.leaves(state))


def _saved_shapes(manager, step):
  """The shapes and dtypes a step holds, from its metadata; None if that
  cannot be read (a damaged step)."""
  try:
    metadata = ocp.StandardCheckpointer().metadata(
        manager.directory / str(step) / "default")
    return sorted((tuple(m.shape), str(m.dtype))
                  for m in jax.tree.leaves(metadata.item_metadata))
  except Exception:  # noqa: BLE001 As above.
    return None


def _set_aside(manager, steps):
  """Renames each step's folder to STEP.damaged (Orbax then ignores it), so
  the run saves that step again when it gets there."""
  if not steps:
    return
  if jax.process_index() == 0:
    for step in steps:
      folder = manager.directory / str(step)
      aside = manager.directory / f"{step}.damaged"
      if aside.exists():
        aside.rmtree()
      folder.rename(aside)
  multihost_utils.sync_global_devices("damaged checkpoints set aside")
  manager.reload()


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

  def _failed(self, step, error) -> CheckpointSaveError:
    last = ("no checkpoint was saved yet" if self.saved is None else
            f"the last checkpoint saved is step {self.saved}")
    return CheckpointSaveError(
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
