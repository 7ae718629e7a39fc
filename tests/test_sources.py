"""Dataset sources: TFDS (mocked), image folders, per-process shares, errors."""

import hashlib
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from tests.helpers import tfds_fakes
from vit_jax import objectives
from vit_jax.data import input_pipeline
from vit_jax.data import specs
from vit_jax.errors import UserError

CLASSES = ("bird", "cat", "dog")


def _write_image(path, height, width, channels, value):
  pixels = np.full((height, width, channels), value, np.uint8)
  pixels[:height // 2] = 255 - value  # Not flat, so flips and crops show.
  encode = tf.io.encode_png if path.endswith(".png") else tf.io.encode_jpeg
  tf.io.write_file(path, encode(pixels))


@pytest.fixture
def image_folder(tmp_path):
  """train: 4 images per class, test: 3; mixed jpg/png/jpeg, sizes, gray/RGB."""
  for split, per_class in (("train", 4), ("test", 3)):
    for label, name in enumerate(CLASSES):
      os.makedirs(tmp_path / split / name)
      for i in range(per_class):
        ext = (".jpg", ".png", ".jpeg")[i % 3]
        _write_image(str(tmp_path / split / name / f"{i}{ext}"), 20 + 7 * i,
                     30 + 5 * label, 1 if i % 2 else 3, 40 * label)
  (tmp_path / "train" / "cat" / "notes.txt").write_text("not an image")
  return tmp_path


def _folder_config(digits_config, root):
  digits_config.dataset = f"folder:{root}"
  digits_config.image_size = 24
  digits_config.pp_train = "inception_crop|flip_lr|value_range"
  digits_config.pp_eval = "resize_small|central_crop|value_range"
  digits_config.batch_size = 4
  digits_config.eval_batch_size = 4
  return digits_config


def test_image_folder_trains_and_evaluates(digits_config, image_folder):
  config = _folder_config(digits_config, image_folder)
  source = input_pipeline.make_source(specs.training(config))
  info = input_pipeline.get_info(specs.training(config), source)
  assert (info.num_classes, info.num_train_examples,
          source.num_examples(config.eval_split)) == (3, 12, 9)

  batch = next(
      input_pipeline.make_train_iterator(specs.training(config), source))
  assert batch["image"].shape == (4, 24, 24, 3)
  assert batch["image"].dtype == np.uint8  # value_range is the step's.
  assert batch["image"].min() == 0 and batch["image"].max() == 255

  batches = list(
      input_pipeline.make_eval_dataset(specs.evaluation(config),
                                       source).as_numpy_iterator())
  assert len(batches) == 3  # 9 examples in batches of 4: the last is padded.
  labels = np.concatenate([b["labels"][b["mask"] > 0] for b in batches])
  np.testing.assert_array_equal(labels.sum(0), [3, 3, 3])


def test_image_folder_split_slices(digits_config, image_folder):
  config = _folder_config(digits_config, image_folder)
  source = input_pipeline.make_source(specs.training(config))
  assert source.num_examples("train[:50%]") == 6
  assert source.num_examples("train[2:]") == 10
  with pytest.raises(ValueError, match="no split 'validation'"):
    source.num_examples("validation")


@pytest.mark.parametrize("problem, message", [
    ("missing", "does not exist"),
    ("no_classes", "has no class folders"),
    ("empty_class", "holds no .jpg/.jpeg/.png images"),
])
def test_malformed_image_folders(tmp_path, digits_config, problem, message):
  root = tmp_path / "root"
  if problem != "missing":
    os.makedirs(root / "train")
  if problem == "empty_class":
    os.makedirs(root / "train" / "cat")
  digits_config.dataset = f"folder:{root}"
  with pytest.raises(ValueError, match=message):
    input_pipeline.make_source(specs.training(digits_config))


def _fingerprints(config, source, process_index, process_count, train=False):
  """Hashes of the (preprocessed) real examples one process sees."""
  if train:
    config.batch_size = 2
    ds = input_pipeline.make_train_dataset(
        specs.training(config), source, process_index, process_count).unbatch()
    ds = ds.take(source.num_examples(config.train_split) // process_count)
  else:
    ds = input_pipeline.make_eval_dataset(specs.evaluation(config), source,
                                          process_index,
                                          process_count).unbatch()
  return [
      hashlib.md5(ex["image"].tobytes()).hexdigest()
      for ex in ds.as_numpy_iterator()
      if ex["mask"] > 0
  ]


@pytest.mark.parametrize("dataset", ["digits", "folder"])
def test_two_processes_split_the_data_exactly(digits_config, image_folder,
                                              dataset):
  config = (_folder_config(digits_config, image_folder)
            if dataset == "folder" else digits_config)
  config.pp_eval = "resize|value_range"
  source = input_pipeline.make_source(specs.training(config))
  whole = _fingerprints(config, source, 0, 1)
  shares = [_fingerprints(config, source, i, 2) for i in range(2)]
  assert sorted(shares[0] + shares[1]) == sorted(whole)
  assert len(whole) == source.num_examples(config.eval_split)
  assert not set(shares[0]) & set(shares[1])


def test_train_shares_are_disjoint(digits_config, image_folder):
  config = _folder_config(digits_config, image_folder)
  config.pp_train = "resize|value_range"
  config.shuffle_buffer = 1
  source = input_pipeline.make_source(specs.training(config))
  shares = [
      set(_fingerprints(config, source, i, 2, train=True)) for i in range(2)
  ]
  assert len(shares[0]) == len(shares[1]) == 6
  assert not shares[0] & shares[1]


@pytest.mark.parametrize("name, eval_split, num_classes",
                         [("cifar10", "test", 10),
                          ("imagenet2012", "validation", 1000)])
def test_tfds_datasets_with_mock_data(digits_config, tmp_path, name, eval_split,
                                      num_classes):
  tfds_fakes.write_metadata(str(tmp_path), name, {"train": 10, eval_split: 10})
  digits_config.dataset = name
  digits_config.data_dir = str(tmp_path)
  digits_config.eval_split = eval_split
  digits_config.image_size = 32
  digits_config.pp_train = "inception_crop|flip_lr|value_range"
  digits_config.pp_eval = "resize_small|central_crop|value_range"
  digits_config.batch_size = digits_config.eval_batch_size = 4
  with tfds.testing.mock_data(num_examples=10, data_dir=str(tmp_path),
                              policy=tfds.testing.MockPolicy.USE_FILES):
    source = input_pipeline.make_source(specs.training(digits_config))
    info = input_pipeline.get_info(specs.training(digits_config), source)
    assert info.num_classes == num_classes
    batch = next(
        input_pipeline.make_train_iterator(specs.training(digits_config),
                                           source))
    assert batch["image"].shape == (4, 32, 32, 3)
    assert batch["labels"].shape == (4, num_classes)
    batches = list(
        input_pipeline.make_eval_dataset(specs.evaluation(digits_config),
                                         source).as_numpy_iterator())
    assert sum(b["mask"].sum() for b in batches) == 10


def test_manual_download_missing_is_explained(digits_config, tmp_path):
  digits_config.dataset = "imagenet2012"
  digits_config.data_dir = str(tmp_path)
  with pytest.raises(ValueError, match="needs a manual download"):
    input_pipeline.make_source(specs.training(digits_config))


def test_a_damaged_dataset_info_is_named_with_the_fix(digits_config,
                                                      tfds_data_dir, tmp_path):
  data_dir = tmp_path / "tfds"
  shutil.copytree(tfds_data_dir, data_dir)
  info = next(data_dir.glob("digits/*/dataset_info.json"))
  info.write_text(info.read_text()[:20])  # Cut short.
  digits_config.data_dir = str(data_dir)
  with pytest.raises(UserError) as raised:
    input_pipeline.make_source(specs.training(digits_config))
  said = str(raised.value)
  assert said.startswith(f"{info} cannot be read (Failed to load JSON: "
                         "Unterminated string"), said
  assert said.endswith(
      "): the dataset's metadata is damaged. Delete the dataset's folder "
      f"{info.parent} and run again: the dataset is prepared anew."), said


def test_label_out_of_range_is_an_error(digits_config, image_folder):
  config = _folder_config(digits_config, image_folder)
  source = input_pipeline.make_source(specs.training(config))
  source.num_classes = 2  # The folder has 3 classes: label 2 is now invalid.
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="Label out of range"):
    list(
        input_pipeline.make_eval_dataset(specs.evaluation(config),
                                         source).as_numpy_iterator())


def test_train_and_evaluate_on_an_image_folder(digits_config, image_folder,
                                               tmp_path_factory):
  from vit_jax.loop import trainer
  config = _folder_config(digits_config, image_folder)
  config.batch_size = config.eval_batch_size = 8
  config.image_size = 16
  config.total_steps = 3
  result = trainer.train_and_evaluate(config, str(
      tmp_path_factory.mktemp("wd")))
  assert 0.0 <= result["test/accuracy"] <= 1.0
  assert result["train/loss"] > 0


def test_train_batches_depend_only_on_the_seed(digits_config):
  digits_config.pp_train = "inception_crop|value_range"
  source = input_pipeline.make_source(specs.training(digits_config))
  first = lambda: next(
      input_pipeline.make_train_iterator(specs.training(digits_config), source)
  )["image"]
  a, b = first(), first()
  digits_config.seed += 1
  c = first()
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)


