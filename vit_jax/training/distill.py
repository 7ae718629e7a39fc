"""Distillation's objective (Beyer et al. 2022, "Knowledge distillation: A
good teacher is patient and consistent"): function matching.

The student learns to predict what frozen teachers predict on exactly the
images it sees: the host's crop and flip and the step's mixup are drawn
once per example and both models get the result (a teacher at another
resolution gets it resized, `teachers.view`; never re-augmented). The
loss, per example, with temperature T, teachers' logits t_1..t_n and the
student's s:

  probabilities  T^2 KL(p || softmax(s / T)), p = mean_i softmax(t_i / T)
  logits         mean over classes of (s - mean_i t_i)^2

with no label term unless `label_weight` adds the labels' loss. The T^2
keeps the gradients' scale as T changes (Hinton et al. 2015). The
objective itself is `objectives/function_matching.py`; the teachers are
`teachers.py`. Imports no TensorFlow.
"""

import os

import jax
import jax.numpy as jnp
import ml_collections

from vit_jax import paths
from vit_jax import weights
from vit_jax.config import fields
from vit_jax.data import preprocess
from vit_jax.errors import UserError

TARGETS = ("probabilities", "logits")


def teachers_target(teacher_logits, target: str, temperature: float):
  """What the student matches, B x K in float32: the teachers' softened
  probabilities averaged, or (target `logits`) their logits averaged. Its
  top-1 class is the teachers' (ensemble's)."""
  if target == "logits":
    values = [t.astype(jnp.float32) for t in teacher_logits]
  else:
    values = [
        jax.nn.softmax(t.astype(jnp.float32) / temperature)
        for t in teacher_logits
    ]
  return sum(values) / len(values)


def distance(student_logits_BxK, target_BxK, target: str, temperature: float):
  """Per example, in float32: T^2 KL(p || softmax(s / T)) (0 log 0 = 0),
  or the mean squared difference of the logits (see the module doc)."""
  student = student_logits_BxK.astype(jnp.float32)
  if target == "logits":
    return jnp.mean(jnp.square(student - target_BxK), axis=-1)
  log_q = jax.nn.log_softmax(student / temperature)
  p = target_BxK
  p_log_p = jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0)
  return temperature**2 * jnp.sum(p_log_p - p * log_q, axis=-1)


def teacher_specs(config: ml_collections.ConfigDict):
  """config.distill.teachers as (checkpoint, image size or None) pairs."""
  specs = []
  for i, entry in enumerate(config.distill.teachers):
    if isinstance(entry, str):
      entry = (entry, None)
    if not (isinstance(entry, (tuple, list)) and len(entry) == 2 and
            isinstance(entry[0], str) and
            (entry[1] is None or isinstance(entry[1], int) and entry[1] > 0)):
      raise UserError(
          f"config.distill.teachers[{i}]={entry!r}: give a checkpoint (a "
          "path or released name) or a (checkpoint, image size) pair, e.g. "
          "--config.distill.teachers=\"(('workdirs/teacher', 224),)\".")
    specs.append((entry[0], entry[1]))
  return specs


def _check_exists(checkpoint: str, index: int):
  """A local teacher that is not there, said before anything loads (URLs
  and released names are fetched, and checked, where they load)."""
  file, _ = weights.split_tower(checkpoint)
  if (paths.is_remote(file) or weights.lookup_released(file) is not None or
      os.path.exists(os.path.expanduser(file))):
    return
  raise UserError(f"config.distill.teachers[{index}]: no checkpoint at "
                  f"{checkpoint}. Give a workdir, a weights file, or a "
                  "released name (vit-jax inspect --list_released).")


def check_config(config: ml_collections.ConfigDict):
  """The distill fields of a distillation's config, and what distillation
  does not take."""
  d = config.distill
  specs = teacher_specs(config)
  fields.check_choice(config, "distill.target", TARGETS)
  if not d.temperature > 0:
    raise UserError(f"config.distill.temperature={d.temperature} must be "
                    "positive (1: the predictions as they are).")
  if d.target == "logits" and d.temperature != 1.0:
    raise UserError(
        "config.distill.temperature softens probabilities; "
        "config.distill.target=logits matches the logits themselves. Set "
        "the temperature to 1, or target=probabilities.")
  if d.label_weight < 0:
    raise UserError(f"config.distill.label_weight={d.label_weight} must be 0 "
                    "(no label term, the paper's) or positive.")
  if config.label_smoothing and not d.label_weight:
    raise UserError(
        f"config.label_smoothing={config.label_smoothing} smooths labels, "
        "which distillation without a label term does not read; set it to "
        "0, or give config.distill.label_weight.")
  if preprocess.op_names(config, config.pp_train)[-1:] != ["value_range"]:
    raise UserError(
        f"config.pp_train={config.pp_train!r}: distillation shows the "
        "teachers the student's images as they are, in the value range "
        "every model here reads; end the pipeline with value_range (images "
        "at their own shape and packed sequences are not distilled yet).")
  for i, (checkpoint, _) in enumerate(specs):
    _check_exists(checkpoint, i)
