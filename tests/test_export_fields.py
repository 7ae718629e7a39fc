"""Every field of the model's form through `vit-jax export`: each export
is faithful or refused in one line.

Each field of `ModelForm` is set in turn (each choice of a `Literal`, the
other bool, another number; `_NEEDS` adds what a value needs to build) on
a tiny model, and the model is exported in every format whose writers take
models of its kind (`_BASES`): a plain ViT (every field), a RoPE ViT
without a head (the fields timm's Eva or transformers' DINOv3 write) and an
MLP-Mixer (the fields timm's MlpMixer writes). An export is faithful when
what it wrote reads back here as the same model, from the directory alone
(hf, timm-dir) or from the file with the flags the export names (npz,
timm): the same form and parameters, or the same logits where the writer
rewrote them (a fixed table written as learned values, a FlexiViT at the
patch size it ran); and, where the PyTorch environment exists, transformers
and timm compute the same logits from the directories, in one subprocess.
Otherwise the export is refused in one line naming a format, before
anything is written. A new field is in the loop without an edit here.
"""

import dataclasses
import os
import re
import typing
from typing import Any
from typing import NamedTuple
from typing import Optional

import flax
import jax
import numpy as np
import pytest

from tests import test_exports
from tests.references import stored
from vit_jax import inference
from vit_jax import models
from vit_jax import weights
from vit_jax.commands import export
from vit_jax.config import defaults
from vit_jax.config import model_form
from vit_jax.config.model_form import ModelForm
from vit_jax.errors import UserError
from vit_jax.fewshot import sweep
from vit_jax.models import scan
from vit_jax.models import variants
from vit_jax.models.model_checks import check_model_config

_VIT = variants.Variant(hidden_size=32, mlp_dim=64, num_heads=4, num_layers=2,
                        patch_size=8)
_MIXER = variants.MixerVariant(32, 16, 64, 2, 8)


class Base(NamedTuple):
  """A kind of model the fields are set on."""
  size: Any
  form: dict
  classes: Optional[int]  # None: no head.
  formats: tuple  # What it is exported as.
  writers: tuple  # Its fields: those these writers write; (): every one.


_BASES = {
    "vit": Base(_VIT, {}, 10, ("npz", "timm", "hf", "timm-dir"), ()),
    # DINOv3's form, which both RoPE writers take (transformers' has no
    # head, Eva's LayerNorm epsilon is 1e-5 or 1e-6).
    "rope": Base(
        _VIT,
        dict(rope="dinov3", posemb="none", class_token=True, num_registers=1,
             layer_scale=1.0, gelu_approximate=False, layer_norm_eps=1e-5),
        None, ("hf", "timm-dir"), ("timm-eva", "hf-dinov3")),
    # timm's Mixer functions are S, B and L (test_exports writes one of
    # them): this one's timm-dir export is refused, after its fields pass.
    "mixer": Base(_MIXER, dict(classifier="gap", gelu_approximate=False), 10,
                  ("timm", "timm-dir"), ("timm-mixer",)),
}
# What a value needs beside it to build.
_ROPE = dict(rope="axial")
_NEEDS = {
    "class_token": dict(classifier="gap"),
    "rope_temperature": _ROPE,
    "rope_layout": _ROPE,
    "rope_axes": _ROPE,
    "rope_grid_offset": _ROPE,
    "rope_reference_grid": _ROPE,
    "rope_shift": _ROPE,
    "rope_jitter": _ROPE,
    "rope_rescale": _ROPE,
    "map_heads": dict(classifier="map"),
}
_MIXER_ONLY = ("mixer_tiles",)
_IMAGE_SIZE = 32


def _variant_name(size) -> str:
  """A name of `size` in the variant table (the size a FlexiViT runs at too:
  the directories write the model as it runs)."""
  name = f"export-fields-{type(size).__name__}"
  variants.register(name, size)
  if isinstance(size, variants.Variant):
    variants.register(f"{name}-p4", dataclasses.replace(size, patch_size=4))
  return name


def _values(field: dataclasses.Field, current) -> list:
  """Values of `field` other than `current`: every choice (but cuDNN's
  attention, which needs a GPU to be built), the other bool, another
  number."""
  choices = model_form.choices(field.name)
  if choices:
    return [
        c for c in choices
        if c != current and (field.name, c) != ("attention", "cudnn")
    ]
  hint = typing.get_type_hints(ModelForm)[field.name]
  kinds = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
  if kinds[0] is bool:
    return [True, False] if current is None else [not current]
  if current is None:
    return [kinds[0](4 if kinds[0] is int else 0.5)]
  if kinds[0] is int:
    return [current + 1]
  return [current * 2 if current else 0.5]


