"""The predict command and what it rests on: a checkpoint read without a
config, class names, image files in padded batches, and agreement with the
evaluator on the same images."""

import csv
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from tests.helpers import processes
from vit_jax import inference
from vit_jax import models
from vit_jax import weights
from vit_jax.data import image_files
from vit_jax.data import input_pipeline
from vit_jax.data import sources
from vit_jax.data import specs
from vit_jax.errors import UserError
from vit_jax.evaluators import classification
from vit_jax.training import losses

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write_split_as_pngs(data_dir, folder):
  """The digits test split as FOLDER/LABEL/N.png; returns the count."""
  split = tfds.builder("digits", data_dir=data_dir).as_data_source("test")
  count = 0
  for count, example in enumerate(split, 1):
    label_dir = folder / str(example["label"])
    label_dir.mkdir(parents=True, exist_ok=True)
    (label_dir / f"{count}.png").write_bytes(
        tf.io.encode_png(example["image"]).numpy())
  return count


@pytest.mark.xdist_group("trained_digits")
def test_predictions_on_image_files_agree_with_the_evaluator(
    trained_digits, tmp_path):
  loaded = inference.load(trained_digits)
  count = _write_split_as_pngs(loaded.config.data_dir, tmp_path / "test")
  assert loaded.trained_here and loaded.config.image_size == 16
  names, source = inference.class_names(loaded)
  assert names == [str(i) for i in range(10)] and "digits" in source

  files = image_files.find_images([str(tmp_path / "test")])
  assert len(files) == count
  batches = image_files.ImageFiles(files, loaded.config.pp_eval, 16, 64)
  rows = inference.predict(loaded, batches, files, top_k=3)
  assert not batches.failed and [r[0] for r in rows] == files
  correct = sum(names[classes[0]] == os.path.basename(os.path.dirname(path))
                for path, classes, _ in rows)
  for _, _, probs in rows:
    assert np.all(np.diff(probs) <= 0) and probs.sum() <= 1 + 1e-6

  # The training loop's evaluator on the TFDS split, with the same weights.
  batches = lambda: input_pipeline.make_eval_dataset(
      specs.evaluation(loaded.config),
      sources.make_source(specs.training(loaded.config))).as_numpy_iterator()
  evaluator = classification.ClassificationEvaluator(
      loaded.model, batches, loaded.mesh, losses.LOSSES["softmax_xent"],
      loaded.params_sharding)
  metrics = evaluator.run(loaded.params)
  assert metrics["num_examples"] == count
  assert correct == round(metrics["accuracy"] * count), (correct, metrics)
  assert metrics["accuracy"] > 0.6
  # Image by image: file N.png is the split's N-th example.
  params = jax.device_get(loaded.params)
  expected = np.concatenate([
      np.argmax(loaded.model.apply({"params": params}, b["image"])[0],
                -1)[b["mask"] > 0] for b in batches()
  ])
  predicted = {
      int(os.path.basename(path)[:-4]): classes[0] for path, classes, _ in rows
  }
  np.testing.assert_array_equal([predicted[n] for n in range(1, count + 1)],
                                expected)