class MultiLabelToy(tfds.core.GeneratorBasedBuilder):
  """Four images, each tagged with a set of the classes 0..3."""
  VERSION = tfds.core.Version("1.0.0")
  TAGS = ([0], [1, 3], [2], [0, 1, 2])

  def _info(self):
    return self.dataset_info_from_configs(features=tfds.features.FeaturesDict({
        "image": tfds.features.Image(shape=(8, 8, 3)),
        "labels": tfds.features.Sequence(tfds.features.ClassLabel(
            num_classes=4))
    }))

  def _split_generators(self, dl_manager):
    return {
        "train": self._generate_examples(),
        "test": self._generate_examples()
    }

  def _generate_examples(self):
    for i, tags in enumerate(self.TAGS):
      yield i, {"image": np.full((8, 8, 3), 60 * i, np.uint8), "labels": tags}


def test_multi_label_datasets_give_multi_hot_labels(digits_config, tmp_path):
  digits_config.dataset = "multi_label_toy"
  digits_config.data_dir = str(tmp_path)
  digits_config.pp_eval = "resize|value_range"
  digits_config.eval_batch_size = 8
  source = input_pipeline.make_source(specs.training(digits_config))
  assert source.multi_label and source.num_classes == 4
  batch = next(
      input_pipeline.make_eval_dataset(specs.evaluation(digits_config),
                                       source).as_numpy_iterator())
  real = batch["mask"] > 0
  by_image = {
      round(float(img[0, 0, 0]), 3): labels
      for img, labels in zip(batch["image"][real], batch["labels"][real])
  }
  expected = {
      round(60 * i / 127.5 - 1, 3): np.isin(np.arange(4), tags)
      for i, tags in enumerate(MultiLabelToy.TAGS)
  }
  assert by_image.keys() == expected.keys()
  for key, tags in expected.items():
    np.testing.assert_array_equal(by_image[key], tags.astype(np.float32))


