"""VTAB-1k: the task table against TFDS, every task's splits and labels on
mocked data, the benchmark's means, and the runner end to end."""

import json

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from configs import vtab as vtab_config
from tests.helpers import tfds_fakes
from vit_jax.data import input_pipeline
from vit_jax.data import sources
from vit_jax.data import specs
from vit_jax.data import vtab_tasks
from vit_jax.errors import UserError
from vit_jax.vtab import runner

# Split sizes of the fake metadata: big enough for every slice.
SIZES = {"train": 2_000, "validation": 400, "test": 400}


def test_the_benchmark_has_19_tasks_in_its_three_groups():
  groups = [t.group for t in vtab_tasks.TASKS.values()]
  assert [groups.count(g) for g in vtab_tasks.GROUPS] == [7, 4, 8]
  assert all(name == t.name for name, t in vtab_tasks.TASKS.items())


# Tasks that read a class feature as it is (or binned): its TFDS class count.
FEATURE_CLASSES = {
    "caltech101": ("label", 102),
    "cifar100": ("label", 100),
    "dtd": ("label", 47),
    "oxford_flowers102": ("label", 102),
    "oxford_iiit_pet": ("label", 37),
    "sun397": ("label", 397),
    "svhn": ("label", 10),
    "patch_camelyon": ("label", 2),
    "eurosat": ("label", 10),
    "resisc45": ("label", 45),
    "diabetic_retinopathy": ("label", 5),
    "dmlab": ("label", 6),
    "smallnorb_azimuth": ("label_azimuth", 18),
    "smallnorb_elevation": ("label_elevation", 9),
    "dsprites_location": ("label_x_position", 32),
    "dsprites_orientation": ("label_orientation", 40),
}


@pytest.mark.parametrize("name", sorted(FEATURE_CLASSES))
def test_class_counts_match_the_tfds_features(name, tmp_path):
  task = vtab_tasks.TASKS[name]
  key, classes = FEATURE_CLASSES[name]
  features = tfds.builder(task.tfds_name, data_dir=str(tmp_path)).info.features
  assert features[key].num_classes == classes
  if not name.startswith("dsprites"):
    assert task.num_classes == classes


def test_kitti_vehicles_are_the_first_three_object_types(tmp_path):
  features = tfds.builder("kitti:3.*.*", data_dir=str(tmp_path)).info.features
  assert features["objects"]["type"].names[:3] == ["Car", "Van", "Truck"]


@pytest.mark.parametrize(
    "name, num_train, splits",
    [
        # task_adaptation's sizes: CLEVR 70,000 train; dSprites 737,280;
        # EuroSAT 27,000; DTD has its own validation split.
        ("clevr_count", 70_000,
         ("train[:800]+train[63000:63200]", "validation")),
        ("dsprites_orientation", 737_280,
         ("train[:800]+train[589824:590024]", "train[663552:]")),
        ("eurosat", 27_000,
         ("train[:800]+train[16200:16400]", "train[21600:]")),
        ("oxford_iiit_pet", 3_680, ("train[:800]+train[2944:3144]", "test")),
        ("dtd", 1_880, ("train[:800]+validation[:200]", "test")),
        ("smallnorb_azimuth", 24_300, ("train[:800]+test[:200]", "test[50%:]")),
    ])
def test_benchmark_splits_as_tfds_split_strings(name, num_train, splits):
  task = vtab_tasks.TASKS[name]
  assert (task.tfds_split("train800val200",
                          num_train), task.tfds_split("test",
                                                      num_train)) == splits
  assert task.tfds_split("train800", num_train) == "train[:800]"
  assert splits[0].endswith("+" + task.tfds_split("val200", num_train))


@pytest.fixture(scope="module")
def fake_vtab_dir(tmp_path_factory) -> str:
  """Metadata of every VTAB dataset with the split sizes SIZES."""
  data_dir = str(tmp_path_factory.mktemp("vtab_tfds"))
  for name in sorted({t.tfds_name for t in vtab_tasks.TASKS.values()}):
    tfds_fakes.write_metadata(data_dir, name, SIZES)
  return data_dir


