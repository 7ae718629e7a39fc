"""Unreadable images are left out in place, counted and named
(`vit_jax/data/unreadable.py`): the same stream on every run, a resumed
run included, and a one-line error past config.max_unreadable_share."""

import os
import re
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest
import tensorflow as tf

from tests.helpers import processes
from vit_jax.data import input_pipeline
from vit_jax.data import specs
from vit_jax.data import unreadable
from vit_jax.errors import UserError
from vit_jax.objectives import supervised
from vit_jax.training import losses
from vit_jax.training import mixup

CLASSES = ("cat", "dog")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OURS = re.compile(r"\d\d:\d\d:\d\d ")  # The console's lines (vit_jax.console).


def _jpeg(seed: int, size=(40, 48)) -> bytes:
  pixels = np.random.default_rng(seed).integers(0, 256, size + (3,), np.uint8)
  return tf.io.encode_jpeg(pixels).numpy()


def _broken_files() -> dict[str, bytes]:
  """One file of each way an image can be unreadable, by name."""
  whole = _jpeg(99)
  garbled = bytearray(whole)
  garbled[2:40] = bytes(38)  # The header's segments zeroed: undecodable.
  png = tf.io.encode_png(np.zeros((30, 30, 3), np.uint8)).numpy()
  return {
      "not_an_image.jpg": b"<html>503 Service Unavailable</html>",
      "empty.jpg": b"",
      "truncated.jpg": whole[:len(whole) // 2],
      "garbled.jpg": bytes(garbled),
      "truncated.png": png[:len(png) // 2],
  }


def make_folder(root, per_class=(12, 6), broken_in=("train", "test")):
  """ROOT/{train,test}/{cat,dog}/*.jpg, with the broken files among the
  first class's images of the splits named; returns their paths."""
  broken = []
  for split, count in zip(("train", "test"), per_class):
    for c, name in enumerate(CLASSES):
      os.makedirs(root / split / name, exist_ok=True)
      for i in range(count):
        (root / split / name / f"{i:03d}.jpg").write_bytes(_jpeg(100 * c + i))
    if split in broken_in:
      for file_name, data in _broken_files().items():
        path = root / split / CLASSES[0] / file_name
        path.write_bytes(data)
        broken.append(str(path))
  return broken


def folder_config(config, root, share=0.5):
  config.dataset = f"folder:{root}"
  config.image_size = 24
  config.pp_train = "inception_crop|flip_lr|value_range"
  config.pp_eval = "resize_small|central_crop|value_range"
  config.batch_size = 4
  config.eval_batch_size = 4
  config.max_unreadable_share = share
  return config


def test_every_kind_of_broken_image_fails_to_decode():
  """The premise: each file really is one TensorFlow cannot decode."""
  for name, data in _broken_files().items():
    with pytest.raises(tf.errors.OpError):
      tf.io.decode_image(data, channels=3, expand_animations=False).numpy()
      raise AssertionError(f"{name} decoded")


def test_evaluation_scores_the_readable_and_names_the_rest(
    digits_config, tmp_path):
  broken = make_folder(tmp_path, broken_in=("test",))
  config = folder_config(digits_config, tmp_path)
  source = input_pipeline.make_source(specs.training(config))
  batches = input_pipeline.make_eval_batches(specs.evaluation(config), source)
  seen = list(batches())
  assert sum(b["mask"].sum() for b in seen) == 12  # 17 files, 5 broken.
  assert sorted(batches.unreadable.names) == sorted(broken)
  assert batches.num_examples == 17
  again = list(batches())  # A second pass: the same, the names not doubled.
  assert batches.unreadable.count == 5
  for a, b in zip(seen, again):
    np.testing.assert_array_equal(a["image"], b["image"])


def test_training_leaves_them_out_in_place_and_resumes_exactly(
    digits_config, tmp_path):
  make_folder(tmp_path, broken_in=("train",))
  config = folder_config(digits_config, tmp_path)
  source = input_pipeline.make_source(specs.training(config))
  spec = specs.training(config)
  stream = input_pipeline.make_train_iterator(spec, source)
  batches = [next(stream) for _ in range(12)]  # 48 examples: 1.7 epochs.
  masks = np.concatenate([b["mask"] for b in batches])
  # Each pass of 29 files leaves out the same 5: zeros in their places.
  assert masks[:29].sum() == 24 and masks[29:48].sum() in range(14, 20)
  blank = np.concatenate([b["image"] for b in batches])[masks == 0]
  assert not blank.any() and blank.shape[0] >= 5
  resumed = input_pipeline.make_train_iterator(spec, source, start_step=7)
  for expected in batches[7:]:
    got = next(resumed)
    for key in expected:
      np.testing.assert_array_equal(got[key], expected[key])
  rerun = next(input_pipeline.make_train_iterator(spec, source))
  np.testing.assert_array_equal(rerun["image"], batches[0]["image"])


def test_training_names_the_files_it_left_out(digits_config, tmp_path):
  broken = make_folder(tmp_path, broken_in=("train",))
  config = folder_config(digits_config, tmp_path)
  source = input_pipeline.make_source(specs.training(config))
  found = unreadable.Collector(tmp_path)
  ds = input_pipeline.make_train_dataset(specs.training(config), source,
                                         collector=found)
  for _ in ds.take(9):  # 36 examples: every file met once.
    pass
  [log] = found.logs
  assert log.files_per_pass == 29 and sorted(log.names) == sorted(broken)


def test_too_many_unreadable_images_is_a_one_line_error(digits_config,
                                                        tmp_path):
  make_folder(tmp_path, per_class=(3, 3))  # 6 good, 5 broken per split.
  config = folder_config(digits_config, tmp_path, share=0.1)
  source = input_pipeline.make_source(specs.training(config))
  with pytest.raises(UserError) as raised:
    next(input_pipeline.make_train_iterator(specs.training(config), source))
  message = str(raised.value)
  assert "\n" not in message
  # 10% of 11 rounds down to 1; 2 files are always allowed.
  assert re.match(
      f"At least [3-5] of the 11 images read from {tmp_path} train are "
      "unreadable, more than the 2 allowed \\(config.max_unreadable_share="
      f"0.1, and at least 2 files\\), e.g. {tmp_path}/", message), message
  assert message.endswith(". Fix or remove them, or raise "
                          "config.max_unreadable_share.")
  batches = input_pipeline.make_eval_batches(specs.evaluation(config), source)
  with pytest.raises(UserError, match=" of the 11 images .* test are"):
    list(batches())


def test_a_few_files_are_always_allowed():
  assert unreadable.allowed(49, 0.01) == 2  # 1% rounds down to none.
  assert unreadable.allowed(10_000, 0.01) == 100
  assert unreadable.allowed(3, 0.01) == 1  # Never half of the files.
  assert unreadable.allowed(1, 0.5) == 0
  assert unreadable.allowed(49, 0.0) == 0  # 0: none at all.
  assert unreadable.allowed(100, 0.29) == 29  # Not 28 (0.29 * 100 in floats).


def test_one_broken_file_among_49_is_left_out_and_named(digits_config,
                                                        tmp_path):
  """1% of 49 files allows none; the floor lets training go on."""
  make_folder(tmp_path, per_class=(24, 1), broken_in=())
  broken = tmp_path / "train" / CLASSES[0] / "notes.jpg"
  broken.write_text("not an image")
  config = folder_config(digits_config, tmp_path,
                         share=unreadable.DEFAULT_MAX_SHARE)
  source = input_pipeline.make_source(specs.training(config))
  found = unreadable.Collector(tmp_path)
  stream = input_pipeline.make_train_iterator(specs.training(config), source,
                                              collector=found)
  masks = np.concatenate([next(stream)["mask"] for _ in range(13)])
  stream.close()
  assert masks[:49].sum() == 48  # A pass of 49 files, one left out.
  assert found.write()
  assert (tmp_path / "unreadable_files.txt").read_text() == f"{broken}\n"


def test_the_command_says_one_line_and_exits_at_once(tmp_path):
  """Past the allowance, `vit-jax train` says its one line and exits with
  status 2 at once: its input pipeline stops with the run, rather than at
  interpreter exit, where its threads hung the process or aborted it."""
  make_folder(tmp_path / "data", per_class=(3, 1), broken_in=())
  for i in range(3):  # Text, not truncated images: libjpeg logs those.
    (tmp_path / "data" / "train" / "dog" / f"page{i}.jpg").write_text("<html>")
  process = subprocess.Popen([
      sys.executable, "-m", "vit_jax", "train",
      "--config=configs/digits.py:runlocal",
      f"--config.dataset=folder:{tmp_path / 'data'}",
      f"--workdir={tmp_path / 'workdir'}"
  ], cwd=REPO, env=processes.command_env(), text=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  lines = []  # (when read, line)
  reader = threading.Thread(target=lambda: lines.extend(
      (time.monotonic(), line.rstrip("\n")) for line in process.stderr))
  reader.start()
  try:
    status = process.wait(timeout=240)
  finally:
    process.kill()
    reader.join()
  exited = time.monotonic()
  said = [(t, line) for t, line in lines if not OURS.match(line)]
  assert len(said) == 1, "\n".join(line for _, line in lines)
  when, error = said[0]
  assert status == 2 and lines[-1][1] == error
  assert exited - when < 30, f"exited {exited - when:.0f} s after its error"
  # 6 good and 3 broken files: more than the 2 always allowed.
  assert error.startswith("error: At least ") and (
      f" of the 9 images read from {tmp_path / 'data'} train are unreadable, "
      "more than the 2 allowed") in error, error


def test_a_share_outside_0_to_1_is_refused(digits_config, tmp_path):
  config = folder_config(digits_config, tmp_path, share=5.0)
  with pytest.raises(UserError, match="max_unreadable_share=5.0 must be"):
    specs.training(config)


def test_a_label_out_of_range_still_fails_loudly(digits_config, tmp_path):
  make_folder(tmp_path, broken_in=())
  config = folder_config(digits_config, tmp_path)
  source = input_pipeline.make_source(specs.training(config))
  source.num_classes = 1  # Label 1 is now invalid: not an unreadable file.
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="Label out of range"):
    list(input_pipeline.make_eval_batches(specs.evaluation(config), source)())


def test_the_collector_writes_each_process_file_once(tmp_path):
  collector = unreadable.Collector(tmp_path)
  log = collector.log("a", 100, 0.5)
  unreadable.Unreadable("not gathered", 100, 0.5).add("ignored")
  assert collector.logs == [log] and not collector.write()
  log.add("b.jpg")
  log.add("a.jpg")
  log.add("b.jpg")
  assert collector.write() and not collector.write()
  assert (tmp_path / "unreadable_files.txt").read_text() == "a.jpg\nb.jpg\n"


def test_a_placeholder_weighs_nothing_in_the_loss():
  rng = np.random.default_rng(0)
  images = rng.normal(size=(4, 6)).astype(np.float32)
  labels = np.eye(3, dtype=np.float32)[[0, 2, 1, 1]]
  kernel = rng.normal(size=(6, 3)).astype(np.float32)
  apply = lambda x, **kw: (x @ kernel, None)
  objective = supervised.classification_loss(losses.softmax_xent)
  key = jax.random.key(0)
  masked, _ = objective(apply, {
      "image": images,
      "labels": labels,
      "mask": np.float32([1, 0, 1, 1])
  }, key)
  without, _ = objective(apply, {
      "image": images[[0, 2, 3]],
      "labels": labels[[0, 2, 3]]
  }, key)
  np.testing.assert_allclose(masked, without, rtol=1e-6)
  # With mixup, the example mixed with the placeholder is left out too:
  # example i is mixed with i - 1, so 1 (the placeholder) and 2 go.
  mixed = supervised.classification_loss(losses.softmax_xent, mixup_alpha=1.0)
  loss, _ = mixed(apply, {
      "image": images,
      "labels": labels,
      "mask": np.float32([1, 0, 1, 1])
  }, key)
  mixup_key = jax.random.split(key)[0]  # As the objective draws it.
  mixed_images, mixed_labels, own = mixup.mix(mixup_key, images, labels, 1.0)
  assert (np.asarray(own) < 1).all()
  kept = np.array([0, 3])
  expected = np.mean(
      np.asarray(
          losses.softmax_xent(mixed_images[kept] @ kernel, mixed_labels[kept])))
  np.testing.assert_allclose(loss, expected, rtol=1e-6)


def test_a_run_on_a_folder_with_broken_images_trains_and_reports_them(
    digits_config, tmp_path, capsys):
  from vit_jax.loop import trainer
  broken = make_folder(tmp_path / "data")
  config = folder_config(digits_config, tmp_path / "data")
  config.image_size = 16
  config.batch_size = config.eval_batch_size = 8
  config.total_steps = 4
  config.log_every_steps = 2
  workdir = tmp_path / "workdir"
  result = trainer.train_and_evaluate(config, str(workdir))
  assert result["test/num_examples"] == 12  # 17 files, 5 broken.
  assert result["test/num_unreadable"] == 5
  assert np.isfinite(result["train/loss"])
  listed = (workdir / "unreadable_files.txt").read_text().splitlines()
  assert listed == sorted(broken)
  err = capsys.readouterr().err
  assert "Left out 10 unreadable images so far; they are listed in " in err
  assert "on 12 examples (5 unreadable images left out)" in err
