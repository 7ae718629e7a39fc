"""Models of any size and form for tests, in one call:

    model = vit(7, hidden_size=32, mlp_dim=64, num_heads=4, num_layers=2,
                patch_size=4, classifier="gap", qk_norm=True)

The sizes make the variant (`models.Variant`), every other keyword is an
option of the form (`vit_jax.config.model_form.ModelForm`), through
`models.create_model`; `run_patch_size` is the form's `patch_size` (the
patch size a FlexiViT runs at; `patch_size` is the stored one).
"""

import dataclasses

from vit_jax import models
from vit_jax.config import model_form

_VIT_SIZES = tuple(f.name for f in dataclasses.fields(models.Variant))
_MIXER_SIZES = tuple(f.name for f in dataclasses.fields(models.MixerVariant))


def vit(num_classes=None, run_patch_size=None, **fields):
  """A ViT of these sizes and options."""
  size = models.Variant(**{k: fields.pop(k) for k in _VIT_SIZES if k in fields})
  if run_patch_size is not None:
    fields["patch_size"] = run_patch_size
  return models.create_model(size, num_classes, **fields)


def mixer(num_classes=None, **fields):
  """An MLP-Mixer of these sizes and options."""
  size = models.MixerVariant(
      **{k: fields.pop(k) for k in _MIXER_SIZES if k in fields})
  return models.create_model(size, num_classes, **fields)


def with_form(model, **options):
  """`model` with these options of its form changed."""
  return model.clone(form=dataclasses.replace(model.form, **options))


def with_size(model, **sizes):
  """`model` with these of its sizes changed."""
  return model.clone(size=dataclasses.replace(model.size, **sizes))


def build(model_config, num_classes=None, **kwargs):
  """`models.build_model` of a bare `config.model`: the open fields it
  leaves unset decided as `weights.decide` does without weights (random
  init), the ones it sets kept."""
  model_config = model_config.copy_and_resolve_references()
  defaults = model_form.defaults()
  for name in model_form.open_fields():
    if model_config[name] is None:
      model_config[name] = defaults[name]
  return models.build_model(model_config, num_classes, **kwargs)
