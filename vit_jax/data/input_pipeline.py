"""tf.data input: records by index, preprocessing, batching, exact evaluation.

Every function takes a data spec (`specs.DataSpec`: dataset, split,
preprocessing, batch). Training reads records by their index in the order
of `global_order.py`: each process takes its rows of every global batch,
so the stream is a pure function of (seed, step) and a resume is a seek.
TFDS datasets in TFRecord files are read in sequence instead, each process
its 1/N of the split, shuffled in a window (the console says once what
that costs and how to convert them). Each process yields numpy batches of
its share of the global batch: `{"image": f32[b,H,W,3], "labels": f32[b,K],
"mask": f32[b]}` (no "labels" where they are not read: self-supervised and
image-text training, unlabelled data), with the spec's text (`spec.text`)
as token ids: "text": int32[b,L], one caption per example drawn with its
seed, or all of them, "texts": int32[b,C,L] and "texts_mask": f32[b,C]
(`tokenizer.text_fn`). Training images are uint8 where the train step
finishes the pipeline (`handover.hands_over_uint8`). `mask` is 1 for real
examples and 0 for the padding that fills the last evaluation batches, so
every example is counted exactly once with the same number of batches on
every process (no recompilation). TensorFlow runs on the host CPU only.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
from typing import Iterator

import jax
import numpy as np

from vit_jax import console
from vit_jax import sharding
from vit_jax.config import imports
from vit_jax.data import global_order
from vit_jax.data import handover
from vit_jax.data import length_schedule
from vit_jax.data import preprocess
from vit_jax.data import sources
from vit_jax.data import specs
from vit_jax.data import tokenizer
from vit_jax.data import unreadable
from vit_jax.errors import UserError

tf = imports.lazy("tensorflow")  # Loaded where data is first read.

# tf.data traces our functions as written (AutoGraph off): they branch with
# tf.cond / tf.switch_case, so AutoGraph's rewriting of their source would
# only cost time at every start (about a second) and deprecation warnings of
# its AST library on Python 3.13.
_as_written = lambda fn: tf.autograph.experimental.do_not_convert(fn)

Batch = dict[str, np.ndarray]
make_source = sources.make_source


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
  """What the trainer needs to know about a dataset, read from its metadata."""
  num_classes: int  # 0: unlabelled.
  num_train_examples: int
  multi_label: bool = False


def hide_accelerators_from_tf():
  """TensorFlow must never take accelerator memory: it only feeds the host."""
  tf.config.set_visible_devices([], "GPU")
  tf.config.set_visible_devices([], "TPU")


def get_info(spec: specs.DataSpec, source) -> DatasetInfo:
  """The metadata of the training data `spec`."""
  return DatasetInfo(num_classes=source.num_classes,
                     num_train_examples=source.num_examples(
                         spec.split), multi_label=source.multi_label)


def _example_fn(spec: specs.DataSpec, source, base_seed, labels: bool):
  """Preprocesses one example; a label outside [0, K) fails loudly. Without
  `labels` the example's label (if any) is not read; with `spec.uint8` the
  pipeline's last op is left to the train step (`handover.DEVICE_OPS`);
  with `spec.text` its text (the example's "text") becomes token ids."""
  image_fn = preprocess.make_image_fn(
      spec.pp, spec.image_size, crop_on_decode=spec.crop_on_decode,
      crop_antialias=spec.crop_antialias,
      device_ops=handover.DEVICE_OPS if spec.uint8 else (),
      patch_size=spec.patch_size, sequence_length=spec.sequence_length)
  num_classes = source.num_classes
  if labels and not num_classes:
    raise UserError(f"{source.name} has no labels (it is unlabelled); only "
                    "an objective that reads no labels (self-supervised: "
                    "mae, masked_patch) trains on it.")
  text_fn = None
  if spec.text is not None:
    sources.check_text(source, spec.text)
    text_fn = tokenizer.text_fn(spec.text)

  def target(label):
    """The label as a target, and whether it is one of the classes (checked
    by `_checked_labels`, out of `skip_unreadable`'s reach)."""
    if source.multi_label:
      return tf.cast(label, tf.float32), None
    in_range = tf.logical_and(label >= 0, label < tf.cast(
        num_classes, label.dtype))
    return tf.one_hot(label, num_classes), in_range

  def fn(index, example):
    seed = tf.random.experimental.stateless_fold_in(base_seed, index)
    out = {
        "image": image_fn(example["image"], seed),
        "mask": tf.constant(1.0, tf.float32)
    }
    if labels:
      out["labels"], in_range = target(example["label"])
      if in_range is not None:
        out[_LABEL_IN_RANGE] = in_range
    if text_fn is not None:
      out.update(text_fn(example["text"], seed))
    return out

  return fn


_LABEL_IN_RANGE = "label_in_range"


def _checked_labels(source):
  """Fails loudly on a label outside [0, K) (a wrong label_key or class
  count, not a broken file); placeholders (mask 0) pass."""

  def check(example):
    example = dict(example)
    if _LABEL_IN_RANGE not in example:
      return example
    in_range = tf.logical_or(example.pop(_LABEL_IN_RANGE), example["mask"] == 0)
    with tf.control_dependencies([
        tf.debugging.Assert(in_range, [
            f"Label out of range for {source.name} with "
            f"{source.num_classes} classes"
        ])
    ]):
      example["labels"] = tf.identity(example["labels"])
    return example

  return check


# A record's index in the split (read by index), or its place in this
# process's share (read in sequence): names it in the unreadable files.
_RECORD = "record_in_share"


def _numbered(records: tf.data.Dataset) -> tf.data.Dataset:
  """Records numbered in their share's order (before any shuffle), which
  names one that cannot be decoded the same way in every epoch."""

  def numbered(i, record):
    return {**record, _RECORD: i}

  return records.enumerate().map(_as_written(numbered))


def _unreadable_log(spec: specs.DataSpec, source, split,
                    collector) -> unreadable.Unreadable:
  """The log of one process's `split` (as `source.process_split` gives
  it): its allowance is taken of that split's size."""
  return _log_of(spec, source, source.num_examples(split), collector)


def _log_of(spec: specs.DataSpec, source, per_pass: int,
            collector) -> unreadable.Unreadable:
  """The log of a stream that reads `per_pass` files a pass. Gathered by
  `collector` (an `unreadable.Collector`) where one is given."""
  made = collector.log if collector is not None else unreadable.Unreadable
  return made(f"{source.name} {spec.split}", per_pass,
              spec.max_unreadable_share)


def _examples(records: tf.data.Dataset, spec: specs.DataSpec, source, base_seed,
              labels: bool, log: unreadable.Unreadable,
              share: str = "") -> tf.data.Dataset:
  """(index, record) -> example, an unreadable file left out at its position
  (`unreadable.map_skipping_unreadable`) and named in `log` (a record of
  TFDS by its number, in `share` where numbered in a process's share). The
  files are read first, in parallel: only decoding is skipped over."""
  example_fn = _example_fn(spec, source, base_seed, labels)
  image_fn = preprocess.make_image_fn(spec.pp, spec.image_size,
                                      patch_size=spec.patch_size,
                                      sequence_length=spec.sequence_length)
  log.explain = lambda name: unreadable.why_unreadable(name, image_fn)

  def name(index, record):
    if "path" in record:  # An image folder's file.
      return record["path"]
    return tf.strings.join([  # The same record has the same in every epoch.
        f"{source.name} {spec.split} record #",
        tf.strings.as_string(record[_RECORD]), share
    ])

  fetch = getattr(source, "fetch", lambda record: record)
  records = records.map(_as_written(lambda i, record: (i, fetch(record))),
                        num_parallel_calls=tf.data.AUTOTUNE)

  def decoded(i, record):
    example = source.decode(record)
    if spec.text is not None:  # A TFDS feature, as the record has it.
      example = {**example, "text": sources.text_of(record, spec.text.key)}
    return example_fn(i, example)

  examples = unreadable.map_skipping_unreadable(records, decoded, name, log)
  return examples.map(_as_written(_checked_labels(source)))


def _options() -> tf.data.Options:
  options = tf.data.Options()
  options.autotune.enabled = True
  options.deterministic = True  # Same seed, same batches.
  return options


def make_train_dataset(spec: specs.DataSpec, source, process_index=None,
                       process_count=None, start_step: int = 0,
                       labels: bool = True, collector=None) -> tf.data.Dataset:
  """Endless, shuffled, augmented batches of this process's share (with
  `labels`, their one-hot or multi-hot labels).

  Read by index, the stream is a pure function of (seed, step) for any
  process count (`global_order.py`): starting at `start_step` reads that
  step's records first. From TFRecord files it is a function of the seed
  and the process count: epoch e shuffles this process's records in a
  window with seed (seed, e), the augmentation of its n-th example folds
  in n, and `start_step` skips the records already consumed (before
  decoding). Either way a resumed run sees exactly the same batches. An
  unreadable file becomes an example of mask 0 in its place
  (`unreadable.py`), named in the stream's log, which `collector` (an
  `unreadable.Collector`) gathers.
  """
  return _train_dataset(spec, source, process_index, process_count, start_step,
                        labels, collector)[0]


def check_start(spec: specs.DataSpec, start_step: int, steps: int = 1):
  """`steps` batches from `start_step` on are within the stream: its
  positions are int64 (`global_order.END`)."""
  batch = spec.batch_size
  if spec.sequence_lengths:  # The largest of the schedule's batches.
    batch = spec.token_budget // min(spec.sequence_lengths)
  last = global_order.last_step(batch)
  if 0 <= start_step <= last - steps + 1:
    return
  read = f" with the {steps} batches read from it" if steps > 1 else ""
  raise UserError(
      f"start_step={start_step}{read} goes past the stream's last step, "
      f"{last} (batches of {batch} images; positions are 64-bit integers): "
      f"give a start step from 0 to {max(last - steps + 1, 0)}.")


def _train_dataset(spec, source, process_index, process_count, start_step,
                   labels, collector):
  """`make_train_dataset`'s dataset, and its unreadable files' log."""
  check_start(spec, start_step)
  hide_accelerators_from_tf()
  index = jax.process_index() if process_index is None else process_index
  count = jax.process_count() if process_count is None else process_count
  if not source.reads_by_index:
    return _train_in_sequence(spec, source, index, count, start_step, labels,
                              collector)
  local_batch = sharding.local_batch_size(spec.batch_size, process_count=count)
  reader = source.index_reader(spec.split)
  order = global_order.Order(reader.size, spec.seed)
  # Each process reads from the whole split (another part each epoch), so
  # it may meet any of its unreadable files.
  log = _log_of(spec, source, reader.size, collector)
  if spec.sequence_lengths:  # One length per step, a batch per token budget.
    return _train_at_lengths(spec, source, reader, order, index, count,
                             start_step, labels, log), log

  def records_at(n):  # This process's n-th examples: their records.
    positions = global_order.position(n, local_batch, index, count)
    return positions, tf.numpy_function(order.records, [positions], tf.int64)

  first = start_step * local_batch  # A seek: nothing before it is read.
  ds = _read_by_index(tf.data.Dataset.range(first, global_order.END), reader,
                      records_at)
  # The augmentation folds in the stream position: the same for any number
  # of processes.
  ds = _examples(ds, spec, source, tf.constant([spec.seed, 0], tf.int64),
                 labels, log)
  ds = ds.batch(local_batch, drop_remainder=True)
  return ds.with_options(_options()).prefetch(tf.data.AUTOTUNE), log


def _train_at_lengths(spec, source, reader, order, index, count, start_step,
                      labels, log):
  """Batches of `length_schedule`'s steps from `start_step` on: a pipeline
  per length (its own sequence length and batch), chosen step by step."""
  schedule = length_schedule.Schedule(spec.sequence_lengths, spec.token_budget,
                                      spec.seed, jax.device_count())
  first = schedule.first_position(start_step)

  def steps():  # (step, its length's index, its first stream position).
    step, position = start_step, first
    while True:
      k = int(schedule.choices(np.array([step]))[0])
      yield step, k, position
      position += int(schedule.batches[k])
      step += 1

  def positions(k):  # This process's rows of the steps at length k.
    local = int(schedule.batches[k]) // count
    for _, chosen, position in steps():
      if chosen == k:
        start = position + index * local
        yield np.arange(start, start + local, dtype=np.int64)

  records_at = lambda p: (p, tf.numpy_function(order.records, [p], tf.int64))
  pipelines = []
  for k, length in enumerate(schedule.lengths):
    numbers = tf.data.Dataset.from_generator(
        functools.partial(positions, k), output_signature=tf.TensorSpec(
            [None], tf.int64)).unbatch()
    ds = _examples(_read_by_index(numbers, reader, records_at),
                   dataclasses.replace(spec, sequence_length=int(length)),
                   source, tf.constant([spec.seed, 0], tf.int64), labels, log)
    pipelines.append(
        ds.batch(int(schedule.batches[k]) // count, drop_remainder=True))
  chosen = tf.data.Dataset.from_generator(
      lambda: (k for _, k, _ in steps()), output_signature=tf.TensorSpec(
          [], tf.int64))
  ds = tf.data.Dataset.choose_from_datasets(pipelines, chosen)
  return ds.with_options(_options()).prefetch(tf.data.AUTOTUNE)


_READ_CHUNK = 256  # Records per read call: fewer calls cost less per record.


def _read_by_index(numbers: tf.data.Dataset, reader, records_at):
  """(position, record) pairs: `records_at` maps a vector of `numbers` to
  their positions (which seed the augmentation) and record indices,
  `reader` reads those (in chunks, many in flight) and parses each; the
  record carries its index in the split (`_RECORD`)."""

  def read(chunk):
    positions, indices = records_at(chunk)
    indices = tf.ensure_shape(indices, chunk.shape)
    return positions, {**reader.read(indices), _RECORD: indices}

  def parse(position, record):
    parsed = reader.parse({k: v for k, v in record.items() if k != _RECORD})
    return position, {**parsed, _RECORD: record[_RECORD]}

  ds = numbers.batch(_READ_CHUNK).map(_as_written(read),
                                      num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.unbatch()
  if reader.parse is None:  # Read as records already.
    return ds
  return ds.map(_as_written(parse), num_parallel_calls=tf.data.AUTOTUNE)


def _share_name(index: int, count: int) -> str:
  """Where a record numbered in a process's share is (names are counted
  across processes: `trainer._UnreadableReport`)."""
  return f" of process {index}'s share" if count > 1 else ""


_told_in_sequence = set()


def _train_in_sequence(spec, source, index, count, start_step, labels,
                       collector):
  """Training from TFRecord files: this process's share of the split,
  shuffled in a window; a resume skips through the epoch's records."""
  if spec.sequence_lengths:
    raise UserError("config.sequence_lengths reads each step's images by "
                    f"index, and {source.in_sequence_cost()}")
  if source.name not in _told_in_sequence:
    _told_in_sequence.add(source.name)
    console.say("%s", source.in_sequence_cost())
  local_batch = sharding.local_batch_size(spec.batch_size, process_count=count)
  seed = spec.seed + 1000 * index
  split = source.process_split(spec.split, index, count, drop_remainder=True)
  log = _unreadable_log(spec, source, split, collector)
  records = _numbered(source.read(split, shuffle_files=False, seed=seed))
  if spec.cache:
    records = records.cache()
  per_epoch = source.num_examples(split)
  buffer = min(spec.shuffle_buffer, per_epoch)

  def epoch(e):
    return records.shuffle(buffer, seed=seed * 1_000_003 + e,
                           reshuffle_each_iteration=False)

  first_example = start_step * local_batch
  first_epoch, offset = divmod(first_example, per_epoch)
  later_epochs = tf.data.Dataset.range(first_epoch + 1, 2**62)
  ds = epoch(tf.constant(first_epoch, tf.int64)).skip(offset).concatenate(
      later_epochs.flat_map(_as_written(epoch)))
  ds = _examples(ds.enumerate(start=first_example), spec, source,
                 tf.constant([seed, 0], tf.int64), labels, log,
                 _share_name(index, count))
  ds = ds.batch(local_batch, drop_remainder=True)
  return ds.with_options(_options()).prefetch(tf.data.AUTOTUNE), log


def make_train_iterator(spec: specs.DataSpec, source, start_step: int = 0,
                        labels: bool = True, collector=None) -> Iterator[Batch]:
  """The numpy batches of `make_train_dataset`; a one-line error when too
  many files are unreadable. Its pipeline stops when it is closed."""
  return unreadable.numpy_batches(
      *_train_dataset(spec, source, None, None, start_step, labels, collector))


def num_eval_batches(spec: specs.DataSpec, source) -> int:
  """Batches per process: enough for the largest process share."""
  size = source.num_examples(spec.split)  # A split it lacks: a clear error.
  count = jax.process_count()
  if source.reads_by_index:
    largest = global_order.largest_share(size, count)
  else:
    largest = max(
        source.num_examples(
            source.process_split(spec.split, i, count, drop_remainder=False))
        for i in range(count))
  local_batch = sharding.local_batch_size(
      spec.batch_size, what="eval_batch_size", process_count=count)
  return max(1, math.ceil(largest / local_batch))


def make_eval_dataset(spec: specs.DataSpec, source, process_index=None,
                      process_count=None, labels: bool = True,
                      collector=None) -> tf.data.Dataset:
  """One pass over this process's share, padded to a fixed number of batches
  (with `labels`, unreadable files and `collector` as in
  `make_train_dataset`)."""
  return _eval_dataset(spec, source, process_index, process_count, labels,
                       collector)[0]


def _eval_dataset(spec, source, process_index, process_count, labels,
                  collector):
  """`make_eval_dataset`'s dataset, and its unreadable files' log."""
  hide_accelerators_from_tf()
  index = jax.process_index() if process_index is None else process_index
  count = jax.process_count() if process_count is None else process_count
  local_batch = sharding.local_batch_size(
      spec.batch_size, what="eval_batch_size", process_count=count)
  if source.reads_by_index:  # This process's share, in the split's order.
    reader = source.index_reader(spec.split)
    start, stop = global_order.share(reader.size, index, count)
    log = _log_of(spec, source, stop - start, collector)
    ds = _read_by_index(tf.data.Dataset.range(start, stop), reader,
                        lambda numbers: (numbers, numbers))
    share = ""
  else:
    split = source.process_split(spec.split, index, count, drop_remainder=False)
    log = _unreadable_log(spec, source, split, collector)
    ds = _numbered(source.read(split, shuffle_files=False,
                               seed=spec.seed)).enumerate()
    share = _share_name(index, count)
  ds = _examples(ds, spec, source, tf.constant([spec.seed, 1], tf.int64),
                 labels, log, share)
  if spec.cache:
    ds = ds.cache()
  padding = tf.data.Dataset.from_tensors(  # mask 0: never counted.
      tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype),
                            ds.element_spec))
  ds = ds.concatenate(padding.repeat()).batch(local_batch)
  ds = ds.take(num_eval_batches(spec, source))
  return ds.with_options(_options()).prefetch(tf.data.AUTOTUNE), log


def numpy_eval_batches(spec: specs.DataSpec, source, process_index=None,
                       process_count=None, labels: bool = True, collector=None):
  """The numpy batches of one `make_eval_dataset` pass, with its unreadable
  files counted (and a one-line error past the allowance)."""
  return unreadable.numpy_batches(*_eval_dataset(
      spec, source, process_index, process_count, labels, collector))


class EvalBatches:
  """`batches()`: a fresh pass over the evaluation split at each call, all
  from one dataset, so with `spec.cache` the decoded split is read once
  and every later evaluation comes from memory. `num_examples`: the split's
  (all processes'), `unreadable`: this process's unreadable files."""

  def __init__(self, spec: specs.DataSpec, source, labels: bool = True,
               collector=None):
    self.num_examples = source.num_examples(spec.split)
    self._dataset, self.unreadable = _eval_dataset(spec, source, None, None,
                                                   labels, collector)

  def __call__(self) -> Iterator[Batch]:
    return unreadable.numpy_batches(self._dataset, self.unreadable)


def make_eval_batches(spec: specs.DataSpec, source, labels: bool = True,
                      collector=None) -> EvalBatches:
  return EvalBatches(spec, source, labels, collector)


def prefetch_to_device(batches: Iterator[Batch], mesh, size: int = 2):
  """Yields global sharded batches, keeping `size` transfers in flight.
  Closing it closes `batches` (which stops their input pipeline)."""
  queue = collections.deque()
  try:
    for batch in batches:
      queue.append(sharding.to_global_batch(batch, mesh))
      if len(queue) > size:
        yield queue.popleft()
    while queue:
      yield queue.popleft()
  finally:
    getattr(batches, "close", lambda: None)()