def _vtab_config(task, data_dir, arg=""):
  config = vtab_config.get_config(f"{task},runlocal{arg}")
  config.data_dir = data_dir
  config.eval_batch_size = 16
  config.batch_size = 8
  return config


@pytest.mark.parametrize("name", list(vtab_tasks.TASKS))
def test_every_task_reads_its_splits_and_labels(name, fake_vtab_dir):
  """On random data: the four splits resolve with their sizes, and every
  example's label (derived where the task says) is a valid class."""
  config = _vtab_config(name, fake_vtab_dir)
  task = vtab_tasks.TASKS[name]
  with tfds_fakes.mock_tfds(fake_vtab_dir, tfds_fakes.random_examples(16)):
    source = input_pipeline.make_source(specs.training(config))
    assert isinstance(source, sources.VtabSource)
    info = input_pipeline.get_info(specs.training(config), source)
    assert (info.num_classes, info.num_train_examples) == (task.num_classes,
                                                           1_000)
    assert [source.num_examples(s) for s in ("train800", "val200")] == [
        800, 200
    ]
    batches = list(
        input_pipeline.make_eval_dataset(
            specs.evaluation(config),
            source).as_numpy_iterator())  # Checks each label's range.
  real = np.concatenate([b["mask"] for b in batches]) > 0
  labels = np.concatenate([b["labels"] for b in batches])[real]
  assert real.sum() == 16 and np.all(labels.sum(-1) == 1)
  assert batches[0]["image"].shape[1:] == (16, 16, 3)


def _record(**objects):
  """A record with these `objects` features; points are (x, y, z) rows."""
  points = ("pixel_coords", "location")
  return {
      "objects": {
          k: tf.constant(
              np.reshape(v, (-1, 3)) if k in points else v, tf.float32
              if k in points else tf.int64) for k, v in objects.items()
      }
  }


