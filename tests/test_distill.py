"""Distillation (config.objective=distill): the loss is the KL divergence
of temperature-softened predictions (several teachers averaged in
probability space), the teachers see exactly the student's images, stay
bit-identical and unsaved, FSDP on them changes nothing, a resumed run
continues exactly and refuses changed teachers, and mistakes are one line.
"""

import os
import shutil

import flax
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from configs import distill as distill_recipes
from tests.helpers import tiny_models
from vit_jax import models
from vit_jax import objectives
from vit_jax import sharding
from vit_jax import weights
from vit_jax.config import defaults
from vit_jax.data import preprocess
from vit_jax.errors import UserError
from vit_jax.loop import checks
from vit_jax.loop import trainer
from vit_jax.objectives import function_matching
from vit_jax.training import distill
from vit_jax.training import fsdp
from vit_jax.training import optim
from vit_jax.training import teachers as teachers_lib
from vit_jax.training import train_state

# ------------------------------------------------------------ helpers --


def _softmax64(x):
  x = np.asarray(x, np.float64)
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _kl64(student, teachers, temperature):
  """T^2 KL(mean_i softmax(t_i / T) || softmax(s / T)) in float64."""
  p = np.mean([_softmax64(t / temperature) for t in teachers], axis=0)
  log_q = np.log(_softmax64(np.asarray(student, np.float64) / temperature))
  log_p = np.log(np.where(p > 0, p, 1.0))
  return temperature**2 * np.sum(np.where(p > 0, p * (log_p - log_q), 0.0), -1)


def _model_config(variant="testing"):
  config = defaults.get_config()
  config.model.variant = variant
  config.model.gelu_approximate = True  # The released .npz files' form.
  if "mixer" in variant:
    config.model.classifier = "gap"
  return weights.decide(config).model


def _random_params(model, image_size, seed, scale=0.5):
  """Parameters with every leaf random (a zero head would predict uniform)."""
  shapes = models.param_shapes(model, image_size)
  rng = np.random.default_rng(seed)
  return jax.tree.map(
      lambda x: (scale * rng.normal(size=x.shape)).astype(np.float32), shapes)


def _teacher_file(path, seed, variant="testing", classes=10, image_size=16):
  """A random model saved as a released-style .npz (flat '/' names)."""
  model = models.build_model(_model_config(variant), classes)
  params = _random_params(model, image_size, seed)
  flat = flax.traverse_util.flatten_dict(jax.device_get(params), sep="/")
  np.savez(path, **flat)
  return str(path)


def _runlocal(tfds_data_dir, **overrides):
  config = distill_recipes.get_config("digits,runlocal").unlock()
  config.data_dir = tfds_data_dir
  for field, value in overrides.items():
    target = config
    *parents, name = field.split(".")
    for parent in parents:
      target = target[parent]
    target[name] = value
  return config


# ------------------------------------------------------------ the loss --


@pytest.mark.parametrize("temperature", [1.0, 3.0])
@pytest.mark.parametrize("num_teachers", [1, 2])
def test_the_loss_is_a_float64_kl_at_temperature_times_its_square(
    temperature, num_teachers):
  rng = np.random.default_rng(0)
  student = rng.normal(size=(6, 5)).astype(np.float32) * 3
  teachers = [
      rng.normal(size=(6, 5)).astype(np.float32) * 3
      for _ in range(num_teachers)
  ]
  teachers[0][0, 1] = -1e4  # A class the teacher rules out: 0 log 0 = 0.
  loss = lambda target, t: distill.distance(
      jnp.asarray(student),
      distill.teachers_target([jnp.asarray(x)
                               for x in teachers], target, t), target, t)
  got = loss("probabilities", temperature)
  np.testing.assert_allclose(got, _kl64(student, teachers, temperature),
                             rtol=2e-5, atol=1e-6)
  logits = loss("logits", 1.0)
  np.testing.assert_allclose(logits,
                             np.mean((student - np.mean(teachers, 0))**2, -1),
                             rtol=1e-6)


def _capturing(record, logits):
  """A model stand-in that keeps the images it is given."""

  def apply(images, **kwargs):
    del kwargs
    record.append(np.asarray(images))
    return logits, {}

  return apply


