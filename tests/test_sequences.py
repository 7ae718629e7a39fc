"""The ViT over patch sequences (NaFlex, NaViT): images at their own shape,
checked against the image path, a float64 numpy forward that runs each
image alone (tests/helpers/numpy_reference.py), PIL's antialiased resize,
and the properties masking promises."""

import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image
import pytest

from tests.helpers import numpy_reference as ref
from tests.test_models import images
from tests.test_models import run
from tests.test_models import tiny_model
from tests.test_models import trained_like
from vit_jax.models import sequences

PATCH = 4


def pack(image_list, length: int, slots: int):
  """One sequence of images (H x W x C each, multiples of PATCH), packed
  in order and padded to `length`, as numpy arrays."""
  patches, coords, segments, grids = [], [], [], np.zeros((slots, 2), np.int32)
  for k, image in enumerate(image_list):
    seq = sequences.from_images(image[None], PATCH)
    patches.append(np.asarray(seq.patches[0]))
    coords.append(np.asarray(seq.coords[0]))
    segments.append(np.full(seq.length, k + 1, np.int32))
    grids[k] = np.asarray(seq.grids[0, 0])
  pad = length - sum(len(s) for s in segments)
  rng = np.random.default_rng(len(image_list))  # Padding holds garbage.
  patches.append(rng.normal(size=(pad, patches[0].shape[1])) * 100)
  coords.append(rng.integers(0, 9, size=(pad, 2)))
  segments.append(np.zeros(pad, np.int32))
  join = lambda parts, dtype: np.concatenate(parts).astype(dtype)
  return (join(patches, np.float32), join(
      coords, np.int32), join(segments, np.int32), grids)


def batch_of(sequence_list) -> sequences.PatchSequence:
  return sequences.PatchSequence(
      *(jnp.asarray(np.stack(parts)) for parts in zip(*sequence_list)))


def mixed_images(seed=0):
  """Grids 3x5, 2x2 (shrinking the 4x4 table), 4x6 (growing it), 1x7."""
  rng = np.random.default_rng(seed)
  return [
      rng.normal(size=(h * PATCH, w * PATCH, 3)).astype(np.float32)
      for h, w in ((3, 5), (2, 2), (4, 6), (1, 7))
  ]


