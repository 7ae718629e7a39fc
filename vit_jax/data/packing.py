"""NaViT's packing ("Patch n' Pack"): several images in one sequence.

A training batch of images at their own shape arrives as one padded patch
sequence per image (`sequence_ops.patchify`). `pack` moves the patches of
each image into `sequences` sequences of `length` tokens, at most
`max_images` images each, first fit in decreasing size (the largest image
first, each into the first sequence with room). The model masks attention
to each image and pools each image on its own (`models.sequences`), so an
image's logits do not depend on its neighbours: the loss of a batch is the
same however its images are packed, and the batch is still a pure function
of the step (the global order's), for any number of processes.

What does not fit is left out of the step and counted (`PackingStats`):
give `sequences` enough room (config.packing). NaViT's token dropping
(`token_drop`) keeps a random share of each image's patches, at their own
(row, column) in the image's own grid, before packing. Plain numpy, on the
host, after tf.data.
"""

import dataclasses
import math

import numpy as np

from vit_jax.errors import UserError


@dataclasses.dataclass
class PackingStats:
  """Running totals over the packed batches of this process."""
  images: int = 0  # Images given (placeholders of unreadable files left out).
  dropped: int = 0  # Images left out for want of room.
  tokens: int = 0  # Token slots of the packed sequences.
  patches: int = 0  # Of those, holding a patch.

  @property
  def padding_share(self) -> float:
    return 1.0 - self.patches / self.tokens if self.tokens else 0.0

  def describe(self) -> str:
    return (f"{100 * self.padding_share:.1f}% of the packed tokens padding, "
            f"{self.dropped} of {self.images} images left out for want of "
            "room")


def pack(batch: dict, length: int, sequences: int, max_images: int,
         stats: PackingStats, token_drop: float = 0.0,
         rng: np.random.Generator = None) -> dict:
  """`batch` ({"image": a patch sequence per image (patches, coords,
  segments, grids with one slot), "labels", "mask", ...}) packed:
  {"image": `sequences` sequences of `length` with `max_images` slots,
  "labels": sequences x slots x classes, "mask": sequences x slots}."""
  image = batch["image"]
  real = np.flatnonzero(batch.get("mask", np.ones(len(image["segments"]))) > 0)
  keep = {}
  for i in real:
    where = np.flatnonzero(image["segments"][i] > 0)
    if token_drop > 0 and len(where) > 1:
      kept = max(1, int(round(len(where) * (1.0 - token_drop))))
      where = np.sort(rng.choice(where, kept, replace=False))
    keep[i] = where
  fill = np.zeros(sequences, np.int64)
  slots = np.zeros(sequences, np.int64)
  placed = []  # (image, sequence, slot, start).
  for i in sorted(keep, key=lambda i: (-len(keep[i]), i)):
    room = np.flatnonzero((fill + len(keep[i]) <= length) &
                          (slots < max_images))
    if not len(room):
      stats.dropped += 1
      continue
    s = room[0]
    placed.append((i, s, slots[s], fill[s]))
    fill[s] += len(keep[i])
    slots[s] += 1
  stats.images += len(real)
  stats.tokens += sequences * length
  stats.patches += int(fill.sum())
  return _gather(batch, keep, placed, length, sequences, max_images)


def _gather(batch, keep, placed, length, sequences, max_images):
  image = batch["image"]
  features = image["patches"].shape[-1]
  out = {
      "patches": np.zeros((sequences, length, features),
                          image["patches"].dtype),
      "coords": np.zeros((sequences, length, 2), image["coords"].dtype),
      "segments": np.zeros((sequences, length), image["segments"].dtype),
      "grids": np.zeros((sequences, max_images, 2), image["grids"].dtype),
  }
  labels = batch["labels"]
  packed = {
      "labels": np.zeros((sequences, max_images) + labels.shape[1:],
                         labels.dtype),
      "mask": np.zeros((sequences, max_images), np.float32),
  }
  for i, s, slot, start in placed:
    where = keep[i]
    end = start + len(where)
    out["patches"][s, start:end] = image["patches"][i, where]
    out["coords"][s, start:end] = image["coords"][i, where]
    out["segments"][s, start:end] = slot + 1
    out["grids"][s, slot] = image["grids"][i, 0]
    packed["labels"][s, slot] = labels[i]
    packed["mask"][s, slot] = 1.0
  return {"image": out, **packed}


def enabled(config) -> bool:
  return config.packing.length is not None


def sequences_per_batch(config, data_shards: int) -> int:
  """config.packing.sequences, or room for every image at its largest
  (batch_size * sequence_length / length), a multiple of `data_shards`."""
  if config.packing.sequences is not None:
    return config.packing.sequences
  needed = math.ceil(
      config.batch_size * (config.sequence_length or 0) / config.packing.length)
  return max(1, math.ceil(needed / data_shards)) * data_shards


def check_config(config):
  """What packing needs, said before anything compiles."""
  if not enabled(config):
    return
  p = config.packing
  last = config.pp_train.split("|")[-1].strip().split("(")[0]
  refusals = (
      (last != "patchify", f"config.pp_train={config.pp_train!r} must end "
       "with patchify: packing takes images at their own shape (e.g. "
       "'aspect_crop|flip_lr|resize_to_sequence|value_range|patchify')"),
      (not config.sequence_length or p.length < config.sequence_length,
       f"config.packing.length={p.length} must hold an image at its "
       f"largest: at least config.sequence_length={config.sequence_length}"),
      (p.max_images < 1, f"config.packing.max_images={p.max_images} must be "
       "positive"),
      (not 0 <= p.token_drop < 1, f"config.packing.token_drop={p.token_drop} "
       "is a share of each image's patches in [0, 1)"),
      (p.sequences is not None and p.sequences < 1,
       f"config.packing.sequences={p.sequences} must be positive"),
      (config.model.classifier == "token" or bool(config.model.class_token) or
       config.model.get("num_registers", 0), "packed images pool each on its "
       "own (classifier gap or map, no class token or registers)"),
  )
  for refused, why in refusals:
    if refused:
      raise UserError(f"{why}.")


def packed_batches(batches, config, local_sequences: int, process_index: int,
                   start_step: int, stats: PackingStats):
  """Each numpy training batch of this process packed as config.packing
  says, into `local_sequences` (its share); token dropping draws from a
  generator of (config.seed, step, process), so a resumed run drops the
  same patches."""
  p = config.packing
  for step, batch in enumerate(batches, start_step):
    rng = np.random.default_rng([config.seed, step, process_index])
    yield pack(batch, p.length, local_sequences, p.max_images, stats,
               p.token_drop, rng)
