"""tf.data input: per-process splits, preprocessing, batching, exact evaluation.

Each process reads a disjoint 1/N of every split and yields numpy batches of
its share of the global batch: `{"image": f32[b,H,W,3], "labels": f32[b,K],
"mask": f32[b]}`. `mask` is 1 for real examples and 0 for the padding that
fills the last evaluation batches, so every example is counted exactly once
with the same number of batches on every process (no recompilation).
TensorFlow runs on the host CPU only.
"""

import dataclasses
import math
from typing import Iterator

import jax
import ml_collections
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from vit_jax.data import digits  # Registers the built-in `digits` builder.
from vit_jax.data import preprocess

del digits
Batch = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
  """What the trainer needs to know about a dataset, read from its metadata."""
  num_classes: int
  num_train_examples: int
  num_eval_examples: int


def hide_accelerators_from_tf():
  """TensorFlow must never take accelerator memory: it only feeds the host."""
  tf.config.set_visible_devices([], "GPU")
  tf.config.set_visible_devices([], "TPU")


def get_builder(config: ml_collections.ConfigDict) -> tfds.core.DatasetBuilder:
  """Returns a prepared TFDS builder, with a clear error for an unknown name."""
  try:
    builder = tfds.builder(config.dataset, data_dir=config.data_dir)
  except tfds.core.registered.DatasetNotFoundError as e:
    raise ValueError(
        f"Unknown dataset {config.dataset!r}: TFDS has no builder of that "
        "name. Use a TFDS name (e.g. 'cifar10') or the built-in 'digits'."
    ) from e
  if not builder.is_prepared():
    builder.download_and_prepare()
  return builder


def get_info(config: ml_collections.ConfigDict,
             builder: tfds.core.DatasetBuilder) -> DatasetInfo:
  splits = builder.info.splits
  for split in (config.train_split, config.eval_split):
    try:
      splits[split]
    except (KeyError, ValueError) as e:
      raise ValueError(
          f"Dataset {config.dataset!r} has no split {split!r}; it has "
          f"{', '.join(splits)}.") from e
  return DatasetInfo(
      num_classes=builder.info.features["label"].num_classes,
      num_train_examples=splits[config.train_split].num_examples,
      num_eval_examples=splits[config.eval_split].num_examples)


def _per_process_batch(global_batch: int) -> int:
  if global_batch % jax.process_count():
    raise ValueError(f"Batch size {global_batch} is not divisible by the "
                     f"{jax.process_count()} processes.")
  return global_batch // jax.process_count()


def _example_fn(pp_spec: str, image_size: int, num_classes: int):
  image_fn = preprocess.make_image_fn(pp_spec, image_size)

  def fn(index, example, base_seed):
    seed = tf.random.experimental.stateless_fold_in(base_seed, index)
    return {"image": image_fn(example["image"], seed),
            "labels": tf.one_hot(example["label"], num_classes),
            "mask": tf.constant(1.0, tf.float32)}

  return fn


def make_train_iterator(config: ml_collections.ConfigDict,
                        builder: tfds.core.DatasetBuilder,
                        info: DatasetInfo) -> Iterator[Batch]:
  """Endless, shuffled, augmented batches of this process's share."""
  hide_accelerators_from_tf()
  seed = config.seed + 1000 * jax.process_index()
  split = tfds.split_for_jax_process(config.train_split, drop_remainder=True)
  ds = builder.as_dataset(
      split=split, shuffle_files=True,
      read_config=tfds.ReadConfig(shuffle_seed=seed))
  if config.cache:
    ds = ds.cache()
  ds = ds.repeat().shuffle(config.shuffle_buffer, seed=seed)
  base_seed = tf.constant([seed, 0], tf.int64)
  example_fn = _example_fn(config.pp_train, config.image_size, info.num_classes)
  ds = ds.enumerate().map(lambda i, ex: example_fn(i, ex, base_seed),
                          num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.batch(_per_process_batch(config.batch_size), drop_remainder=True)
  return iter(tfds.as_numpy(ds.prefetch(tf.data.AUTOTUNE)))


def num_eval_batches(config: ml_collections.ConfigDict,
                     builder: tfds.core.DatasetBuilder) -> int:
  """Batches per process: enough for the largest process share."""
  shares = tfds.even_splits(config.eval_split, n=jax.process_count())
  largest = max(builder.info.splits[s].num_examples for s in shares)
  return max(1, math.ceil(largest / _per_process_batch(config.eval_batch_size)))


def make_eval_dataset(config: ml_collections.ConfigDict,
                      builder: tfds.core.DatasetBuilder,
                      info: DatasetInfo) -> tf.data.Dataset:
  """One pass over this process's share, padded to a fixed number of batches."""
  hide_accelerators_from_tf()
  split = tfds.even_splits(config.eval_split,
                           n=jax.process_count())[jax.process_index()]
  ds = builder.as_dataset(split=split, shuffle_files=False)
  example_fn = _example_fn(config.pp_eval, config.image_size, info.num_classes)
  base_seed = tf.constant([config.seed, 1], tf.int64)
  ds = ds.enumerate().map(lambda i, ex: example_fn(i, ex, base_seed),
                          num_parallel_calls=tf.data.AUTOTUNE)
  if config.cache:
    ds = ds.cache()
  padding = tf.data.Dataset.from_tensors(  # mask 0: never counted.
      {k: tf.zeros(s.shape, s.dtype) for k, s in ds.element_spec.items()})
  local_batch = _per_process_batch(config.eval_batch_size)
  ds = ds.concatenate(padding.repeat()).batch(local_batch)
  return ds.take(num_eval_batches(config, builder)).prefetch(tf.data.AUTOTUNE)
