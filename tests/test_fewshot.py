"""Few-shot linear evaluation: the closed form, sampling, features, sweeps."""

import csv
import json
import os

import jax
import numpy as np
import pytest
from PIL import Image

from configs import fewshot as fewshot_configs
from vit_jax import models, sharding, steps, train, weights
from vit_jax.evaluators import fewshot
from vit_jax.fewshot import features, solver, sweep
from vit_jax.weights import export


def _data(n, d, k=4, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, d))
  return x, 2 * np.eye(k)[rng.integers(0, k, n)] - 1


@pytest.mark.parametrize("n, d", [(20, 50), (200, 30)])  # Dual; primal.
def test_closed_form_equals_direct_ridge(n, d):
  from sklearn.linear_model import Ridge
  x, y = _data(n, d)
  test = np.random.default_rng(1).normal(size=(9, d))
  grid = (0.1, 3.0, 100.0)
  scores, loo = solver._sweep(x, y, test, grid, np)  # pylint: disable=protected-access
  for g, l2 in enumerate(grid):
    for form in ("primal", "dual"):
      w = solver.ridge_weights(x, y, l2, form, xp=np)
      np.testing.assert_allclose(scores[g], test @ w, atol=1e-8)
    reference = Ridge(alpha=l2, fit_intercept=False).fit(x, y)
    np.testing.assert_allclose(scores[g], reference.predict(test), atol=1e-8)
    # Leave-one-out predictions equal refitting without that example.
    for i in (0, n - 1):
      keep = np.arange(n) != i
      w = solver.ridge_weights(x[keep], y[keep], l2, xp=np)
      np.testing.assert_allclose(loo[g, i], x[i] @ w, atol=1e-8)


def test_fp32_solver_agrees_with_float64():
  x, y = _data(50, 30)
  labels = y.argmax(-1)
  a = solver.fewshot_accuracy(x, labels, x, labels, 4, float64=False)
  b = solver.fewshot_accuracy(x, labels, x, labels, 4, float64=True)
  np.testing.assert_allclose(a.test_accuracy, b.test_accuracy)


def test_planted_linear_separation_is_recovered_perfectly():
  rng = np.random.default_rng(0)
  centers = rng.normal(size=(5, 64)) * 3
  labels = np.tile(np.arange(5), 40)
  feats = centers[labels] + 0.3 * rng.normal(size=(200, 64))
  results = solver.run_protocol(feats[:100], labels[:100], feats[100:],
                                labels[100:], 5, shots=(1, 5), seeds=2)
  assert results["5shot"] == 1.0 and results["full"] == 1.0


def test_shot_sampling():
  labels = np.repeat(np.arange(4), [5, 7, 3, 9])
  a = solver.sample_shots(labels, 3, seed=0, num_classes=4)
  np.testing.assert_array_equal(np.bincount(labels[a]), [3, 3, 3, 3])
  np.testing.assert_array_equal(a, solver.sample_shots(labels, 3, 0, 4))
  assert any(not np.array_equal(a, solver.sample_shots(labels, 3, s, 4))
             for s in (1, 2))
  with pytest.raises(ValueError, match="Class 2 has 3 training example"):
    solver.sample_shots(labels, 5, 0, 4)
  skipped = solver.sample_shots(labels, 5, 0, 4, on_too_few="skip")
  np.testing.assert_array_equal(np.bincount(labels[skipped]), [5, 5, 3, 5])


def _config(data_dir, **fewshot):
  config = fewshot_configs.get_config("runlocal")
  config.data_dir = data_dir
  config.fewshot.update(fewshot)
  return config