def test_the_objective_shows_the_teachers_the_students_mixed_images():
  """Mixup is drawn once and both models get the result; the loss is the
  KL plus the label term it is asked for."""
  rng = np.random.default_rng(1)
  images = rng.uniform(-1, 1, (8, 16, 16, 3)).astype(np.float32)
  labels = np.eye(5, dtype=np.float32)[rng.integers(0, 5, 8)]
  student = rng.normal(size=(8, 5)).astype(np.float32)
  teacher = rng.normal(size=(8, 5)).astype(np.float32)
  seen_by_student, seen_by_teacher = [], []
  objective = function_matching.matching_loss(temperature=2.0, label_weight=0.5,
                                              mixup_alpha=1.0)
  loss, metrics = objective(
      _capturing(seen_by_student, student), {
          "image": images,
          "labels": labels
      }, jax.random.key(0),
      lambda x: [_capturing(seen_by_teacher, teacher)(x)[0]])
  mixed = seen_by_student[0]
  np.testing.assert_array_equal(seen_by_teacher[0], mixed)
  assert not np.allclose(mixed, images)
  # Each image is w x itself + (1 - w) x its neighbour; the labels mix alike.
  neighbour = np.roll(images, 1, axis=0)
  w = ((mixed - neighbour) / (images - neighbour))[:, 0, 0, 0, None]
  mixed_labels = w * labels + (1 - w) * np.roll(labels, 1, axis=0)
  xent = -np.sum(mixed_labels * np.log(_softmax64(student)), -1)
  kl = _kl64(student, [teacher], 2.0)
  np.testing.assert_allclose(loss, np.mean(kl + 0.5 * xent), rtol=2e-5)
  np.testing.assert_allclose(metrics["distill_loss"], np.mean(kl), rtol=2e-5)
  agree = np.argmax(student, -1) == np.argmax(teacher, -1)
  np.testing.assert_allclose(metrics["agreement"], np.mean(agree))


def test_a_teacher_at_another_resolution_sees_what_its_resize_op_makes():
  """The same array where the sizes agree; else what the `resize` op of
  its evaluation preprocessing gives (then value_range)."""
  pixels = np.random.default_rng(2).integers(0, 256, (2, 16, 16, 3))
  in_range = pixels.astype(np.float32) / 127.5 - 1.0
  same = jnp.asarray(in_range)
  assert teachers_lib.view(same, 16) is same
  resize, value_range = (
      op.fn for op in preprocess.parse("resize|value_range", 24))
  want = np.stack([
      np.asarray(value_range(resize(p.astype(np.uint8), None), None))
      for p in pixels
  ])
  np.testing.assert_allclose(teachers_lib.view(same, 24), want, atol=2e-5)


# ------------------------------------------------------------ the step --


def _step_setup(student_rule, teacher_rule, mesh, teacher_size=24):
  config = defaults.get_config()
  config.model.variant = "testing"
  config.model.gelu_approximate = True
  config.objective = "distill"
  config.distill.temperature = 2.0
  config.mixup.alpha = 1.0
  config.optimizer = "sgd"  # Updates linear in the gradients (test_steps).
  config.lr = 0.1
  config.image_size = 16
  config.sharding.fsdp_min_size = 0
  config.sharding.params = ((".*", student_rule),)
  model = tiny_models.build(config.model, 10)
  tx, schedule = optim.make_optimizer(config, 3)
  state, state_sharding = train_state.create_train_state(
      model, tx, 16, 0, mesh, config.sharding)
  teacher_config = defaults.get_config()
  teacher_config.model = _model_config()
  teacher_config.image_size = teacher_size
  teacher_model = tiny_models.build(teacher_config.model, 10)
  rules = config.sharding.copy_and_resolve_references()
  rules.params = ((".*", teacher_rule),)
  shapes, shardings = sharding.abstract_params(teacher_model, teacher_size,
                                               mesh, rules)
  assert fsdp.splits_over_data(shardings) == (teacher_rule == "fsdp")
  params = jax.device_put(_random_params(teacher_model, teacher_size, 7),
                          shardings)
  teacher = teachers_lib.Teacher("in memory", teacher_config, teacher_model,
                                 params, shardings)
  step = objectives.train_step(config, model, tx, schedule, mesh,
                               state_sharding, (teacher,))
  return state, step, teacher


