"""Few-shot linear evaluation: the closed form, sampling, features, sweeps."""

import csv
import json
import os

import jax
import numpy as np
from PIL import Image
import pytest

from configs import fewshot as fewshot_configs
from tests.helpers import tiny_models
from vit_jax import models
from vit_jax import sharding
from vit_jax import weights
from vit_jax.fewshot import evaluator as fewshot_evaluator
from vit_jax.fewshot import features
from vit_jax.fewshot import solver
from vit_jax.fewshot import sweep
from vit_jax.loop import checks
from vit_jax.loop import trainer
from vit_jax.training import train_state


def _data(n, d, k=4, seed=0):
  """Features with uneven scales and offsets (standardisation matters)."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, d)) * rng.uniform(0.5, 3, d) + rng.normal(size=d)
  return x, rng.integers(0, k, n)


def _protocol_scores(x, labels, test, l2, k=4):
  """big_vision's protocol written out, fitted by scikit-learn's Ridge."""
  from sklearn.linear_model import Ridge
  mean, std = x.mean(0), x.std(0) + 1e-5
  augment = lambda v: np.concatenate([(v - mean) / std,
                                      np.full((len(v), 1), 100.0)], axis=1)
  targets = 2 * np.eye(k)[labels] - 1
  ridge = Ridge(alpha=l2, fit_intercept=False).fit(augment(x), targets)
  return ridge.predict(augment(test))


@pytest.mark.parametrize("n, d", [(20, 50), (200, 30)])  # Dual; primal.
def test_solver_equals_the_protocol_fitted_by_sklearn(n, d):
  x, labels = _data(n, d)
  test, test_labels = _data(60, d, seed=1)
  grid = (0.25, 16.0, 1024.0)
  accuracy = solver.accuracy_per_l2(x, labels, test, test_labels, 4, grid,
                                    float64=True)
  want = [
      np.mean(_protocol_scores(x, labels, test, l2).argmax(-1) == test_labels)
      for l2 in grid
  ]
  np.testing.assert_array_equal(accuracy, want)
  # fp32 may flip a near-tie at the weakest L2: at most one test example.
  np.testing.assert_allclose(
      solver.accuracy_per_l2(x, labels, test, test_labels, 4, grid), want,
      atol=1.01 / len(test))


@pytest.mark.parametrize("n, d", [(30, 50), (60, 8)])
def test_leave_one_out_equals_refitting_without_each_example(n, d):
  """Each held-out example is predicted from the others, standardised with
  their statistics alone (nothing of it leaks)."""
  x, labels = _data(n, d)
  grid = (0.25, 16.0, 1024.0)
  loo = solver.loo_accuracy(x, labels, 4, grid, float64=True)
  want = []
  for l2 in grid:
    correct = 0
    for i in range(n):
      keep = np.arange(n) != i
      scores = _protocol_scores(x[keep], labels[keep], x[i:i + 1], l2)
      correct += scores.argmax(-1)[0] == labels[i]
    want.append(correct / n)
  np.testing.assert_allclose(loo, want)
  np.testing.assert_allclose(solver.loo_accuracy(x, labels, 4, grid), want,
                             atol=1.01 / n)


def test_leave_one_out_on_noise_is_chance_and_refuses_one_shot():
  """Pure-noise features: leave-one-out must not score them well at any
  L2 (a leaky estimate once gave 1.0 at 1 shot), and at 1 shot, where no
  example has a classmate to learn from, the fixed L2 is used and said."""
  rng = np.random.default_rng(0)
  classes, dim = 10, 256
  labels = np.repeat(np.arange(classes), 5)
  noise = rng.normal(size=(len(labels), dim))
  loo = solver.loo_accuracy(noise, labels, classes, solver.DEFAULT_L2_GRID)
  assert loo.max() < 0.35, loo  # Chance is 0.1.
  one_shot = np.arange(classes)
  result = solver.fewshot_accuracy(noise[one_shot], one_shot, noise, labels,
                                   classes, l2_selection="loo")
  assert result.loo_accuracy is None and result.l2 == solver.FIXED_L2
  assert "used the fixed L2 1024" in result.note
  metrics, notes = solver.run_protocol(
      noise, labels, noise, labels, classes,
      solver.Protocol(shots=(1, 3), seeds=2, l2_selection="loo"))
  assert notes == [
      "1shot: leave-one-out needs two examples of a class; "
      "used the fixed L2 1024"
  ]
  assert metrics["1shot_l2"] == solver.FIXED_L2
  assert metrics["3shot_l2"] in solver.DEFAULT_L2_GRID


def test_fp32_solver_agrees_with_float64():
  x, labels = _data(50, 30)
  grid = solver.DEFAULT_L2_GRID
  np.testing.assert_array_equal(
      solver.accuracy_per_l2(x, labels, x, labels, 4, grid),
      solver.accuracy_per_l2(x, labels, x, labels, 4, grid, float64=True))


def test_planted_linear_separation_is_recovered_perfectly():
  rng = np.random.default_rng(0)
  centers = rng.normal(size=(5, 64)) * 3
  labels = np.tile(np.arange(5), 40)
  feats = centers[labels] + 0.3 * rng.normal(size=(200, 64))
  for selection in solver.L2_SELECTIONS:
    results, _ = solver.run_protocol(
        feats[:100], labels[:100], feats[100:], labels[100:], 5,
        solver.Protocol(shots=(1, 5), seeds=2, l2_selection=selection))
    assert results["5shot"] == 1.0 and results["full"] == 1.0, selection


def test_full_probe_fits_in_8_gib_at_imagenet_scale():
  """128,000 x 1,024 features and 1,000 classes (the 1k-class probe of a
  ViT-L): compiled, not run; per-device bytes from XLA's memory analysis."""
  n, d, k, m = 128_000, 1_024, 1_000, 50_000
  f32 = lambda *shape: jax.ShapeDtypeStruct(shape, np.float32)
  i32 = lambda *shape: jax.ShapeDtypeStruct(shape, np.int32)
  for fn, args in ((solver._fit_and_count, (f32(
      n, d), i32(n), f32(m, d), i32(m), f32(1))), (solver._loo_correct, (f32(
          n, d), i32(n), i32(256), f32(10)))):
    stats = fn.lower(*args, num_classes=k).compile().memory_analysis()
    total = (stats.argument_size_in_bytes + stats.output_size_in_bytes +
             stats.temp_size_in_bytes)
    assert total < 8 * 2**30, (fn.__name__, total / 2**30)
    # Nothing N x K (0.5 GB) or G x N x K is kept: temporaries stay near one
    # copy of the features.
    assert stats.temp_size_in_bytes < 2.5 * n * d * 4, fn.__name__


