"""Orbax checkpoints of the train state in `WORKDIR/checkpoints`.

The state (params, optimizer state, step, RNG) is the whole checkpoint: the
input position is a function of the step (see
`input_pipeline.make_train_dataset`). Saves are asynchronous and atomic
(Orbax writes to a temporary directory and renames it), so a half-written
checkpoint is never restored. Restoring takes the shardings of the current
mesh, so a checkpoint written on one device count loads on another.
"""

import os
import signal

import jax
import ml_collections
import orbax.checkpoint as ocp
from absl import logging


def make_manager(workdir: str,
                 config: ml_collections.ConfigDict) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(
      max_to_keep=config.keep_checkpoints,
      keep_period=config.keep_checkpoint_every_steps or None,
      create=True, enable_async_checkpointing=True)
  return ocp.CheckpointManager(os.path.join(os.path.abspath(workdir),
                                            "checkpoints"), options=options)


def restore_latest(manager: ocp.CheckpointManager, state, state_sharding):
  """The latest saved state placed on `state_sharding`, or `state` if none."""
  step = manager.latest_step()
  if step is None:
    return state
  abstract = jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      state, state_sharding)
  try:
    restored = manager.restore(step, args=ocp.args.StandardRestore(abstract))
  except (ValueError, KeyError) as e:
    raise ValueError(
        f"The checkpoint at step {step} in {manager.directory} does not match "
        "this config's model or optimizer. Use a new --workdir, or the config "
        f"that wrote it. ({str(e)[:500]})") from e
  logging.info("Resumed from step %d in %s.", step, manager.directory)
  return restored


def save(manager: ocp.CheckpointManager, step: int, state, force=False):
  """Starts an async save (returns once the arrays are copied off-device)."""
  manager.save(step, args=ocp.args.StandardSave(state), force=force)


class PreemptionFlag:
  """Turns SIGTERM into a flag the loop checks, so it can save and stop."""

  def __init__(self):
    self.raised = False
    self._previous = signal.signal(signal.SIGTERM, self._handle)

  def _handle(self, signum, frame):
    del signum, frame
    logging.warning("SIGTERM: saving a checkpoint, then stopping.")
    self.raised = True

  def restore(self):
    signal.signal(signal.SIGTERM, self._previous)
