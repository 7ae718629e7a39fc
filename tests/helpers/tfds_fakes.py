"""Fake TFDS datasets for tests, without downloads.

`write_metadata` gives a dataset split sizes (so split strings resolve as
on the real data); `mock_tfds` then serves, through the real builder and
its features, the examples a test hands over: its own (e.g. ReaL label
sets with an empty one) or `random_examples` (TFDS's random generator with
every variable length set to 10, so a CLEVR scene holds 10 objects, a
count VTAB maps to a valid class).
"""

import contextlib
import functools
import os

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds
from tensorflow_datasets.testing import mocking


def write_metadata(data_dir: str, name: str, sizes: dict[str, int]):
  """dataset_info.json of the TFDS builder `name` with these split sizes."""
  builder = tfds.builder(name, data_dir=data_dir)
  builder.info.set_splits(
      tfds.core.SplitDict([
          tfds.core.SplitInfo(name=k, shard_lengths=[v], num_bytes=0)
          for k, v in sizes.items()
      ]))
  os.makedirs(builder.data_dir, exist_ok=True)
  builder.info.write_to_directory(builder.data_dir)


def _valid_boxes(feature, value):
  """`value` with each bounding box's corners ordered (min <= max), as
  encoding requires and random numbers are not."""
  if isinstance(feature, tfds.features.BBoxFeature):
    corners = np.asarray(value).reshape(-1, 2, 2)  # (y, x) of two corners.
    return np.concatenate([corners.min(1), corners.max(1)], -1).reshape(
        np.shape(value))
  if isinstance(feature, tfds.features.Sequence):
    return _valid_boxes(feature.feature, value)  # Boxes of a sequence too.
  if isinstance(feature, tfds.features.FeaturesDict):
    return {k: _valid_boxes(feature[k], v) for k, v in value.items()}
  return value


def random_examples(count: int):
  """make_examples for `mock_tfds`: `count` random examples of any builder."""

  def make(builder, split):
    del split
    features = builder.info.features
    return [
        _valid_boxes(features, e) for e in mocking.RandomFakeGenerator(
            features, count, constant_dynamic_shape=True)
    ]

  return make


def _scalars(encoded):
  """Text encodes to 0-d object arrays, which tf.data does not take."""
  if isinstance(encoded, dict):
    return {k: _scalars(v) for k, v in encoded.items()}
  if isinstance(encoded, list):
    return [_scalars(v) for v in encoded]
  if isinstance(encoded, np.ndarray) and encoded.dtype == object:
    return encoded.tolist()
  return encoded


def _dataset(features, examples, decoders) -> tf.data.Dataset:
  """`examples` (feature dicts) as a builder's `_as_dataset` yields them."""
  specs = features.get_serialized_info()
  signature = tf.nest.map_structure(lambda s: tf.TensorSpec(s.shape, s.dtype),
                                    specs)
  examples = list(examples)
  ds = tf.data.Dataset.from_generator(
      lambda: (_scalars(features.encode_example(e)) for e in examples),
      output_signature=signature)
  return ds.map(functools.partial(features.decode_example, decoders=decoders))


@contextlib.contextmanager
def mock_tfds(data_dir: str, make_examples):
  """TFDS reads the metadata in `data_dir` and, for every split of every
  builder, the examples of `make_examples(builder, split)`."""

  def as_dataset(builder, split, decoders=None, **kwargs):
    del kwargs
    return _dataset(builder.info.features, make_examples(builder, split),
                    decoders)

  with tfds.testing.mock_data(policy=tfds.testing.MockPolicy.USE_FILES,
                              data_dir=data_dir, as_dataset_fn=as_dataset):
    yield