def test_shot_sampling():
  labels = np.repeat(np.arange(4), [5, 7, 3, 9])
  a = solver.sample_shots(labels, 3, seed=0, num_classes=4)
  np.testing.assert_array_equal(np.bincount(labels[a]), [3, 3, 3, 3])
  np.testing.assert_array_equal(a, solver.sample_shots(labels, 3, 0, 4))
  assert any(not np.array_equal(a, solver.sample_shots(labels, 3, s, 4))
             for s in (1, 2))
  # Nested, as big_vision samples: a seed's 1-shot sample is in its 3-shot.
  assert set(solver.sample_shots(labels, 1, 0, 4)) <= set(a)
  with pytest.raises(ValueError, match="Class 2 has 3 training example"):
    solver.sample_shots(labels, 5, 0, 4)
  skipped = solver.sample_shots(labels, 5, 0, 4, on_too_few="skip")
  np.testing.assert_array_equal(np.bincount(labels[skipped]), [5, 5, 3, 5])
  with pytest.raises(ValueError, match="on_too_few='drop' is not one of"):
    solver.sample_shots(labels, 5, 0, 4, on_too_few="drop")


def _config(data_dir, **fewshot):
  config = fewshot_configs.get_config("runlocal")
  config.data_dir = data_dir
  config.fewshot.update(fewshot)
  return config


