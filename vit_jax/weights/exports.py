"""What each exporter writes, checked before anything is written.

`vit-jax export` writes a model in a format by one of its writers
(`model_form.EXPORTERS`): `timm-dir` as timm's MlpMixer, NaFlexViT (images
at their own shape), Eva (RoPE) or VisionTransformer; `hf` as
transformers' DINOv3ViTModel (RoPE) or ViT; the `timm` state dict as
timm's MlpMixer or VisionTransformer. A writer writes the fields of the
model's form whose facts name it (`Facts.exports`) and the runtime ones,
and refuses, in one line naming the formats that hold the model, a model
with any other field away from its default: a new option is refused by
every writer until its facts name one (`tests/test_export_fields.py` sets
each field in turn). What a writer cannot write of a field it takes (a
value, a parameter) it refuses in its own module.

`npz` writes the parameters of any form; what its file cannot show is said
as the flags that load it (`unsaid`).
"""

import dataclasses
from typing import Optional

from vit_jax.config import model_form
from vit_jax.errors import WeightsError

FORMATS = ("npz", "timm", "hf", "timm-dir")
WORDS = {
    "timm-vit": "timm's VisionTransformer",
    "timm-naflex": "timm's NaFlexViT",
    "timm-eva": "timm's Eva",
    "timm-mixer": "timm's MlpMixer",
    "hf-vit": "transformers' ViT",
    "hf-dinov3": "transformers' DINOv3ViTModel",
    "hf-siglip": "transformers' SiglipModel",
}


def writer(fmt: str, model_config, mixer: bool,
           naflex: bool = False) -> Optional[str]:
  """The exporter that writes the model in `fmt` (None: no writer of `fmt`
  has such a model, or npz, which writes any)."""
  rope = model_config.rope != "none"
  if fmt == "timm-dir":
    if mixer:
      return "timm-mixer"
    if naflex:
      return "timm-naflex"
    return "timm-eva" if rope else "timm-vit"
  if fmt == "timm":
    return "timm-mixer" if mixer else "timm-vit"
  if fmt == "hf" and not mixer:
    return "hf-dinov3" if rope else "hf-vit"
  return None


def unwritten(model_config, exporter: str) -> dict:
  """{field: value} of the fields away from their defaults that `exporter`
  does not write; `model_config`: a `config.model` or a `ModelForm`."""
  written = set(model_form.written_by(exporter))
  defaults = model_form.defaults()
  return {
      name: getattr(model_config, name)
      for name in defaults
      if name not in written and getattr(model_config, name) != defaults[name]
  }


def refuse_unwritten(model_config, exporter: str, mixer: bool = False,
                     naflex: bool = False, towers: bool = False):
  """Refuses, in one line, a model with a field `exporter` does not write,
  naming the formats whose writers write all of it (an image-text model's
  `towers`: npz, big_vision's two-tower file)."""
  fields = unwritten(model_config, exporter)
  if not fields:
    return
  holding = [] if towers else [
      f"--format={fmt}" for fmt in ("timm-dir", "hf")
      if (other := writer(fmt, model_config, mixer, naflex)) not in (
          None, exporter) and not unwritten(model_config, other)
  ]
  said = ", ".join(
      f"config.model.{name}={value!r}" for name, value in fields.items())
  raise WeightsError(f"{WORDS[exporter]} has no place for this model's "
                     f"{said}: use {' or '.join(holding + ['--format=npz'])}.")


def unsaid(written_form: model_form.ModelForm,
           form: model_form.ModelForm) -> dict:
  """{field: value} of `form` that a file read alone (as `written_form`)
  does not say, beside the runtime fields (and a class token set where it
  would be there unset): the flags that load it as the model it was
  written from."""
  runtime = model_form.runtime_fields()
  said, meant = (dataclasses.replace(f, class_token=f.has_class_token)
                 for f in (written_form, form))
  return {
      name: getattr(form, name)
      for name in model_form.defaults()
      if name not in runtime and getattr(said, name) != getattr(meant, name)
  }