def test_softmax_loss_on_multi_hot_labels_warns(digits_config, tmp_path,
                                                caplog):
  from vit_jax.loop import checks
  digits_config.dataset = "multi_label_toy"
  digits_config.data_dir = str(tmp_path)
  info = input_pipeline.get_info(
      specs.training(digits_config),
      input_pipeline.make_source(specs.training(digits_config)))
  checks.warn_if_loss_mismatches_labels(digits_config, info)
  assert "config.loss=sigmoid_xent" in caplog.text
  caplog.clear()
  digits_config.loss = "sigmoid_xent"
  checks.warn_if_loss_mismatches_labels(digits_config, info)
  assert "sigmoid_xent" not in caplog.text


def test_folder_listing_is_kept_in_the_index_dir(digits_config, image_folder,
                                                 tmp_path_factory):
  """A resumed run reads the listing it started with, not the tree as it is
  now (images added since would change which images each step sees)."""
  config = _folder_config(digits_config, image_folder)
  index_dir = tmp_path_factory.mktemp("workdir")
  first = input_pipeline.make_source(specs.training(config),
                                     index_dir=str(index_dir))
  assert len(list(index_dir.glob("folder_index_*.json.gz"))) == 1
  _write_image(str(image_folder / "train" / "dog" / "new.png"), 20, 20, 3, 9)
  again = input_pipeline.make_source(specs.training(config),
                                     index_dir=str(index_dir))
  fresh = input_pipeline.make_source(specs.training(config))
  assert again.num_examples("train") == first.num_examples("train") == 12
  assert fresh.num_examples("train") == 13
  assert again._files == first._files  # pylint: disable=protected-access