def test_sharded_extraction_equals_single_device(tfds_data_dir):
  config = _config(tfds_data_dir)
  model = models.build_model(weights.decide(config).model, None)
  out = []
  for devices in (1, 8):
    mesh = sharding.make_mesh(devices=jax.devices()[:devices])
    import optax
    state, shardings = train_state.create_train_state(model, optax.identity(),
                                                      16, 0, mesh)
    evaluator = fewshot_evaluator.from_protocol(model, config, mesh,
                                                shardings.params)
    out.append(evaluator.dataset_features(state.params, "digits"))
  assert out[0][0].shape == (1437, 16) and out[0][2].shape == (360, 16)
  for a, b in zip(out[0][:4], out[1][:4]):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_bad_layer_empty_datasets_and_unknown_policies(tfds_data_dir):
  config = _config(tfds_data_dir)
  model = models.build_model(weights.decide(config).model, None)
  for field, value in (("on_too_few", "drop"), ("l2_selection", "cv")):
    bad = _config(tfds_data_dir, **{field: value})
    with pytest.raises(ValueError, match=f"config.fewshot.{field}="):
      fewshot_evaluator.from_protocol(model, bad, sharding.make_mesh(), None)
    with pytest.raises(ValueError, match=f"config.fewshot.{field}="):
      checks.check_config(bad, sharding.make_mesh())
  with pytest.raises(ValueError, match="available: pre_logits.*block_1"):
    features.check_layer("block_7", 2)
  config.fewshot.datasets = ()
  with pytest.raises(ValueError, match="config.fewshot.datasets is empty"):
    fewshot_evaluator.from_protocol(model, config, sharding.make_mesh(), None)


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
  config = _config(tfds_data_dir, shots=(1, 5, 10), seeds=2, on_too_few="skip")
  config.model.variant = "digits"
  # A second checkpoint: the same model at random init, as a released .npz.
  model = models.build_model(weights.decide(config).model, 10)
  random_init = jax.jit(model.init)(jax.random.key(3), np.zeros((1, 16, 16, 3)))
  random_path = str(tmp_path / "random.npz")
  weights.save_npz(random_init["params"], random_path)
  folder = _image_folder(tmp_path / "images")
  table, notes = sweep.sweep(config, [trained_digits, random_path],
                             ["digits", folder])
  assert not notes  # The fixed L2 of the published protocol throughout.
  sweep.write(table, str(tmp_path / "out"))
  for path in (trained_digits, random_path):
    for dataset in ("digits", folder):
      cells = table[path][dataset]
      assert set(cells) >= {"1shot", "5shot", "10shot", "full"}
      assert all(
          0.0 <= v <= 1.0 for c, v in cells.items() if not c.endswith("_l2"))
      assert cells["5shot_l2"] == cells["full_l2"] == 2.0**10
  trained, random = table[trained_digits]["digits"], table[random_path][
      "digits"]
  assert trained["10shot"] > 0.5 > 0.1  # Chance is 0.1.
  assert trained["10shot"] > random["10shot"]
  assert trained["full"] >= trained["10shot"] - 0.005, trained
  assert random["full"] >= random["10shot"], random
  with open(tmp_path / "out" / "fewshot.json") as f:
    assert json.load(f) == table
  with open(tmp_path / "out" / "fewshot.csv") as f:
    assert len(list(csv.reader(f))) == 1 + 2 * 2 * (3 * 3 + 2)
  text = sweep.format_table(table, (1, 5, 10))
  assert text.count("%") == 2 * 2 * 4


