"""A checkpoint ready to apply to images, for `predict` and `analyze`.

    loaded = inference.load("workdirs/demo/pretrain")        # Orbax workdir
    loaded = inference.load("ViT-B_16.npz", image_size=384)  # any file
    loaded = inference.load("ViT-B/16@i21k-ft-i1k")  # a released name

The config (model, resolution, evaluation preprocessing;
`weights/standalone.py`) is the one given, else the workdir's
config.json, else one read from the file's shapes
(`weights.architecture`) with the released models' evaluation
preprocessing (`resize|value_range`: no crop) at the resolution the
position embeddings were trained at, and sigmoid probabilities for an
ImageNet-21k head (trained with sigmoid cross-entropy); `image_size`
overrides the resolution (position embeddings are resized). One process:
the parameters are replicated on its devices; batches are split over them.
"""

import dataclasses
import re
from typing import Any
from typing import Optional

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
import ml_collections

from vit_jax import console
from vit_jax import models
from vit_jax import paths
from vit_jax import sharding
from vit_jax import weights
from vit_jax.errors import UserError

_WORDNET_ID = re.compile(r"n\d{8}")  # imagenet2012's own "names".


@dataclasses.dataclass
class Loaded:
  checkpoint: str
  config: ml_collections.ConfigDict  # Model, image_size, pp_eval, dataset.
  model: Any  # models.VisionTransformer, with the file's head (if any).
  params: Any
  mesh: Mesh
  params_sharding: Any
  trained_here: bool  # The config is the training workdir's config.json.

  @property
  def num_classes(self) -> Optional[int]:
    return self.model.num_classes

  def batch_size(self, requested: int) -> int:
    """`requested` rounded up to split evenly over the local devices."""
    devices = self.mesh.devices.size
    return -(-requested // devices) * devices

  @property
  def stride(self) -> int:
    """Pixels per token along each side."""
    return models.stride(self.config.model)


# How images at their own shape are evaluated (`data/sequence_ops.py`).
SEQUENCE_PP_EVAL = weights.SEQUENCE_PP_EVAL
# The config a checkpoint runs with (`weights/standalone.py`).
config_for = weights.config_for


def load(checkpoint: str, config=None, image_size=None, num_heads=None,
         sequence_length=None) -> Loaded:
  config, trained_here, arch = config_for(checkpoint, config, image_size,
                                          num_heads, sequence_length)
  model = models.build_model(config.model, arch.num_classes)
  mesh = sharding.make_mesh(devices=jax.local_devices())
  # Random init only where the file lacks a parameter (rarely, at inference).
  params, params_sharding = sharding.abstract_params(model, config.image_size,
                                                     mesh)
  params = weights.init_params(
      config, checkpoint, params,
      params_sharding, fill=lambda: sharding.random_params(
          model, config.image_size, config.seed, mesh)[0])
  return Loaded(checkpoint, config, model, params, mesh, params_sharding,
                trained_here)


def require_head(loaded: Loaded):
  if not loaded.num_classes:
    raise UserError(
        f"{loaded.checkpoint} has no classification head (a self-supervised "
        "or head-less checkpoint); fine-tune it first, then predict.")


def class_names(loaded: Loaded, labels_file: Optional[str] = None):
  """Names of the head's classes (see `names_of_classes`)."""
  require_head(loaded)
  return names_of_classes(loaded.config, loaded.checkpoint, loaded.trained_here,
                          loaded.num_classes, labels_file)


def names_of_classes(config, checkpoint: str, trained_here: bool, count: int,
                     labels_file: Optional[str] = None):
  """Names of a head's `count` classes: `labels_file` (one per line), else
  the training dataset's (`trained_here`: config is the workdir's), else
  ImageNet-1k's for a 1000-class head, else the indices. Returns (names,
  where they came from)."""
  from vit_jax.data import sources  # pylint: disable=g-import-not-at-top
  from vit_jax.data import specs  # pylint: disable=g-import-not-at-top
  if labels_file:
    names = [
        line.strip()
        for line in paths.resolve(labels_file).read_text().splitlines()
        if line.strip()
    ]
    if len(names) != count:
      raise UserError(f"{labels_file} names {len(names)} classes; the head "
                      f"has {count}. Give one name per line, in class order.")
    return names, labels_file
  stated = weights.class_names(paths.resolve(checkpoint))
  if stated and len(stated) == count:
    return stated, f"{checkpoint}'s config.json"
  if trained_here:
    workdir = weights.training_workdir(checkpoint)
    names = sources.label_names(specs.training(config), index_dir=workdir)
    if (names and len(names) == count and
        not all(_WORDNET_ID.fullmatch(n) for n in names)):
      return names, f"the training dataset ({config.dataset})"
  if count == 1000:  # imagenet2012's own names are WordNet IDs.
    return sources.imagenet_names(), "ImageNet-1k"
  return [str(i) for i in range(count)], "class indices"


def make_apply_fn(loaded: Loaded, fn, intermediates: bool = False):
  """`fn((logits, intermediates), images) -> tree` of per-image results,
  jitted on the mesh for batches of images (split over the devices).
  `intermediates` asks the model for per-block outputs and attention."""

  def apply(params, images):
    return fn(
        loaded.model.apply({"params": params}, images,
                           return_intermediates=intermediates), images)

  return sharding.jit_on_mesh(
      apply, loaded.mesh, (),
      in_shardings=(loaded.params_sharding, sharding.batch_sharding(
          loaded.mesh)), out_shardings=sharding.batch_sharding(loaded.mesh))


def probabilities(config: ml_collections.ConfigDict, logits):
  """Per-class probabilities as the head was trained: softmax, or one
  sigmoid per class for `sigmoid_xent` (several labels per image)."""
  if config.loss == "sigmoid_xent":
    return jax.nn.sigmoid(logits)
  return jax.nn.softmax(logits.astype(jnp.float32))


def describe(loaded: Loaded) -> str:
  return (f"{loaded.config.model.variant} at {loaded.config.image_size} px" +
          (f", {loaded.num_classes} classes"
           if loaded.num_classes else ", no head"))


def predict(loaded: Loaded, batches, files, top_k: int):
  """[(file, class indices, probabilities)] of the `top_k` classes of every
  image in `batches` (`data.image_files.ImageFiles`: padded, with the index
  of each image's file in `files`), best first."""
  require_head(loaded)
  k = min(top_k, loaded.num_classes)
  apply = make_apply_fn(
      loaded, lambda outputs, images: jax.lax.top_k(
          probabilities(loaded.config, outputs[0]), k))
  rows = []
  for batch in console.progress(batches, batches.num_batches(), "Predicting"):
    images = sharding.to_global_batch(batch["image"], loaded.mesh)
    top_probs, top_classes = jax.device_get(apply(loaded.params, images))
    for i in range(len(batch["mask"])):
      if batch["mask"][i]:
        rows.append((files[batch["index"][i]], top_classes[i], top_probs[i]))
  return rows
