"""A distillation's teachers: frozen models, loaded as `vit-jax predict`
loads any checkpoint, sharded like the student, never saved with it.

Each teacher runs with its own config (`weights/standalone.py`: its
workdir's config.json, or one read from the file's shapes) at its own
resolution unless config.distill.teachers gives one, in inference mode, in
the student's compute dtype. It sees the student's images (after mixup)
resized to its resolution as its evaluation preprocessing's `resize` does,
never cropped again: only the geometry of its pp_eval changes, and every
model here reads the same value range.

Its parameters lie on the training mesh as config.sharding.params' rules
place the student's (FSDP and tensor parallelism apply, so a teacher larger
than one device fits; a rule that matches only the student's names is no
error). They are an argument of the train step, never donated and never
in a checkpoint: a resumed run loads its teachers again, and refuses them
where their fingerprint (a checksum of the parameters' bits, the same on
any mesh) differs from WORKDIR/teachers.json's. Imports no TensorFlow.
"""

import dataclasses
import hashlib
import json
import re
from typing import Any

from absl import logging
import flax
import flax.linen as nn
import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import ml_collections

from vit_jax import console
from vit_jax import models
from vit_jax import sharding
from vit_jax import weights
from vit_jax.data import preprocess
from vit_jax.errors import UserError
from vit_jax.errors import WeightsError
from vit_jax.training import distill
from vit_jax.training import fsdp

TEACHERS_FILE = "teachers.json"  # In the workdir: what the run learns from.
# Ops of a teacher's pp_eval that only set the geometry (the student's view
# is resized instead); value_range maps pixels as the student's does.
_GEOMETRY_OPS = ("resize", "resize_small", "central_crop", "resize_to_sequence",
                 "patchify")


@dataclasses.dataclass(frozen=True)
class Teacher:
  checkpoint: str
  config: ml_collections.ConfigDict  # Its own: model, image_size, pp_eval.
  model: nn.Module  # With its head, in the student's compute dtype.
  params: Any  # On the training mesh (ShapeDtypeStructs for a plan).
  params_sharding: Any

  @property
  def image_size(self) -> int:
    return self.config.image_size

  def describe(self) -> str:
    return (f"{self.config.model.variant} at {self.image_size} px from "
            f"{self.checkpoint}")


def view(images_BxHxWxC, image_size: int):
  """The student's images at a teacher's resolution: the very same array
  where they agree, else resized as the `resize` op resizes (bilinear,
  antialiased where it shrinks)."""
  batch, height, width, channels = images_BxHxWxC.shape
  if (height, width) == (image_size, image_size):
    return images_BxHxWxC
  return jax.image.resize(images_BxHxWxC,
                          (batch, image_size, image_size, channels), "bilinear",
                          antialias=True)


def _check_pixels(checkpoint: str, own: ml_collections.ConfigDict):
  """A teacher evaluated with an op that changes pixels other than the
  student's value_range cannot be shown the student's view as it is."""
  ops = preprocess.op_names(own, own.pp_eval)
  pixels = [op for op in ops if op not in _GEOMETRY_OPS]
  if pixels != ["value_range"]:
    raise UserError(
        f"The teacher {checkpoint} is evaluated with pp_eval={own.pp_eval!r}; "
        "distillation shows it the student's images resized to its "
        "resolution and in the value range (value_range), so it takes only "
        f"resize/crop ops besides value_range, not {', '.join(pixels)}.")


def _own_config(config: ml_collections.ConfigDict, checkpoint: str,
                image_size) -> tuple[ml_collections.ConfigDict, int]:
  """(the teacher's config, its head's classes): its own config, at
  `image_size` if given, computing in the student's dtype, in inference
  only (no FP8, no rematerialisation)."""
  own, _, arch = weights.config_for(checkpoint, image_size=image_size,
                                    cache_dir=config.init.cache_dir)
  if arch.sequences or own.sequence_length:
    raise UserError(
        f"The teacher {checkpoint} reads images at their own shape (NaFlex); "
        "a teacher here sees the student's square images. Give a teacher "
        "that reads square images.")
  _check_pixels(checkpoint, own)
  own.model.dtype = config.model.dtype
  own.model.fp8 = False
  own.model.remat = "none"
  return own, arch.num_classes


def _check_head(checkpoint: str, model, num_classes: int):
  if not model.num_classes:
    raise UserError(
        f"The teacher {checkpoint} has no classification head; distil from "
        "a model fine-tuned on the data's classes.")
  if model.num_classes != num_classes:
    raise UserError(
        f"The teacher {checkpoint} predicts {model.num_classes} classes; the "
        f"student learns the data's {num_classes}. Give a teacher with a "
        "head of the data's classes, in their order.")


def _rules_for(model, image_size: int, sharding_config):
  """The student's sharding config with the rules that match a parameter of
  the teacher's (a rule for the student's names alone is no error here)."""
  names = flax.traverse_util.flatten_dict(
      models.param_shapes(model, image_size), sep="/")
  kept = sharding_config.to_dict()
  kept["params"] = tuple(rule for rule in sharding_config.params if any(
      re.fullmatch(rule[0], name) for name in names))
  return ml_collections.ConfigDict(kept)