def _options(base: str, field: str, value) -> dict:
  form = _BASES[base].form
  needs = {k: v for k, v in _NEEDS.get(field, {}).items() if k not in form}
  return {**form, **needs, **({} if field == "base" else {field: value})}


def _builds(base: str, field: str, value) -> bool:
  """Whether the config's checks take the model (a field set on another
  base than the plain ViT may not apply to it: a Mixer's class token)."""
  config = defaults.get_model_config()
  config.variant = _variant_name(_BASES[base].size)
  config.update(_options(base, field, value))
  try:
    check_model_config(config)
  except UserError:
    if base == "vit":
      raise  # Every field applies to a ViT: _NEEDS says what it needs.
    return False
  return True


def _cases():
  """(base, field, value) of every field set on each base that takes it."""
  for field in dataclasses.fields(ModelForm):
    facts = model_form.facts(field.name)
    for base, kind in _BASES.items():
      if base == "vit" and field.name in _MIXER_ONLY:
        continue
      if kind.writers and (facts.runtime or
                           not set(facts.exports) & set(kind.writers)):
        continue
      for value in _values(field, kind.form.get(field.name, field.default)):
        if _builds(base, field.name, value):
          yield base, field.name, value


CASES = [(base, "base", None) for base in _BASES] + list(_cases())
# Registered while collecting (other modules' tables of variants are read
# then too): registered again by the tests that build them.
for _name in [n for n in variants.VARIANTS if n.startswith("export-fields-")]:
  del variants.VARIANTS[_name]


def _model(base: str, field: str, value):
  return models.create_model(_BASES[base].size, _BASES[base].classes,
                             **_options(base, field, value))


def _params(model) -> dict:
  """Random parameters, the same for the same model, exact in bfloat16 (so
  that param_dtype=bfloat16 keeps them), a head included."""
  shapes = jax.eval_shape(model.init, jax.random.key(0),
                          np.zeros((1, _IMAGE_SIZE, _IMAGE_SIZE, 3)))["params"]
  rng = np.random.default_rng(0)
  return jax.tree.map(
      lambda x: np.asarray((0.3 * rng.normal(size=x.shape)).astype(
          jax.numpy.bfloat16), np.float32), shapes)


def _config(model):
  config = defaults.get_config()
  config.image_size = _IMAGE_SIZE
  config.pp_eval = "resize|value_range"
  config.model.variant = _variant_name(model.size)
  for name in model_form.defaults():
    config.model[name] = getattr(model.form, name)
  return config


def _flat(params) -> dict:
  flat = flax.traverse_util.flatten_dict(jax.device_get(params), sep="/")
  if scan.is_scanned(params):
    flat = scan.unstack_flat(flat)
  return {k: np.asarray(v, np.float32) for k, v in flat.items()}


_FORWARDS = {}


def _logits(model, params) -> np.ndarray:
  """The model's outputs of stored.tiny_images(), one compile per form."""
  key = (type(model), model.num_classes, model.size, model.form)
  if key not in _FORWARDS:
    _FORWARDS[key] = jax.jit(lambda p, x: model.apply({"params": p}, x)[0])
  return np.asarray(_FORWARDS[key](params, stored.tiny_images()))


def _evaluated(form: ModelForm) -> ModelForm:
  """`form` as it computes images at the export's resolution: its runtime
  fields at their defaults (fp32, no dropout, ...), the fields only images
  at their own shape read too, the class token said."""
  defaults_ = model_form.defaults()
  return dataclasses.replace(
      form, class_token=form.has_class_token, **{
          name: defaults_[name] for name in model_form.runtime_fields() +
          model_form.sequences_only_fields()
      })


def _said_flags(line: str) -> dict:
  """{field: value} of the `--config.model.NAME=VALUE` flags of `line`."""
  out = {}
  for name, text in re.findall(r"--config\.model\.(\w+)=(\S+)", line):
    default = model_form.defaults()[name]
    if text == "None":
      out[name] = None
    elif text in ("True", "False"):
      out[name] = text == "True"
    elif isinstance(default, str):
      out[name] = text
    else:
      out[name] = (int(text) if re.fullmatch(r"-?\d+", text) else float(text))
  return out


