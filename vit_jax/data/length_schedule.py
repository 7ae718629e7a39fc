"""Training at several sequence lengths: one length per step, the batch
from a token budget (timm's NaFlex loader's scheme), read by index.

Step s trains at length L(s), drawn from `lengths` by a hash of (seed, s),
with B(s) = budget // L(s) images (rounded down to a multiple that splits
over the processes and devices). Its images are stream positions
P(s) .. P(s) + B(s) - 1 of the global order (`global_order.py`), where
P(s) is the sum of the batches before it. So, as with one length, a step's
batch is a pure function of (seed, step) for any number of processes, and
a resumed run computes P(start) and seeks.
"""

import numpy as np

from vit_jax.errors import UserError

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(values: np.ndarray) -> np.ndarray:
  """splitmix64's finaliser: well-spread 64-bit hashes of uint64s."""
  z = values.astype(np.uint64)
  with np.errstate(over="ignore"):
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
  return z ^ (z >> np.uint64(31))


class Schedule:
  """Lengths and batch sizes of the steps of a run."""

  def __init__(self, lengths, budget: int, seed: int, multiple: int):
    self.lengths = np.asarray(sorted(lengths), np.int64)
    self.batches = budget // self.lengths // multiple * multiple
    if (self.batches < multiple).any():
      raise ValueError(f"a token budget of {budget} holds no batch of "
                       f"{multiple} images at length {self.lengths.max()}")
    with np.errstate(over="ignore"):
      self._key = np.uint64(seed % 2**63) * _GOLDEN

  def choices(self, steps: np.ndarray) -> np.ndarray:
    """Index into `lengths` of each of `steps`."""
    with np.errstate(over="ignore"):
      hashed = _mix(np.asarray(steps, np.uint64) + self._key)
    return (hashed % np.uint64(len(self.lengths))).astype(np.int64)

  def length(self, step: int) -> int:
    return int(self.lengths[self.choices(np.array([step]))[0]])

  def batch(self, step: int) -> int:
    return int(self.batches[self.choices(np.array([step]))[0]])

  def first_position(self, step: int) -> int:
    """The stream position of step `step`'s first image."""
    if step <= 0:
      return 0
    return int(self.batches[self.choices(np.arange(step))].sum())


def check_config(config, devices: int):
  """Several lengths: patch sequences, a budget that holds a batch at the
  longest, and not with packing (which mixes lengths its own way)."""
  lengths = tuple(config.get("sequence_lengths", ()))
  if not lengths:
    return
  last = config.pp_train.split("|")[-1].strip().split("(")[0]
  budget = config.get("token_budget")
  refusals = (
      (last != "patchify", f"config.sequence_lengths={lengths} trains images "
       f"at their own shape; config.pp_train={config.pp_train!r} must end "
       "with patchify"),
      (min(lengths) < 1, f"config.sequence_lengths={lengths} must be "
       "positive"),
      (not budget, "config.sequence_lengths needs config.token_budget: the "
       "patches of each step's batch (batch = token_budget // length)"),
      (config.packing.length is not None, "config.sequence_lengths and "
       "config.packing each mix lengths; use one"),
  )
  for refused, why in refusals:
    if refused:
      raise UserError(f"{why}.")
  try:
    Schedule(lengths, budget, config.seed, devices)
  except ValueError as e:
    raise UserError(f"config.token_budget={budget}: {e} (a multiple of the "
                    f"{devices} devices); raise it.") from None