def _load_params(own, checkpoint: str, abstract, shardings):
  """The teacher's parameters on their shards; all must be in the file."""
  params = weights.init_params(own, checkpoint, abstract, shardings,
                               role="Teacher")
  missing = [
      name for name, leaf in flax.traverse_util.flatten_dict(
          params, sep="/").items() if isinstance(leaf, jax.ShapeDtypeStruct)
  ]
  if missing:
    raise WeightsError(
        f"The teacher {checkpoint} lacks {', '.join(missing[:5])}"
        f"{' ...' if len(missing) > 5 else ''}; a teacher must be whole.")
  return params


def load(config: ml_collections.ConfigDict, mesh, num_classes: int,
         abstract: bool = False) -> tuple[Teacher, ...]:
  """config.distill.teachers, each on `mesh` by config.sharding's rules;
  `abstract`: their shapes and shardings only (for a plan)."""
  loaded = []
  for checkpoint, image_size in distill.teacher_specs(config):
    own, classes = _own_config(config, checkpoint, image_size)
    model = models.build_model(own.model, classes)
    _check_head(checkpoint, model, num_classes)
    shapes, shardings = sharding.abstract_params(
        model, own.image_size, mesh,
        _rules_for(model, own.image_size, config.sharding))
    params = shapes if abstract else _load_params(own, checkpoint, shapes,
                                                  shardings)
    loaded.append(Teacher(checkpoint, own, model, params, shardings))
    if not abstract:
      console.say("Teacher %d: %s.", len(loaded), loaded[-1].describe())
  return tuple(loaded)


def params_of(teachers) -> tuple:
  return tuple(t.params for t in teachers)


def shardings_of(teachers) -> tuple:
  return tuple(t.params_sharding for t in teachers)


def make_apply(teachers, explicit: bool = False):
  """`apply(params, images) -> [B x K logits]`: each teacher (`params`: a
  tuple, one tree each) on `images` at its own resolution, in inference
  mode. FSDP-split parameters are gathered as the student's are
  (`fsdp.gathering_plan`; `explicit`: inside the loss run per shard)."""
  plans = [
      fsdp.gathering_plan(t.model, t.params_sharding, explicit=explicit)
      for t in teachers
  ]

  def apply(params, images):
    logits = []
    for teacher, plan, tree in zip(teachers, plans, params):
      out, _ = plan.wrap_model(teacher.model).apply(
          {"params": plan.gather(tree)}, view(images, teacher.image_size),
          train=False)
      logits.append(out)
    return logits

  return apply


def _bit_sums(params):
  """Per leaf: the sum of its values' bits and a sum weighted by position,
  both modulo 2^32 (integer sums: the same in any order, on any mesh)."""

  def sums(x):
    unsigned = {4: jnp.uint32, 2: jnp.uint16, 1: jnp.uint8}[x.dtype.itemsize]
    bits = jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)
    position = jnp.arange(x.size, dtype=jnp.uint32).reshape(x.shape)
    weights_ = position * jnp.uint32(2654435761) + jnp.uint32(1)
    return jnp.stack([
        jnp.sum(bits, dtype=jnp.uint32),
        jnp.sum(bits * weights_, dtype=jnp.uint32)
    ])

  return jax.tree.map(sums, params)


def fingerprint(params) -> str:
  """A checksum of a parameter tree's names, shapes and bits."""
  sums = flax.traverse_util.flatten_dict(
      jax.device_get(jax.jit(_bit_sums)(params)), sep="/")
  digest = hashlib.sha256()
  flat = flax.traverse_util.flatten_dict(params, sep="/")
  for name, leaf in sorted(flat.items()):
    digest.update(f"{name}:{leaf.shape}:{leaf.dtype}:".encode())
    digest.update(sums[name].tobytes())
  return digest.hexdigest()[:16]


def _described(teachers) -> list[dict]:
  return [{
      "checkpoint": t.checkpoint,
      "variant": t.config.model.variant,
      "image_size": t.image_size,
      "fingerprint": fingerprint(t.params)
  } for t in teachers]


def check_recorded(workdir, teachers, resumed: bool):
  """A resumed run's teachers are those it started with (their
  fingerprints in WORKDIR/teachers.json), else a one-line error; a new run
  records its teachers there."""
  path = workdir / TEACHERS_FILE
  current = _described(teachers)
  recorded = (json.loads(path.read_text())
              if resumed and path.exists() else None)
  # Every process has read the record before process 0 writes one.
  multihost_utils.sync_global_devices("teachers.json read")
  if recorded is None:
    if jax.process_index() == 0:
      path.write_text(json.dumps(current, indent=2))
    return
  prints = lambda described: [d["fingerprint"] for d in described]
  if prints(recorded) != prints(current):
    was = ", ".join(f"{r['checkpoint']} ({r['fingerprint']})" for r in recorded)
    now = ", ".join(f"{c['checkpoint']} ({c['fingerprint']})" for c in current)
    raise UserError(
        f"This run started with the teachers {was} ({path}) and now has "
        f"{now}: a teacher changed mid-run would change what the student "
        "learns. Restore the run's teachers, or start a new --workdir.")
  logging.info("The teachers are the ones the run started with (%s).", path)
