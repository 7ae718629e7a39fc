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
import orbax.checkpoint as ocp

from vit_jax import console
from vit_jax import paths
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
  """The latest saved state placed on `state_sharding`, or `state` if none."""
  step = manager.latest_step()
  if step is None:
    return state
  abstract = jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state,
      state_sharding)
  try:
    restored = manager.restore(step, args=ocp.args.StandardRestore(abstract))
  except (ValueError, KeyError) as e:
    raise UserError(
        f"The checkpoint at step {step} in {manager.directory} does not match "
        "this config's model or optimizer. Use a new --workdir, or the config "
        f"that wrote it. ({str(e)[:500]})") from e
  console.say("Resuming at step %d from %s.", step, manager.directory)
  return restored


def save(manager: ocp.CheckpointManager, step: int, state, force=False):
  """Starts an async save (returns once the arrays are copied off-device)."""
  manager.save(step, args=ocp.args.StandardSave(state), force=force)


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
