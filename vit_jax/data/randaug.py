"""RandAugment (Cubuk et al. 2020) as a preprocessing op: `randaug(N, M)`.

The policy is Keras 3's `keras.layers.RandAugment` (maintained with Keras,
which TensorFlow installs): N operations drawn uniformly from its 11
(shear, translation, rotation, brightness, colour, contrast, sharpness,
posterisation, solarisation, auto-contrast, equalisation), each at the
strength `factor`. AugReg's magnitude M (big_vision's 0-10 level scale,
where settings go up to 20) becomes `factor = M / 30`, so M = 30 is Keras's
strongest setting and every AugReg setting stays within Keras's range.

Two things are ours, neither changes what Keras computes:
- Seeds. Keras draws from a stateful `SeedGenerator`, which in a parallel
  `tf.data` map makes the output depend on thread timing, and a resumed
  run would see other images. Here every random draw of the layer comes
  from the example's own stateless seed instead (`_ExampleSeeds`), so the
  op is a pure function of (image, seed) like every other op.
- Dispatch. Keras applies all 11 operations and keeps the drawn one
  (`where`); `tf.switch_case` runs only the drawn one: the same pixels
  (tested) in a quarter of the time.

It runs inside tf.data on the host only (TensorFlow never sees an
accelerator, see `input_pipeline.hide_accelerators_from_tf`).
"""

import tensorflow as tf

# AugReg's magnitudes (0-20 on big_vision's 0-10 level scale) -> Keras's
# factor in [0, 1].
MAX_MAGNITUDE = 30.0


class _SeedSlot:
  """Holds the current example's seeds (a plain object, which Keras does
  not track as layer state)."""
  seeds = None


def _seeded_rand_augment_class():
  import keras  # pylint: disable=g-import-not-at-top  # Only where used.

  class ExampleSeeds(keras.random.SeedGenerator):
    """Stands in for Keras's SeedGenerator (no state variable): its n-th
    draw is the example's seed with n folded in."""

    def __init__(self, seed):  # pylint: disable=super-init-not-called
      self._seed, self._draws = seed, 0

    def next(self, ordered=True):
      del ordered
      self._draws += 1
      return tf.cast(tf.random.experimental.stateless_fold_in(
          self._seed, self._draws), tf.uint32)

  class SeededRandAugment(keras.layers.RandAugment):
    """Keras's RandAugment, its draws from `use_seed`'s seed."""

    def use_seed(self, seed):
      self._slot.seeds = ExampleSeeds(seed)

    def _get_seed_generator(self, backend=None):
      return self._slot.seeds

    def transform_images(self, images, transformation, training=True):
      """Keras's, with the drawn operation alone computed."""
      transforms = transformation["transforms"]
      chosen = tf.cast(transformation["layer_idxes"], tf.int32)
      images = tf.cast(images, self.compute_dtype)
      for i in range(self.num_ops):
        branches = [
            lambda name=name, x=images: tf.cast(getattr(
                self, name).transform_images(x, transforms[name]),
                                                 self.compute_dtype)
            for name in transforms]
        images = tf.switch_case(chosen[i], branches)
      return images

  return SeededRandAugment


def make_layer(num_ops: int = 2, magnitude: float = 10.0):
  """The layer of `randaug(num_ops, magnitude)`; build it outside tf.data's
  tracing (Keras creates variables in the constructor)."""
  factor = min(max(float(magnitude), 0.0) / MAX_MAGNITUDE, 1.0)
  layer = _seeded_rand_augment_class()(
      value_range=(0, 255), num_ops=int(num_ops), factor=factor)
  layer._slot = _SeedSlot()  # pylint: disable=protected-access
  return layer


def apply(layer, image, seed):
  """RandAugment of one HxWx3 image in [0, 255] with a stateless seed:
  float32, clipped to [0, 255]."""
  layer.use_seed(seed)
  batch = tf.cast(image, tf.float32)[None]  # Keras transforms batches.
  transformation = layer.get_random_transformation(batch, training=True)
  out = layer.transform_images(batch, transformation)[0]
  return tf.clip_by_value(tf.cast(out, tf.float32), 0.0, 255.0)
