"""NaViT's packing: several images at their own shape in one sequence. Each
packed image gets the logits it gets alone, what does not fit is counted,
token dropping keeps patches at their places, and packed training runs on
digits."""

import numpy as np
import pytest

from tests.test_models import images
from tests.test_models import run
from tests.test_models import tiny_model
from tests.test_models import trained_like
from vit_jax.data import packing
from vit_jax.errors import UserError
from vit_jax.loop import checks
from vit_jax.loop import trainer
from vit_jax.models import sequences

PATCH, LENGTH = 4, 24


def one_per_image(grids, seed=0):
  """A batch as patchify gives it: one padded sequence per image."""
  rng = np.random.default_rng(seed)
  parts = []
  for rows, cols in grids:
    image = rng.normal(size=(1, rows * PATCH, cols * PATCH, 3))
    seq = sequences.from_images(image.astype(np.float32), PATCH, LENGTH)
    parts.append([
        np.asarray(t[0])
        for t in (seq.patches, seq.coords, seq.segments, seq.grids)
    ])
  image = {
      k: np.stack([p[i] for p in parts]) for i, k in enumerate(sequences.FIELDS)
  }
  labels = np.eye(len(grids), dtype=np.float32)
  return {"image": image, "labels": labels, "mask": np.ones(len(grids))}


GRIDS = [(3, 5), (2, 2), (4, 6), (1, 7), (2, 3), (5, 1), (3, 3)]


def test_each_packed_image_gets_the_logits_it_gets_alone():
  batch = one_per_image(GRIDS)
  stats = packing.PackingStats()
  packed = packing.pack(batch, 32, 4, 3, stats)
  assert stats.dropped == 0 and stats.images == len(GRIDS)
  real = sum(r * c for r, c in GRIDS)
  assert stats.patches == real and stats.padding_share == 1 - real / (4 * 32)
  model = tiny_model(classifier="map", class_token=False)
  params = trained_like(model, images(), seed=5)
  alone, _ = run(model, params, sequences.as_sequence(batch["image"]))
  together, _ = run(model, params, sequences.as_sequence(packed["image"]))
  assert together.shape == (4, 3, 7)
  placed = packed["mask"] > 0
  assert placed.sum() == len(GRIDS)
  # Each slot's label names its image (one-hot of its index, 7 images).
  for s, k in zip(*np.nonzero(placed)):
    i = int(np.argmax(packed["labels"][s, k]))
    assert tuple(packed["image"]["grids"][s, k]) == GRIDS[i]
    np.testing.assert_allclose(together[s, k], alone[i], rtol=1e-5, atol=1e-5)


def test_what_does_not_fit_is_left_out_and_counted():
  batch = one_per_image(GRIDS)
  stats = packing.PackingStats()
  packed = packing.pack(batch, 24, 2, 8, stats)
  assert stats.dropped > 0
  assert packed["mask"].sum() == len(GRIDS) - stats.dropped
  assert (packed["image"]["segments"] > 0).sum() == stats.patches <= 48
  assert "left out for want of room" in stats.describe()


def test_token_dropping_keeps_a_share_at_their_places():
  batch = one_per_image([(4, 6)])
  stats = packing.PackingStats()
  packed = packing.pack(batch, 24, 1, 1, stats, token_drop=0.5,
                        rng=np.random.default_rng(0))
  kept = packed["image"]["segments"][0] > 0
  assert kept.sum() == 12
  coords = packed["image"]["coords"][0][kept]
  # The kept patches are the image's own, at their own (row, column).
  original = batch["image"]["patches"][0][coords[:, 0] * 6 + coords[:, 1]]
  np.testing.assert_array_equal(packed["image"]["patches"][0][kept], original)
  assert packed["image"]["grids"][0, 0].tolist() == [4, 6]


@pytest.mark.parametrize("change,match", [
    (dict(pp_train="inception_crop|value_range"), "must end with patchify"),
    (dict(length=8), "must hold an image at its largest"),
    (dict(classifier="token"), "pool each on its own"),
])
def test_packing_refuses_what_cannot_work(digits_config, change, match):
  config = digits_config
  config.sequence_length = 16
  config.pp_train = change.get("pp_train",
                               "resize_to_sequence|value_range|patchify")
  config.packing.length = change.get("length", 64)
  config.model.classifier = change.get("classifier", "gap")
  with pytest.raises(UserError, match=match):
    checks.check_fields(config)


def test_packed_training_runs_on_digits(digits_config, tmp_path):
  config = digits_config
  config.model.classifier = "gap"
  config.sequence_length = 16
  config.pp_train = ("aspect_crop(0.5)|resize_to_random_sequence(4)|"
                     "value_range|patchify")
  config.pp_eval = "resize_to_sequence|value_range|patchify"
  config.packing.length = 64
  config.packing.sequences = 8
  config.total_steps = 4
  metrics = trainer.train_and_evaluate(config, str(tmp_path / "packed"))
  assert np.isfinite(metrics["train/loss"])
  assert metrics["test/num_examples"] == 360