def test_checkpoint_of_another_model_is_refused(tfds_data_dir, tmp_path):
  config = _config(tfds_data_dir)
  other = tiny_models.with_size(
      models.build_model(weights.decide(config).model, 10), hidden_size=32)
  params = jax.jit(other.init)(jax.random.key(0), np.zeros(
      (1, 16, 16, 3)))["params"]
  path = str(tmp_path / "wide.npz")
  weights.save_npz(params, path)
  with pytest.raises(weights.WeightsError,
                     match="no entry of models/variants.py describes"):
    sweep.sweep(config, [path])


def test_periodic_fewshot_during_training(digits_config, tmp_path):
  """The default config's `fewshot` entry runs once it names datasets (what
  --config.evals.fewshot.datasets does), with config.fewshot's protocol."""
  digits_config.total_steps = 6
  digits_config.fewshot.update(dict(shots=(1, 2), seeds=1))
  digits_config.evals.fewshot.datasets = ("digits",)
  digits_config.evals.fewshot.every_steps = 3
  result = trainer.train_and_evaluate(digits_config, str(tmp_path))
  assert {
      "fewshot/digits/1shot", "fewshot/digits/2shot", "fewshot/digits/full"
  } <= set(result)


def test_datasets_with_their_own_splits_and_preprocessing(tfds_data_dir):
  config = _config(tfds_data_dir,
                   datasets=(("digits", "train[:300]", "test[:100]"),),
                   pp_eval="resize(20)|central_crop|value_range")
  model = models.build_model(weights.decide(config).model, None)
  import optax
  mesh = sharding.make_mesh(devices=jax.devices()[:1])
  state, shardings = train_state.create_train_state(model, optax.identity(), 16,
                                                    0, mesh)
  evaluator = fewshot_evaluator.from_protocol(model, config, mesh,
                                              shardings.params)
  train_x, _, test_x, _, classes = evaluator.dataset_features(
      state.params, "digits")
  assert train_x.shape == (300, 16) and test_x.shape == (100, 16)
  assert classes == 10
  # The crop of a 20-px resize is not the plain 16-px resize.
  plain = fewshot_evaluator.from_protocol(
      model,
      _config(tfds_data_dir,
              datasets=(("digits", "train[:300]", "test[:100]"),)), mesh,
      shardings.params)
  assert not np.allclose(
      plain.dataset_features(state.params, "digits")[0], train_x, atol=1e-4)


def _splits(fewshot):
  return fewshot_evaluator.dataset_splits(fewshot.datasets, fewshot.train_split,
                                          fewshot.eval_split, "datasets")


def test_the_standard_bundle_is_big_visions():
  config = fewshot_configs.get_config("standard")
  splits = _splits(config.fewshot)
  assert [key for key, *_ in splits] == [
      "caltech101", "cars196", "cifar100", "dtd", "oxford_iiit_pet",
      "uc_merced", "imagenet2012"
  ]
  assert ("uc_merced", "uc_merced", "train[:1000]", "train[1000:]") in splits
  assert ("imagenet2012", "imagenet2012", "train[:65000]",
          "validation") in splits
  assert config.fewshot.pp_eval == "resize(256)|central_crop|value_range"
  assert config.fewshot.shots == (1, 5, 10, 25)
  assert config.fewshot.l2_reg == 2.0**10 and config.fewshot.seeds == 3
  without = fewshot_configs.get_config("standard,imagenet=0")
  assert "imagenet2012" not in [k for k, *_ in _splits(without.fewshot)]
  from configs import pretrain  # pylint: disable=g-import-not-at-top
  periodic = pretrain.get_config("augreg_i1k,fewshot=standard")
  assert periodic.evals.fewshot.datasets == config.fewshot.datasets
  assert periodic.evals.fewshot.data.pp == config.fewshot.pp_eval
  assert periodic.evals.fewshot.every_steps == 10_000
  checks.check_config(periodic, sharding.make_mesh())
  for bad in (("digits", "train"), 3):
    config.fewshot.datasets = (bad,)
    with pytest.raises(ValueError, match="neither a dataset name"):
      _splits(config.fewshot)