@pytest.mark.xdist_group("trained_digits")
def test_a_bad_image_is_named_and_skipped(trained_digits, tmp_path):
  folder = tmp_path / "images"
  shutil.copytree(os.path.join(REPO, "docs", "digits"), folder / "good")
  (folder / "notes.png").write_text("not an image")
  good = (folder / "good" / "3.png").read_bytes()
  (folder / "cut.png").write_bytes(good[:len(good) // 2])
  out = tmp_path / "predictions.csv"
  names = ("zero,one,two,three,four,five,six,seven,eight,nine").split(",")
  done = subprocess.run([
      sys.executable, "-m", "vit_jax", "predict",
      f"--checkpoint={trained_digits}", "--top_k=2", "--batch_size=4",
      f"--out={out}", f"--class_names={','.join(names)}",
      str(folder)
  ], cwd=REPO, env=processes.command_env(), capture_output=True, text=True,
                        timeout=300)
  assert done.returncode == 1, done.stderr[-3000:]
  assert "Traceback" not in done.stderr
  assert f"Skipped {folder / 'notes.png'}: not a JPEG or PNG file" in (
      done.stderr)
  assert f"Skipped {folder / 'cut.png'}: a broken image (Invalid PNG" in (
      done.stderr)
  assert "2 of 12 files could not be read" in done.stderr
  table = done.stdout.splitlines()
  assert len(table) == 10 and all("good/" in line for line in table)

  with open(out, newline="") as f:
    rows = list(csv.DictReader(f))
  assert list(rows[0]) == [
      "path", "label", "score", "label_1", "score_1", "label_2", "score_2"
  ]
  assert len(rows) == 10 and {r["path"] for r in rows} == {
      str(folder / "good" / f"{i}.png") for i in range(10)
  }
  # --class_names names the head's ten classes, in class order.
  assert "class names: --class_names" in done.stderr
  assert {r["label_2"] for r in rows} | {r["label"] for r in rows} <= set(names)
  for row in rows:
    assert row["label"] == row["label_1"] and row["score"] == row["score_1"]
    assert float(row["score_1"]) >= float(row["score_2"])
  # The docs' digits are named by their label; chance would get one right.
  right = sum(
      r["label"] == names[int(os.path.basename(r["path"])[0])] for r in rows)
  assert right >= 5, rows


def _testing_model(num_classes, classifier="token"):
  model = models.create_model("testing", num_classes, classifier=classifier)
  return model, jax.jit(model.init)(jax.random.key(0), jnp.zeros(
      (1, 24, 24, 3)))["params"]


@pytest.mark.parametrize("save", ["npz", "timm"])
def test_the_architecture_is_read_from_the_file(tmp_path, save):
  model, params = _testing_model(7)
  path = str(tmp_path / ("w.npz" if save == "npz" else "w.safetensors"))
  (weights.save_npz if save == "npz" else weights.save_timm)(params, path)
  assert weights.read_architecture(path) == weights.Architecture(
      variant="testing", classifier="token", class_token=True, posemb="learn",
      representation_size=None, num_classes=7, image_size=24)
  config, trained_here, _ = inference.config_for(path, image_size=32)
  assert not trained_here and config.image_size == 32
  assert config.model.variant == "testing" and config.pp_eval


def test_a_gap_model_without_a_head_is_read_and_refused_by_predict(tmp_path):
  model, params = _testing_model(0, classifier="gap")
  path = str(tmp_path / "features.npz")
  weights.save_npz(params, path)
  assert weights.read_architecture(path).classifier == "gap"
  loaded = inference.load(path)
  assert not loaded.num_classes
  for refused in (lambda: inference.class_names(loaded),
                  lambda: inference.predict(loaded, [], [], 5)):
    with pytest.raises(UserError, match="no classification head"):
      refused()


def test_class_names_from_a_file_and_for_imagenet(tmp_path):
  model, params = _testing_model(3)
  path = str(tmp_path / "w.npz")
  weights.save_npz(params, path)
  loaded = inference.load(path)
  assert inference.class_names(loaded) == (["0", "1", "2"], "class indices")
  labels = tmp_path / "labels.txt"
  labels.write_text("cat\ndog\n\nbird\n")
  assert inference.class_names(loaded, str(labels))[0] == ["cat", "dog", "bird"]
  labels.write_text("cat\ndog\n")
  with pytest.raises(UserError, match="names 2 classes; the head has 3"):
    inference.class_names(loaded, str(labels))
  names = sources.imagenet_names()
  assert len(names) == len(set(names)) == 1000
  assert names[0] == "tench" and names[999] == "toilet tissue"
  assert names[638:640] == ["maillot", "maillot, tank suit"]  # Told apart.


def test_image_files_are_found_recursively_and_padded(tmp_path):
  (tmp_path / "a" / "b").mkdir(parents=True)
  rgb = np.random.default_rng(0).integers(0, 255, (30, 20, 3), np.uint8)
  (tmp_path / "a" / "b" / "x.jpg").write_bytes(tf.io.encode_jpeg(rgb).numpy())
  (tmp_path / "a" / "y.PNG").write_bytes(
      tf.io.encode_png(rgb[..., :1]).numpy())  # Grey.
  (tmp_path / "a" / "z.txt").write_text("skipped: not an image name")
  files = image_files.find_images([str(tmp_path / "a")])
  assert [os.path.relpath(f, tmp_path) for f in files] == [
      "a/b/x.jpg", "a/y.PNG"
  ]
  batches = list(image_files.ImageFiles(files, "resize|value_range", 8, 3))
  assert len(batches) == 1
  batch = batches[0]
  assert batch["image"].shape == (3, 8, 8, 3)
  np.testing.assert_array_equal(batch["mask"], [1, 1, 0])
  np.testing.assert_array_equal(batch["index"], [0, 1, 0])
  assert batch["image"][:2].min() >= -1 and batch["image"][:2].max() <= 1
  (tmp_path / "empty").mkdir()
  with pytest.raises(UserError, match="holds no .jpg"):
    image_files.find_images([str(tmp_path / "empty")])
  with pytest.raises(UserError, match="does not exist"):
    image_files.find_images([str(tmp_path / "missing.jpg")])
