"""The order of the training records, read by index: a pure function of
(seed, step), whatever the number of processes.

Epoch e is a seeded permutation of the split's N records (numpy's
Generator seeded with (seed, e)); the stream is epoch 0, epoch 1, ... one
after another. Global batch b holds positions b*B to (b+1)*B - 1 of the
stream, and process p of P takes rows p*B/P to (p+1)*B/P - 1 of each. So
the records of step s are known without reading any before them: a resumed
run seeks (it computes one epoch's permutation, well under a second for
14M records), and a run on another number of processes continues the same
global sequence. Evaluation reads each process's contiguous share of the
split in order (`share`), every record once.
"""

from __future__ import annotations

import collections
import threading

import numpy as np

# The stream's positions are int64 and stay below END (each process's
# example numbers too): a start past it is refused (`input_pipeline`).
END = 2**62


def last_step(batch_size: int) -> int:
  """The last step whose batch of `batch_size` the stream holds."""
  return END // batch_size - 1


def position(local_example, local_batch: int, process_index: int,
             process_count: int):
  """The stream position of this process's n-th training example (numpy or
  tf integers): its row of global batch n // local_batch."""
  step, row = local_example // local_batch, local_example % local_batch
  return step * (local_batch *
                 process_count) + process_index * local_batch + row


def share(size: int, index: int, count: int) -> tuple[int, int]:
  """[start, stop) of process `index`'s share of `size` records (shares
  differ by at most one record)."""
  return size * index // count, size * (index + 1) // count


def largest_share(size: int, count: int) -> int:
  return max(b - a for a, b in (share(size, i, count) for i in range(count)))


class Order:
  """Stream positions -> record indices of a split of `size` records.

  Keeps the permutations of the last two epochs it was asked for (a batch
  may straddle two), computed on demand; safe to call from tf.data's
  parallel threads.
  """

  _KEPT = 2

  def __init__(self, size: int, seed: int):
    if size < 1:
      raise ValueError(f"An order of {size} records")
    self.size, self.seed = size, seed
    self._epochs = collections.OrderedDict()
    self._lock = threading.Lock()

  def permutation(self, epoch: int) -> np.ndarray:
    """The records of `epoch` in the order it reads them."""
    with self._lock:
      if epoch in self._epochs:
        self._epochs.move_to_end(epoch)
        return self._epochs[epoch]
    # Seeded by (seed, epoch): never the same order twice, and a seed's
    # epochs are independent of each other (numpy's SeedSequence).
    rng = np.random.default_rng([self.seed % 2**63, epoch])
    dtype = np.int32 if self.size < 2**31 else np.int64  # Half the memory.
    order = rng.permutation(self.size).astype(dtype)
    with self._lock:
      self._epochs[epoch] = order
      while len(self._epochs) > self._KEPT:
        self._epochs.popitem(last=False)
    return order

  def records(self, positions: np.ndarray) -> np.ndarray:
    """int64 record indices of the stream's `positions` (int64, >= 0)."""
    positions = np.asarray(positions, np.int64)
    epochs, within = np.divmod(positions, self.size)
    out = np.empty_like(positions)
    for epoch in np.unique(epochs):
      at = epochs == epoch
      out[at] = self.permutation(int(epoch))[within[at]]
    return out