def test_structured_labels_follow_task_adaptation():
  assert int(vtab_tasks.clevr_count(_record(size=[0] * 3))) == 0
  assert int(vtab_tasks.clevr_count(_record(size=[1] * 10))) == 7
  depths = lambda *z: _record(pixel_coords=[[0.0, 0.0, d] for d in z])
  assert [
      int(vtab_tasks.clevr_distance(depths(12.0, d)))
      for d in (7.9, 8.2, 9.7, 10.5)
  ] == [0, 1, 4, 5]
  cars = lambda types, z: _record(type=types, location=[[0.0, 0.0, d]
                                                        for d in z])
  assert [
      int(vtab_tasks.kitti_vehicle_distance(cars(types, z)))
      for types, z in [([0, 2],
                        [30.0, 5.0]), ([1],
                                       [12.0]), ([2],
                                                 [25.0]), ([3, 5],
                                                           [2.0, 3.0]), ([],
                                                                         [])]
  ] == [0, 1, 2, 3, 3]
  x_bins = vtab_tasks.binned("v", 32, 16)
  angle_bins = vtab_tasks.binned("v", 40, 16)
  values = tf.range(40, dtype=tf.int64)
  np.testing.assert_array_equal(x_bins({"v": values[:32]}), np.arange(32) // 2)
  np.testing.assert_array_equal(angle_bins({"v": values}),
                                np.floor(np.arange(40) / 2.5))


def test_other_split_names_and_tasks_are_refused(fake_vtab_dir):
  config = _vtab_config("dtd", fake_vtab_dir)
  config.train_split = "train[:90%]"
  with tfds_fakes.mock_tfds(fake_vtab_dir, tfds_fakes.random_examples(4)):
    source = input_pipeline.make_source(specs.training(config))
    with pytest.raises(UserError, match="train800val200 and evaluate on test"):
      input_pipeline.get_info(specs.training(config), source)
  with pytest.raises(UserError, match="Unknown VTAB task 'mnist'"):
    vtab_config.get_config("mnist")
  with pytest.raises(UserError, match="split=train is not one of test, val"):
    vtab_config.get_config("dtd,split=train")


def test_protocols_of_the_config():
  test = vtab_config.get_config("clevr_count")
  val = vtab_config.get_config("clevr_count,split=val")
  assert (test.train_split, test.eval_split) == ("train800val200", "test")
  assert (val.train_split, val.eval_split) == ("train800", "val200")
  assert (test.lr, test.total_steps, test.batch_size, test.image_size,
          test.optimizer, test.weight_decay,
          test.grad_clip_norm) == (0.01, 2_500, 512, 384, "sgd", 0.0, 1.0)
  assert test.pp_train == test.pp_eval == "resize|value_range"


def test_group_means_and_the_vtab_score():
  accuracy = {
      name: {
          "natural": 0.9,
          "specialized": 0.8,
          "structured": 0.5
      }[t.group] for name, t in vtab_tasks.TASKS.items()
  }
  accuracy["dtd"] = 0.2  # Natural: (6 * 0.9 + 0.2) / 7 = 0.8.
  summary = runner.summarize(accuracy)
  assert summary["groups"] == pytest.approx({
      "natural": 0.8,
      "specialized": 0.8,
      "structured": 0.5
  })
  # The score is the mean over the 19 tasks, not over the three groups.
  assert summary["mean"] == pytest.approx((7 * 0.8 + 4 * 0.8 + 8 * 0.5) / 19)
  assert summary["complete"] and summary["tasks"]["dtd"] == {
      "group": "natural",
      "accuracy": 0.2
  }
  table = runner.format_table(summary)
  assert "mean (all 19 tasks)" in table and "mean natural" in table

  part = runner.summarize({"dtd": 0.5, "dmlab": 0.25, "svhn": 0.75})
  assert part["groups"] == {"natural": 0.625, "structured": 0.25}
  assert part["mean"] == pytest.approx(0.5) and not part["complete"]
  assert "mean (3 of 19 tasks)" in runner.format_table(part)


def test_runner_fine_tunes_each_task_once(fake_vtab_dir, tmp_path, monkeypatch):
  tasks = ["dsprites_location", "dsprites_orientation"]
  config = _vtab_config("cifar100", fake_vtab_dir)
  config.total_steps, config.warmup_steps, config.log_every_steps = 2, 1, 1
  workdir = str(tmp_path / "vtab")
  with tfds_fakes.mock_tfds(fake_vtab_dir, tfds_fakes.random_examples(16)):
    accuracy = runner.run_tasks(config, workdir, tasks)
    assert list(accuracy) == tasks
    assert all(0.0 <= a <= 1.0 for a in accuracy.values())
    for task in tasks:
      result = json.loads(
          (tmp_path / "vtab" / task / "result.json").read_text())
      assert result["settings"]["dataset"] == f"vtab:{task}"
      assert result["metrics"]["test/num_examples"] == 16

    def no_training(*args):
      raise AssertionError(f"trained again: {args}")

    monkeypatch.setattr(runner.trainer, "train_and_evaluate", no_training)
    assert runner.run_tasks(config, workdir, tasks) == accuracy

    config.train_split, config.eval_split = vtab_tasks.PROTOCOLS["val"]
    with pytest.raises(UserError, match="Use another --workdir"):
      runner.run_tasks(config, workdir, tasks[:1])

  assert not list((tmp_path / "vtab").glob("**/*.part"))  # Renamed.
  path = runner.write(runner.summarize(accuracy), config, workdir)
  written = json.loads(open(path).read())
  assert written["groups"]["structured"] == pytest.approx(
      np.mean(list(accuracy.values())))
  assert written["num_tasks"] == 2 and not written["complete"]


def _no_training(*args):
  raise AssertionError(f"trained: {args}")


def test_a_finished_task_of_other_settings_is_refused(tmp_path, monkeypatch):
  """A result.json written by hand: reused only for the same settings (the
  split=val lr sweep in one workdir must not reuse the first lr's)."""
  monkeypatch.setattr(runner.trainer, "train_and_evaluate", _no_training)
  config = _vtab_config("cifar100", "/unused", ",split=val")
  done = {
      "settings": runner.settings(runner.task_config(config, "dtd")),
      "metrics": {
          "test/accuracy": 0.5
      }
  }
  (tmp_path / "dtd").mkdir()
  (tmp_path / "dtd" / "result.json").write_text(json.dumps(done))
  # Logging, checkpoint and evaluation intervals, data locations, evaluation
  # batches and the mesh do not matter.
  config.log_every_steps, config.checkpoint_every_steps = 7, 3
  config.evals.test.every_steps, config.evals.test.data.batch_size = 50, 4
  config.data_dir, config.evals.test.data.data_dir = str(tmp_path), "/x"
  config.mesh.model = 2
  assert runner.run_tasks(config, str(tmp_path), ["dtd"]) == {"dtd": 0.5}

  config.lr, config.init.dont_load = 0.03, ()
  with pytest.raises(UserError) as error:
    runner.run_tasks(config, str(tmp_path), ["dtd"])
  message = str(error.value)
  assert ("(recorded -> now): init.dont_load [\"head/.*\"] -> []; "
          "lr 0.01 -> 0.03. Use another --workdir (or delete "
          f"{tmp_path / 'dtd'})") in message


def test_an_unfinished_task_resumes_only_with_its_settings(
    tmp_path, monkeypatch):
  """config.json as the trainer writes it (GELU decided)."""
  config = _vtab_config("cifar100", "/unused")
  recorded = runner.task_config(config, "dtd")
  assert recorded.model.gelu_approximate is True
  (tmp_path / "dtd").mkdir()
  (tmp_path / "dtd" / "config.json").write_text(
      recorded.to_json_best_effort(indent=2))
  calls = []
  monkeypatch.setattr(
      runner.trainer, "train_and_evaluate",
      lambda *args: calls.append(args) or {"preempted_at_step": 1})

  config.batch_size = 16
  with pytest.raises(
      UserError, match=r"The unfinished task in .*dtd has "
      r"other settings than this run \(recorded -> now\): "
      r"batch_size 8 -> 16\. Use another --workdir"):
    runner.run_tasks(config, str(tmp_path), ["dtd"])
  assert not calls

  config.batch_size = 8  # As recorded: resumed.
  assert runner.run_tasks(config, str(tmp_path), ["dtd"]) == {}
  assert len(calls) == 1


def test_a_task_finished_by_an_earlier_version_is_reused(tmp_path, monkeypatch):
  """Its settings lack the fields added since (they count as their default)
  and hold fields removed since (not compared)."""
  monkeypatch.setattr(runner.trainer, "train_and_evaluate", _no_training)
  config = _vtab_config("cifar100", "/unused", ",split=val")
  recorded = runner.settings(runner.task_config(config, "dtd"))
  old = {
      k: v
      for k, v in recorded.items()
      if not k.startswith(("evals.", "imports"))
  }
  old.update({"real.enabled": False, "v2.enabled": False})
  assert len(old) < len(recorded)
  (tmp_path / "dtd").mkdir()
  (tmp_path / "dtd" / "result.json").write_text(
      json.dumps({
          "settings": old,
          "metrics": {
              "test/accuracy": 0.5
          }
      }))
  assert runner.run_tasks(config, str(tmp_path), ["dtd"]) == {"dtd": 0.5}
  config.evals.test.data.split = "test[:10]"  # Not the default: compared.
  with pytest.raises(UserError, match="evals.test.data.split null -> "):
    runner.run_tasks(config, str(tmp_path), ["dtd"])