def _read_back(fmt: str, out: str, line: str):
  """(model, params) `out` loads as: a directory alone, a file with the
  flags the export named."""
  if fmt in export.DIRECTORY_FORMATS:
    loaded = inference.load(out)
  else:
    config = defaults.get_config()
    config.image_size = _IMAGE_SIZE
    config = sweep.with_model_of(config, out)
    config.model.update(_said_flags(line))
    loaded = inference.load(out, config)
  return loaded.model, _flat(loaded.params)


def _export(base, field, value, folder) -> dict:
  """{format: (what, said)} of one case: ("faithful", where it was
  written), ("refused", the message), ("unread", where it was written and
  why this project's loader does not read it back: an Eva form no family
  here reads, which only timm's logits can check) or ("differs", why)."""
  model = _model(base, field, value)
  params = _params(model)
  source = str(folder / f"{base}-{field}-{value}.npz")
  weights.save_npz(params, source)
  config = _config(model)
  ours_flat = _flat(params)
  outcomes = {}
  for fmt in _BASES[base].formats:
    suffix = "" if fmt in export.DIRECTORY_FORMATS else f".{fmt}"
    out = str(folder / f"{base}-{field}-{value}-{fmt}{suffix}")
    try:
      if fmt in export.DIRECTORY_FORMATS:
        line = export.export_directory(source, fmt, out, config=config)
      else:
        line = export.export_file(source, fmt, out, config=config)
    except UserError as e:
      assert not os.path.exists(out), out  # Refused before writing.
      outcomes[fmt] = ("refused", str(e))
      continue
    try:
      back, back_flat = _read_back(fmt, out, line)
    except UserError as e:
      outcomes[fmt] = ("unread", (out, str(e)))
      continue
    same_form = _evaluated(back.form) == _evaluated(model.form)
    same_params = back_flat.keys() == ours_flat.keys() and all(
        np.array_equal(back_flat[k], ours_flat[k]) for k in ours_flat)
    if same_form and same_params and back.size == model.size:
      outcomes[fmt] = ("faithful", out)
      continue
    ours = _logits(model.clone(form=_evaluated(model.form)),
                   flax.traverse_util.unflatten_dict(ours_flat, sep="/"))
    theirs = _logits(back, flax.traverse_util.unflatten_dict(
        back_flat, sep="/"))
    error = np.abs(ours - theirs).max()
    outcomes[fmt] = (("faithful", out) if error < 2e-5 else
                     ("differs", f"logits differ by {error:g}"))
  return outcomes


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
  folder = tmp_path_factory.mktemp("fields")
  return {case: _export(*case, folder) for case in CASES}


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_an_export_is_faithful_or_refused_in_one_line(case, outcomes):
  for fmt, (what, said) in outcomes[case].items():
    assert what != "differs", (fmt, said)
    if what == "refused":
      assert "\n" not in said and "--format=" in said, (fmt, said)
    if what == "unread":  # Only timm's own logits can check it.
      assert fmt == "timm-dir" and "timm's Eva" in said[1], (fmt, said)


def test_each_writer_writes_what_its_facts_say(outcomes):
  """Each field a writer names (`Facts.exports`) is written by it on a base
  it writes (a value it cannot write aside), and the bases themselves by
  every format."""
  for base in _BASES:
    for fmt, (what, said) in outcomes[base, "base", None].items():
      assert what == "faithful" or (base, fmt) == ("mixer", "timm-dir"), said
  written = {(base, field)
             for (base, field, _), by_format in outcomes.items()
             if any(what == "faithful" for what, _ in by_format.values())}
  for field in ("classifier", "num_registers", "layer_scale", "qk_norm",
                "swiglu", "rope_temperature", "mixer_tiles", "quick_gelu",
                "gelu_approximate", "dtype", "scan_layers"):
    assert any((base, field) in written for base in _BASES), field


@test_exports._ONE_WORKER
def test_their_libraries_compute_the_same_logits(outcomes, tmp_path_factory):
  """transformers and timm, from every directory written (one run)."""
  directories, references = {}, {}
  for case, by_format in outcomes.items():
    model = _model(*case)
    for fmt, (what, out) in by_format.items():
      out = out[0] if what == "unread" else out
      if what in ("faithful", "unread") and fmt in export.DIRECTORY_FORMATS:
        key = ("-".join(map(str, case)), fmt)
        directories[key] = out
        references[key] = _logits(
            model.clone(form=_evaluated(model.form)),
            flax.traverse_util.unflatten_dict(_flat(_params(model)), sep="/"))
  theirs = test_exports._their_logits(directories, stored.tiny_images(),
                                      tmp_path_factory.mktemp("theirs"))
  for key, reference in references.items():
    error = np.abs(theirs[key] - reference).max()
    assert error < 2e-5, (key, error)