def test_self_supervised_batches_carry_no_labels(selfsup_config):
  source = input_pipeline.make_source(specs.training(selfsup_config))
  batch = next(
      input_pipeline.make_train_iterator(
          specs.training(selfsup_config), source,
          labels=objectives.of(selfsup_config).carries(selfsup_config).labels))
  assert set(batch) == {"image", "mask"}


def _png(path, seed=0):
  pixels = np.random.default_rng(seed).integers(0, 256, (12, 12, 3))
  tf.io.write_file(str(path), tf.io.encode_png(pixels.astype(np.uint8)))


def _unlabelled_folder(root):
  """ROOT/{train,test}/*.png: images without class folders."""
  for split, count in (("train", 16), ("test", 5)):
    os.makedirs(root / split)
    for i in range(count):
      _png(root / split / f"{i}.png", i)
  return f"folder:{root}"


def test_unlabelled_image_folder_trains_self_supervised(selfsup_config,
                                                        tmp_path):
  from vit_jax.loop import trainer
  config = selfsup_config
  config.dataset = _unlabelled_folder(tmp_path / "images")
  config.batch_size = config.eval_batch_size = 8
  config.total_steps = 3
  source = input_pipeline.make_source(specs.training(config))
  assert input_pipeline.get_info(specs.training(config),
                                 source).num_classes == 0
  result = trainer.train_and_evaluate(config, str(tmp_path / "wd"))
  assert result["masked_patch/num_examples"] == 5
  config.objective = "supervised"
  with pytest.raises(UserError, match="has no labels.*masked_patch"):
    trainer.train_and_evaluate(config, str(tmp_path / "wd2"))


def test_folder_that_mixes_labelled_and_unlabelled_images_is_refused(
    digits_config, tmp_path):
  for folder, images, message in (("a", ("train/0.png", "train/cat/1.png"),
                                   "both class folders and im"),
                                  ("b", ("train/0.png", "test/cat/1.png"),
                                   "mixes unlabelled splits")):
    for image in images:
      os.makedirs(os.path.dirname(tmp_path / folder / image), exist_ok=True)
      _png(tmp_path / folder / image)
    digits_config.dataset = f"folder:{tmp_path / folder}"
    with pytest.raises(UserError, match=message):
      input_pipeline.make_source(specs.training(digits_config))


class UnlabelledToy(tfds.core.GeneratorBasedBuilder):
  """Six images and nothing else."""
  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    return self.dataset_info_from_configs(features=tfds.features.FeaturesDict(
        {"image": tfds.features.Image(shape=(8, 8, 3))}))

  def _split_generators(self, dl_manager):
    return {
        "train": self._generate_examples(),
        "test": self._generate_examples()
    }

  def _generate_examples(self):
    for i in range(6):
      yield i, {"image": np.full((8, 8, 3), 40 * i, np.uint8)}


def test_unlabelled_tfds_dataset(selfsup_config, tmp_path):
  config = selfsup_config
  config.dataset, config.data_dir = "unlabelled_toy", str(tmp_path)
  config.batch_size = 8
  source = input_pipeline.make_source(specs.training(config))
  assert source.num_classes == 0
  batch = next(
      input_pipeline.make_train_iterator(specs.training(config), source,
                                         labels=False))
  assert batch["image"].shape == (8, 16, 16, 3) and "labels" not in batch
  with pytest.raises(UserError, match="unlabelled_toy has no labels"):
    input_pipeline.make_train_iterator(specs.training(config), source,
                                       labels=True)


@pytest.mark.parametrize("cache", [True, False])
def test_evaluation_reads_a_cached_split_once(digits_config, image_folder,
                                              cache):
  """The evaluators' batches come from one dataset: with `cache` the second
  pass is served from memory (the files are gone by then); without, it
  reads the files again (and finds them gone: a storage error, not an
  unreadable image)."""
  config = _folder_config(digits_config, image_folder)
  config.cache = cache
  batches = input_pipeline.make_eval_batches(
      specs.evaluation(config),
      input_pipeline.make_source(specs.training(config)))
  first = [b["image"] for b in batches()]
  for path in (image_folder / "test").rglob("*.*"):
    path.unlink()
  if not cache:
    with pytest.raises(FileNotFoundError, match="1.png"):
      list(batches())
    return
  again = [b["image"] for b in batches()]
  assert len(again) == len(first)
  for a, b in zip(first, again):
    np.testing.assert_array_equal(a, b)