def _batches():
  rng = np.random.default_rng(3)
  return [{
      "image": rng.integers(0, 256, (16, 16, 16, 3)).astype(np.uint8),
      "mask": np.ones(16, np.float32)
  } for _ in range(2)]


@pytest.mark.parametrize("student_rule", ["replicate", "fsdp"])
def test_a_teacher_split_by_fsdp_gives_the_replicated_step_and_stays_intact(
    student_rule):
  """8 devices: the teacher replicated or split by FSDP gives the same
  updates, whether the student is replicated (the partitioner gathers the
  teacher) or split too (the loss runs per shard, explicit collectives);
  the teacher's parameters come out of training bit-identical (never
  donated)."""
  mesh = sharding.make_mesh()
  results = []
  for teacher_rule in ("replicate", "fsdp"):
    state, step, teacher = _step_setup(student_rule, teacher_rule, mesh)
    before = jax.device_get(teacher.params)
    for batch in _batches():
      state, metrics = step(state, sharding.to_global_batch(batch, mesh))
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(teacher.params),
                 before)
    results.append((float(metrics["loss"]), jax.device_get(state.params)))
  (loss_a, params_a), (loss_b, params_b) = results
  np.testing.assert_allclose(loss_b, loss_a, rtol=1e-5)
  jax.tree.map(
      lambda a, b: np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6),
      params_a, params_b)


# ------------------------------------------------------- end to end --


def _final_params(workdir, step):
  saved = ocp.StandardCheckpointer().restore(
      os.path.join(workdir, "checkpoints", str(step), "default"))
  return saved["params"]


def test_an_interrupted_distillation_resumes_exactly_and_keeps_its_teachers(
    tfds_data_dir, tmp_path):
  """Two teachers (a Mixer, and a ViT at 24 px); a run resumed from its
  step-2 checkpoint ends where the uninterrupted run does; the checkpoints
  hold no teacher; a teacher changed since the start is refused with one
  line."""
  first = _teacher_file(tmp_path / "a.npz", seed=1, variant="testing-mixer")
  second = _teacher_file(tmp_path / "b.npz", seed=2)
  config = _runlocal(
      tfds_data_dir, total_steps=4, checkpoint_every_steps=2,
      eval_every_steps=2, **{
          "distill.teachers": (first, (second, 24)),
          "distill.temperature": 2.0
      })
  whole = str(tmp_path / "whole")
  result = trainer.train_and_evaluate(config, whole)
  assert 0.0 <= result["distill/agreement"] <= 1.0
  assert 0.0 <= result["distill/teacher_accuracy"] <= 1.0
  assert result["distill/loss"] > 0
  saved = ocp.StandardCheckpointer().restore(
      os.path.join(whole, "checkpoints", "4", "default"))
  assert set(saved) <= {
      "step", "params", "opt_state", "rng", "ema_params", "fp8"
  }, sorted(saved)

  resumed = str(tmp_path / "resumed")
  shutil.copytree(whole, resumed)
  shutil.rmtree(os.path.join(resumed, "checkpoints", "4"))
  again = trainer.train_and_evaluate(config, resumed)
  assert again["train/loss"] == result["train/loss"]
  jax.tree.map(np.testing.assert_array_equal, _final_params(resumed, 4),
               _final_params(whole, 4))

  _teacher_file(tmp_path / "a.npz", seed=3, variant="testing-mixer")
  with pytest.raises(UserError, match=r"started with the teachers .*a\.npz"):
    trainer.train_and_evaluate(config, resumed)


def test_a_teacher_that_is_the_student_agrees_everywhere(
    tfds_data_dir, tmp_path):
  """The evaluator on a student equal to its teacher: full agreement, no
  loss, the same accuracy (zero steps: the weights evaluated as they are)."""
  teacher = _teacher_file(tmp_path / "t.npz", seed=4)
  config = _runlocal(
      tfds_data_dir, total_steps=0, **{
          "distill.teachers": (teacher,),
          "distill.temperature": 2.0,
          "init.checkpoint": teacher,
          "init.dont_load": ()
      })
  result = trainer.train_and_evaluate(config, str(tmp_path / "run"))
  assert result["distill/agreement"] == 1.0
  assert abs(result["distill/loss"]) < 1e-6
  assert result["distill/student_accuracy"] == result[
      "distill/teacher_accuracy"] == result["test/accuracy"]


