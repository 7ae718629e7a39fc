"""The config a checkpoint runs with on its own: for `predict`, `analyze`
(`vit_jax/inference/`) and a distillation's teachers
(`vit_jax/training/teachers.py`).

It is the config given, else the training workdir's config.json, else one
read from the file's shapes (`architecture`) with the released models'
evaluation preprocessing (`resize|value_range`: no crop) at the resolution
the position embeddings were trained at, and sigmoid probabilities for an
ImageNet-21k head (trained with sigmoid cross-entropy). Imports no
TensorFlow.
"""

from typing import Optional

import ml_collections

from vit_jax import models
from vit_jax import paths
from vit_jax.config import defaults
from vit_jax.config import imports
from vit_jax.config import model_form
from vit_jax.weights import architecture
from vit_jax.weights import describe
from vit_jax.weights import loader
from vit_jax.weights.decisions import decide
from vit_jax.weights.files import cache
from vit_jax.weights.names import Converted

IMAGENET21K_CLASSES = 21843  # The released ImageNet-21k heads.


def merge_recorded(config: ml_collections.ConfigDict, recorded: dict):
  """`config` with the recorded values of the fields it has (JSON lists
  become the tuples the fields hold)."""

  def as_tuple(value):
    if isinstance(value, list):
      return tuple(as_tuple(x) for x in value)
    return value

  for key, value in recorded.items():
    if key not in config:
      continue
    if isinstance(config[key], ml_collections.ConfigDict):
      merge_recorded(config[key], value)
    else:
      config[key] = as_tuple(value)


def config_for(
    checkpoint: str, config=None, image_size=None, num_heads=None,
    sequence_length=None, cache_dir=None
) -> tuple[ml_collections.ConfigDict, bool, architecture.Architecture]:
  """(config, whether it is the training workdir's, the file's
  architecture); see the module doc. `sequence_length`: images at their
  own shape, that many patches each (NaFlex; any plain ViT). `cache_dir`:
  where a released name's file is kept (a given config's own otherwise)."""
  if config is not None:
    # Before `architecture.read` downloads a released name.
    loader.check_released_variant(checkpoint, config.model.variant)
    cache_dir = config.init.cache_dir
  arch = architecture.read(checkpoint, num_heads, cache_dir)
  # A workdir's own config; `locate` gives a released name's cached file.
  recorded = (loader.recorded_config(checkpoint) if config is None and
              paths.resolve(cache.locate(checkpoint, cache_dir)).is_dir() else
              None)
  if config is not None:
    config = config.copy_and_resolve_references()
  else:
    config = defaults.get_config()
    if recorded is not None:
      merge_recorded(config, recorded)
    else:
      config.model.update(arch.model_fields())
      config.image_size = arch.image_size
      # The released models' evaluation: resize to the resolution, no crop;
      # NaFlex's: each image at its own shape, as many patches as the
      # position table has entries.
      config.pp_eval = "resize|value_range"
      if arch.sequences:
        config.pp_eval = describe.SEQUENCE_PP_EVAL
        config.sequence_length = (arch.image_size //
                                  models.stride(config.model))**2
      if arch.num_classes == IMAGENET21K_CLASSES:  # Trained with sigmoids.
        config.loss = "sigmoid_xent"
  imports.load(config)  # What a recorded config's own modules register.
  config.init.checkpoint = checkpoint
  if cache_dir is not None:
    config.init.cache_dir = cache_dir
  config.init.dont_load = ()  # Nothing is re-initialised: the head is used.
  if image_size:
    config.image_size = image_size
  if sequence_length:
    config.sequence_length = sequence_length
    if not config.pp_eval.replace(" ", "").endswith("patchify"):
      config.pp_eval = describe.SEQUENCE_PP_EVAL
  models.check_image_size(config.model, config.image_size)
  return decide(config), recorded is not None, arch


def form_alone(
    checkpoint: str,
    num_heads=None) -> tuple[model_form.ModelForm, Optional[Converted]]:
  """The form `checkpoint` computes with on its own, whatever its sizes
  (no variant need describe them): its training workdir's, else what its
  file shows and states, with its origin's GELU (as `config_for` decides
  them); and the file's parameters in our names where it read them (not a
  workdir's). What an export of it must keep."""
  fields = model_form.defaults()
  recorded = (loader.recorded_config(checkpoint)
              if paths.resolve(checkpoint).is_dir() else None)
  source = None
  if recorded is not None:
    fields.update({k: recorded["model"][k] for k in fields})
  else:
    arch, source = architecture.read_with_source(checkpoint, num_heads,
                                                 need_variant=False)
    fields.update(arch.model_fields())
    del fields["variant"]
    gelu = loader.origin_gelu(checkpoint, source.origin)
    if gelu is not None:
      fields["gelu_approximate"] = gelu
  return model_form.ModelForm(**fields), source
