"""Images at their own shape, on the host: the sequence-length search
against its definition, patchify against the model's own cutting, the
aspect-keeping crop, the pipeline's uint8 hand-over and its refusals."""

from fractions import Fraction
import math

import numpy as np
import pytest
import tensorflow as tf

from vit_jax.data import handover
from vit_jax.data import preprocess
from vit_jax.data import sequence_ops
from vit_jax.errors import UserError
from vit_jax.models import sequences


def grid_by_definition(height, width, patch, length):
  """big_vision's definition, exactly: the grid at ratio r is (max(1,
  ceil(h r / P)), max(1, ceil(w r / P))); the answer is the grid at the
  largest r whose grid has at most `length` patches. The grid only changes
  where h r / P or w r / P is a whole number, so every such r is tried (in
  exact fractions)."""
  breaks = {Fraction(k * patch, height) for k in range(1, length + 2)}
  breaks |= {Fraction(k * patch, width) for k in range(1, length + 2)}
  side = lambda size, r: max(1, math.ceil(size * r / patch))
  best = None
  for r in sorted(breaks):
    rows, cols = side(height, r), side(width, r)
    if rows * cols <= length:
      best = (rows, cols)
  return best


def grid_by_bisection(height, width, patch, length, eps=1e-5):
  """big_vision's own procedure (a float binary search over the ratio, at
  most 100), written from its description, to show that it agrees (except
  where an image is so small that the grid needs more than 100x)."""
  low, high = eps / 10, 100.0
  sides = lambda r: [
      max(patch, patch * math.ceil(s * r / patch)) // patch
      for s in (height, width)
  ]
  while high - low >= eps:
    mid = (low + high) / 2
    rows, cols = sides(mid)
    low, high = (mid, high) if rows * cols <= length else (low, mid)
  return tuple(sides(low))


SHAPES = [(224, 224), (480, 640), (640, 480), (37, 1000), (1000, 37),
          (333, 500), (7, 9), (1, 1), (300, 10), (123, 456), (512, 384)]


@pytest.mark.parametrize("patch,length", [(16, 256), (14, 196), (16, 128),
                                          (4, 20), (16, 1)])
def test_the_sequence_grid_is_the_largest_within_the_length(patch, length):
  for height, width in SHAPES:
    expected = grid_by_definition(height, width, patch, length)
    assert sequence_ops.sequence_grid(height, width, patch,
                                      length) == expected, (height, width)
    in_tf = sequence_ops.sequence_grid(tf.constant(height), tf.constant(width),
                                       patch, length)
    assert tuple(int(v) for v in in_tf) == expected, (height, width)


def test_the_grid_agrees_with_big_visions_bisection_and_golden_values():
  assert sequence_ops.sequence_grid(480, 640, 16, 256) == (14, 18)
  assert sequence_ops.sequence_grid(224, 224, 16, 256) == (16, 16)
  assert sequence_ops.sequence_grid(37, 1000, 16, 256) == (3, 82)
  for height, width in [s for s in SHAPES if s != (1, 1)]:
    for patch, length in ((16, 256), (16, 576), (14, 196)):
      assert (sequence_ops.sequence_grid(height, width, patch,
                                         length) == grid_by_bisection(
                                             height, width, patch, length))


def run_pipeline(spec, image, length=24, patch=4, **kwargs):
  fn = preprocess.make_image_fn(spec, 16, patch_size=patch,
                                sequence_length=length, **kwargs)
  out = fn(tf.constant(image), tf.constant([3, 4], tf.int64))
  return {k: v.numpy() for k, v in out.items()}


def test_patchify_cuts_as_the_model_does_and_pads():
  image = np.random.default_rng(0).integers(0, 255, (12, 20, 3), np.uint8)
  out = run_pipeline("patchify", image, length=24)
  assert out["patches"].shape == (24, 48) and out["grids"].tolist() == [[3, 5]]
  ours = sequences.from_images(image[None].astype(np.float32), 4, length=24)
  np.testing.assert_array_equal(out["patches"], ours.patches[0])
  np.testing.assert_array_equal(out["coords"], ours.coords[0])
  np.testing.assert_array_equal(out["segments"], ours.segments[0])
  assert out["segments"].sum() == 15 and not out["patches"][15:].any()


def test_resize_to_sequence_keeps_the_aspect_ratio_up_to_whole_patches():
  image = np.zeros((30, 100, 3), np.uint8)
  out = run_pipeline("resize_to_sequence|patchify", image, length=24)
  rows, cols = out["grids"][0]
  assert (rows, cols) == sequence_ops.sequence_grid(30, 100, 4, 24) == (3, 8)
  # Each side rounds up to whole patches: at most one patch's worth.
  assert abs((cols / rows) / (100 / 30) - 1) < 1 / rows + 1 / cols
  assert out["segments"].sum() == rows * cols


def test_uint8_hand_over_gives_the_float_pipelines_values():
  image = np.random.default_rng(1).integers(0, 255, (10, 30, 3), np.uint8)
  spec = "resize_to_sequence|value_range|patchify"
  floats = run_pipeline(spec, image)
  uint8 = run_pipeline(spec, image, device_ops=handover.DEVICE_OPS)
  assert uint8["patches"].dtype == np.uint8
  on_device = np.asarray(handover.images_in_value_range(uint8)["patches"])
  valid = floats["segments"] > 0
  np.testing.assert_allclose(on_device[valid], floats["patches"][valid],
                             atol=1 / 127.5 + 1e-6)


def test_aspect_crop_keeps_the_aspect_ratio_and_the_area_range():
  image = tf.zeros((60, 150, 3), tf.uint8)
  crop = sequence_ops.aspect_crop(0.25)
  areas = []
  for seed in range(20):
    h, w, _ = crop(image, tf.constant([seed, 0], tf.int64)).shape
    assert abs(w / h - 2.5) < 2.5 / h + 1 / h
    areas.append(h * w / (60 * 150))
  assert 0.24 <= min(areas) and max(areas) <= 1.0 and max(areas) > 0.6


@pytest.mark.parametrize("spec,match", [
    ("patchify|value_range", "last op"),
    ("resize_to_sequence|patchify", "sequence length"),
])
def test_sequence_pipelines_refuse_what_cannot_work(spec, match):
  with pytest.raises(UserError, match=match):
    preprocess.parse(spec, 16, patch_size=4,
                     sequence_length=None if "length" in match else 24)