def test_flexivit_distils_at_the_patch_size_of_each_step(
    tfds_data_dir, tmp_path):
  """FlexiViT's own recipe: the student at a patch size drawn per step,
  evaluated against its teacher at each."""
  from configs import pretrain  # pylint: disable=import-outside-toplevel
  config = pretrain.get_config("flexi_i21k,runlocal").unlock()
  config.update(
      dict(data_dir=tfds_data_dir, objective="distill", loss="softmax_xent",
           total_steps=2))
  config.distill.teachers = (distill_recipes.DIGITS_TEACHER,)
  result = trainer.train_and_evaluate(config, str(tmp_path))
  sizes = config.flexi.eval_patch_sizes or config.flexi.patch_sizes
  for size in sizes:
    assert result[f"distill_p{size}/teacher_accuracy"] == pytest.approx(
        0.988889, abs=1e-6)
    assert 0.0 <= result[f"distill_p{size}/agreement"] <= 1.0


# ------------------------------------------------------------ mistakes --


@pytest.mark.parametrize("overrides, message", [
    ({
        "distill.teachers": ()
    }, "config.objective=distill needs a teacher"),
    ({
        "objective": "supervised",
        "mixup.alpha": 0.0
    }, "config.distill.teachers is set but config.objective='supervised'"),
    ({
        "distill.temperature": 0.0
    }, "temperature=0.0 must be positive"),
    ({
        "distill.target": "logits",
        "distill.temperature": 2.0
    }, "target=logits matches the logits"),
    ({
        "distill.target": "features"
    }, "distill.target='features' is not one"),
    ({
        "distill.teachers": ("/no/such/teacher",)
    }, r"teachers\[0\]: no checkpoint at /no/such/teacher"),
    ({
        "distill.teachers": ((distill_recipes.DIGITS_TEACHER, -3),)
    }, r"teachers\[0\]=.*a \(checkpoint, image size\) pair"),
    ({
        "pp_train": "inception_crop(0.5)"
    }, "end the pipeline with value_range"),
    ({
        "label_smoothing": 0.1
    }, "smooths labels, which distillation"),
])
def test_distillation_mistakes_are_one_line_before_compiling(
    tfds_data_dir, overrides, message):
  config = _runlocal(tfds_data_dir, **overrides)
  with pytest.raises(UserError, match=message):
    checks.check_config(config, sharding.make_mesh())


def test_the_students_rules_shard_a_teacher_of_other_names(
    tfds_data_dir, tmp_path):
  """A rule that matches only the student's names (a Mixer has no position
  embeddings) is no error for the teacher; the rest still apply."""
  teacher = _teacher_file(tmp_path / "m.npz", seed=6, variant="testing-mixer")
  config = weights.decide(
      _runlocal(
          tfds_data_dir, **{
              "distill.teachers": (teacher,),
              "sharding.params": (("Transformer/posembed_input/.*",
                                   "replicate"), (".*", "fsdp")),
              "sharding.fsdp_min_size": 0
          }))
  (loaded,) = teachers_lib.load(config, sharding.make_mesh(), 10, abstract=True)
  assert fsdp.splits_over_data(loaded.params_sharding)


@pytest.mark.parametrize("classes, message", [
    (5, "predicts 5 classes; the student learns the data's 10"),
    (None, "has no classification head"),
])
def test_a_teacher_of_other_classes_is_refused(tfds_data_dir, tmp_path, classes,
                                               message):
  teacher = _teacher_file(tmp_path / "t.npz", seed=5, classes=classes)
  config = weights.decide(
      _runlocal(tfds_data_dir, **{"distill.teachers": (teacher,)}))
  with pytest.raises(UserError, match=message):
    teachers_lib.load(config, sharding.make_mesh(), 10)