def test_sharded_extraction_equals_single_device(tfds_data_dir):
  config = _config(tfds_data_dir)
  model = models.build_model(config.model, None)
  out = []
  for devices in (1, 8):
    mesh = sharding.make_mesh(devices=jax.devices()[:devices])
    import optax
    state, shardings = steps.create_train_state(
        model, optax.identity(), 16, 0, mesh)
    evaluator = fewshot.FewShotEvaluator(model, config, mesh, shardings.params)
    out.append(evaluator.dataset_features(state.params, "digits"))
  assert out[0][0].shape == (1437, 16) and out[0][2].shape == (360, 16)
  for a, b in zip(out[0][:4], out[1][:4]):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_bad_layer_and_empty_datasets(tfds_data_dir):
  config = _config(tfds_data_dir)
  with pytest.raises(ValueError, match="available: pre_logits.*block_1"):
    features.check_layer("block_7", 2)
  config.fewshot.datasets = ()
  model = models.build_model(config.model, None)
  with pytest.raises(ValueError, match="config.fewshot.datasets is empty"):
    fewshot.FewShotEvaluator(model, config, sharding.make_mesh(), None)


def _image_folder(root):
  rng = np.random.default_rng(0)
  for split, count in (("train", 6), ("test", 3)):
    for c, name in enumerate(("dark", "light")):
      os.makedirs(root / split / name)
      for i in range(count):
        pixels = rng.integers(0, 100, (12, 12, 3)) + 150 * c
        Image.fromarray(pixels.astype(np.uint8)).save(
            root / split / name / f"{i}.png")
  return f"folder:{root}"


@pytest.mark.xdist_group("trained_digits")
def test_sweep_of_two_checkpoints_and_two_datasets(trained_digits,
                                                   tfds_data_dir, tmp_path):
  config = _config(tfds_data_dir, shots=(1, 5, 10), seeds=2,
                   on_too_few="skip")
  config.model.variant = "digits"
  # A second checkpoint: the same model at random init, as a released .npz.
  model = models.build_model(config.model, 10)
  random_init = model.init(jax.random.key(3), np.zeros((1, 16, 16, 3)))
  random_path = str(tmp_path / "random.npz")
  export.save_npz(random_init["params"], random_path)
  folder = _image_folder(tmp_path / "images")
  table = sweep.sweep(config, [trained_digits, random_path],
                      ["digits", folder])
  sweep.write(table, str(tmp_path / "out"))
  for path in (trained_digits, random_path):
    for dataset in ("digits", folder):
      cells = table[path][dataset]
      assert set(cells) >= {"1shot", "5shot", "10shot", "full"}
      assert all(0.0 <= v <= 1.0 for v in cells.values())
  trained, random = table[trained_digits]["digits"], table[random_path]["digits"]
  assert trained["10shot"] > 0.5 > 0.1  # Chance is 0.1.
  assert trained["10shot"] > random["10shot"]
  assert trained["full"] >= trained["10shot"] - 0.005, trained
  assert random["full"] >= random["10shot"], random
  with open(tmp_path / "out" / "fewshot.json") as f:
    assert json.load(f) == table
  with open(tmp_path / "out" / "fewshot.csv") as f:
    assert len(list(csv.reader(f))) == 1 + 2 * 2 * (3 * 2 + 1)
  text = sweep.format_table(table, (1, 5, 10))
  assert text.count("%") == 2 * 2 * 4


def test_checkpoint_of_another_model_is_refused(tfds_data_dir, tmp_path):
  config = _config(tfds_data_dir)
  other = models.build_model(config.model, 10).clone(hidden_size=32)
  params = other.init(jax.random.key(0), np.zeros((1, 16, 16, 3)))["params"]
  path = str(tmp_path / "wide.npz")
  export.save_npz(params, path)
  with pytest.raises(weights.WeightsError, match="SHAPE MISMATCH"):
    sweep.sweep(config, [path])


def test_periodic_fewshot_during_training(digits_config, tmp_path):
  digits_config.total_steps = 6
  digits_config.fewshot.update(dict(datasets=("digits",), shots=(1, 2),
                                    seeds=1, every_steps=3))
  result = train.train_and_evaluate(digits_config, str(tmp_path))
  assert {"fewshot/digits/1shot", "fewshot/digits/2shot",
          "fewshot/digits/full"} <= set(result)