@pytest.mark.parametrize("posemb,classifier,class_token", [
    ("learn", "token", None),
    ("sincos2d", "gap", None),
    ("factorized", "map", True),
])
def test_a_square_image_as_a_sequence_gives_the_image_logits_exactly(
    posemb, classifier, class_token):
  """Operation by operation, bit for bit (compiled whole, XLA fuses the two
  programs differently: within 1e-6); padded to a longer sequence, within
  rounding."""
  model = tiny_model(posemb=posemb, classifier=classifier,
                     class_token=class_token)
  x = images()[:2]
  params = trained_like(model, x)
  expected, _ = model.apply({"params": params}, x)
  logits, _ = model.apply({"params": params}, sequences.from_images(x, PATCH))
  np.testing.assert_array_equal(logits, expected)
  compiled, _ = run(model, params, sequences.from_images(x, PATCH, length=23))
  np.testing.assert_allclose(compiled, expected, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("posemb,interpolation,classifier", [
    ("learn", "bilinear", "map"),
    ("learn", "bicubic", "gap"),
    ("factorized", "bilinear", "gap"),
    ("sincos2d", "bilinear", "map"),
])
def test_packed_sequences_match_the_numpy_reference_image_by_image(
    posemb, interpolation, classifier):
  """Two sequences of 32: 3x5 + 2x2 images and padding; 4x6 + 1x7."""
  model = tiny_model(posemb=posemb, classifier=classifier,
                     posemb_interpolation=interpolation)
  params = trained_like(model, images(), seed=2)
  a, b, c, d = mixed_images()
  batch = batch_of([pack([a, b], 32, 2), pack([c, d], 32, 2)])
  logits, _ = run(model, params, batch)
  assert logits.shape == (2, 2, 7)
  expected = ref.vit_sequence(
      params,
      *(np.asarray(t)
        for t in (batch.patches, batch.coords, batch.segments, batch.grids)),
      classifier=classifier, posemb=posemb, interpolation=interpolation)
  np.testing.assert_allclose(logits, expected, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("attention", ["explicit", "xla"])
def test_a_packed_image_gets_the_logits_it_gets_alone(attention):
  model = tiny_model(classifier="map", class_token=False, attention=attention)
  params = trained_like(model, images(), seed=3)
  a, b, c, _ = mixed_images(seed=1)
  packed, _ = run(model, params, batch_of([pack([a, b, c], 48, 3)]))
  for k, image in enumerate((a, b, c)):
    alone, _ = run(model, params, batch_of([pack([image], 24, 1)]))
    np.testing.assert_allclose(packed[0, k], alone[0], rtol=1e-5, atol=1e-5)


def test_padding_and_empty_slots_change_nothing_and_stay_finite():
  """Garbage in the padding, or a slot with no image, leaves every image's
  logits as they were (to float rounding: with another number of slots
  XLA may sum the pooling in another order on some CPUs, 2.4e-7 on a
  2.5 GHz Xeon; garbage let through would move them by orders more); an
  empty slot's are finite."""
  model = tiny_model(classifier="gap", class_token=False)
  params = trained_like(model, images(), seed=4)
  a, b, _, _ = mixed_images(seed=2)
  one, _ = run(model, params, batch_of([pack([a, b], 30, 2)]))
  patches, coords, segments, grids = pack([a, b], 30, 3)
  patches[segments == 0] *= -7.0
  more, _ = run(model, params, batch_of([(patches, coords, segments, grids)]))
  np.testing.assert_allclose(more[0, :2], one[0], rtol=0, atol=1e-6)
  assert np.isfinite(np.asarray(more)).all()


@pytest.mark.parametrize("method,pil_filter", [("bilinear", Image.BILINEAR),
                                               ("bicubic", Image.BICUBIC)])
@pytest.mark.parametrize("grid", [(3, 7), (16, 2), (5, 5)])
def test_each_image_reads_its_table_as_pil_resizes_it(method, pil_filter, grid):
  """A 5x5 table resized (antialiased) to each image's grid, channel by
  channel, by PIL's float images."""
  table = np.random.default_rng(5).normal(size=(5, 5, 3)).astype(np.float32)
  h, w = grid
  rows, cols = np.divmod(np.arange(h * w), w)
  coords = jnp.asarray(np.stack([rows, cols], -1)[None], jnp.int32)
  at = sequences.learned_at(jnp.asarray(table), coords,
                            jnp.broadcast_to(jnp.asarray(grid), coords.shape),
                            method)
  expected = np.stack([
      np.asarray(
          Image.fromarray(table[..., c], mode="F").resize((w, h), pil_filter))
      for c in range(3)
  ], axis=-1)
  np.testing.assert_allclose(
      np.asarray(at[0]).reshape(h, w, 3), expected, atol=2e-5)


def test_the_same_grid_reads_the_table_unchanged():
  table = jax.random.normal(jax.random.key(0), (4, 6, 8))
  coords = sequences.grid_coords(4, 6)
  for method in sequences.INTERPOLATIONS:
    at = sequences.learned_at(table, coords,
                              jnp.full((1, 24, 2), jnp.array([4, 6])), method)
    np.testing.assert_array_equal(at[0], table.reshape(24, 8))


def test_a_sequence_reads_position_embeddings_an_image_made():
  model = tiny_model()
  with pytest.raises(ValueError, match="square image"):
    model.init(jax.random.key(0), sequences.from_images(images(), PATCH))


def test_packing_refuses_a_class_token():
  model = tiny_model(classifier="gap", class_token=True)
  params = trained_like(model, images())
  a, b, _, _ = mixed_images()
  with pytest.raises(ValueError, match="class token"):
    model.apply({"params": params}, batch_of([pack([a, b], 32, 2)]))
