"""What a config leaves open, decided once, before anything is built.

The defaults leave two fields open (None: follow the weights the run starts
from): `config.model.gelu_approximate` and `config.model.posemb_interpolation`.
`decide` turns a user's config, with the run it resumes or the checkpoint
it starts from, into a decided copy, and says why at INFO: a field kept
where set; else as the resumed run computed it (its config.json; one
written before the GELU option existed: the exact erf); else as the
checkpoint's origin computes it (GELU: timm, Hugging Face the exact erf,
the released .npz files tanh; position-embedding resizing: timm bicubic,
the others bilinear); else the released models' tanh and big_vision's
bilinear. Training, inference,
few-shot sweeps, VTAB and `inspect` call it first, and `models.build_model`
refuses a config that has not been through it, so every part reads the
same decided value (and config.json records it).
"""

import functools
import os
from typing import Optional

from absl import logging
import ml_collections

from vit_jax import paths
from vit_jax.config import model_form
from vit_jax.config import recorded
from vit_jax.errors import UserError
from vit_jax.weights import loader
from vit_jax.weights import origins
from vit_jax.weights import report
from vit_jax.weights.files import released


def _released_name(checkpoint: str) -> bool:
  """A released `.npz` checkpoint's name (not a local file of that name;
  the Hub's timm files say their origin once read)."""
  entry = released.lookup(str(checkpoint))
  return entry is not None and entry.url.endswith(".npz") and (
      not os.path.exists(os.path.expanduser(str(checkpoint))))


def decide(config: ml_collections.ConfigDict, resumed_workdir=None,
           checkpoint: Optional[str] = None) -> ml_collections.ConfigDict:
  """`config` decided (a copy if anything changes). `resumed_workdir`: the
  workdir of a run being resumed; `checkpoint`: the weights it starts
  from (None: config.init.checkpoint)."""
  if checkpoint is None:
    checkpoint = config.init.checkpoint
  if checkpoint:  # Before a released checkpoint is downloaded.
    loader.check_released_variant(checkpoint, config.model.variant)
  open_fields = [f for f in _DECIDERS if config.model[f] is None]
  if not open_fields:
    return config
  run = (_recorded_model(resumed_workdir)
         if resumed_workdir is not None else None)

  @functools.cache
  def origin() -> Optional[str]:
    if checkpoint and _released_name(checkpoint):
      return "released"  # Known without a download.
    if checkpoint:
      return loader.file_origin(checkpoint, config.init.cache_dir)[0]
    return None

  config = config.copy_and_resolve_references()
  for field in open_fields:
    value, why = _DECIDERS[field](run, origin, checkpoint)
    setattr(config.model, field, value)
    said = report.GELU_NAMES[value] if field == "gelu_approximate" else value
    logging.info("%s: %s, %s (config.model.%s was unset).", _LABELS[field],
                 said, why, field)
  return config


def decide_text(config, resumed_workdir=None):
  """An image-text config's text fields decided: a resumed run's
  tokenizer (the file it kept), the vocabulary where unset (its
  tokenizer's). The image-text objectives call it after `decide`."""
  return _decided_vocabulary(_kept_tokenizer(config, resumed_workdir))


def _kept_tokenizer(config, resumed_workdir):
  """A resumed image-text run reads the tokenizer file it kept (the pieces
  it was trained with: `tokenizer.keep`)."""
  from vit_jax.data import tokenizer  # pylint: disable=g-import-not-at-top
  kept = resumed_workdir is not None and tokenizer.kept(resumed_workdir)
  if not kept or config.text.tokenizer == kept:
    return config
  config = config.copy_and_resolve_references()
  logging.info("Tokenizer: %s, which the run kept (config.text.tokenizer=%s).",
               kept, config.text.tokenizer)
  config.text.tokenizer = kept
  return config


def _decided_vocabulary(config):
  """An image-text config's text.vocab_size, where unset: its tokenizer's."""
  from vit_jax.data import tokenizer  # pylint: disable=g-import-not-at-top
  if config.text.tokenizer == tokenizer.NO_TEXTS:
    return config
  size = tokenizer.load_tokenizer(config.text.tokenizer).vocab_size
  if config.text.vocab_size:
    if size > config.text.vocab_size:  # Ids past the table: NaN embeddings.
      raise UserError(
          f"config.text.tokenizer={config.text.tokenizer} has {size} pieces, "
          f"more than the text tower's {config.text.vocab_size} "
          "(config.text.vocab_size, or its checkpoint's table): give the "
          "tokenizer the tower was trained with.")
    return config
  config = config.copy_and_resolve_references()
  config.text.vocab_size = size
  logging.info(
      "Text vocabulary: %d pieces, config.text.tokenizer=%s's "
      "(config.text.vocab_size was unset).", size, config.text.tokenizer)
  return config


def _recorded_model(workdir) -> Optional[dict]:
  """The model section WORKDIR/config.json records; None without it."""
  path = paths.resolve(workdir) / paths.CONFIG_FILE
  if not path.exists():
    return None
  return recorded.read(path)["model"]


def _gelu(run, origin, checkpoint):
  if run is not None and run["gelu_approximate"] is not None:
    said = "as the resumed run computed it (its config.json)"
    return bool(run["gelu_approximate"]), said
  if origin() == "released":
    return origins.ORIGINS["released"].gelu_approximate, (
        "as the released models compute it")
  if origin() is not None:
    approximate = loader.origin_gelu(checkpoint, origin())
    if approximate is not None:
      return approximate, f"as the weights' origin ({origin()}) computes"
  return model_form.defaults()["gelu_approximate"], (
      "the released models' form (random init)")


def _interpolation(run, origin, checkpoint):
  """How patch sequences resize learned position embeddings: as the
  weights learned them (timm's NaFlexViT: bicubic, its SigLIP 2 ports
  bilinear; big_vision: bilinear)."""
  if run is not None and run["posemb_interpolation"]:
    return run["posemb_interpolation"], (
        "as the resumed run computed it (its config.json)")
  if origin() == "timm":
    stated = {
        **loader.name_options(checkpoint, "timm"),
        **origins.stated_options(checkpoint)
    }
    return stated.get("posemb_interpolation",
                      "bicubic"), ("as timm resizes them for this model")
  if origin() is not None:
    return "bilinear", f"as {origin()} weights are resized"
  return model_form.defaults()["posemb_interpolation"], (
      "big_vision's NaFlex form (random init)")


_LABELS = {
    "gelu_approximate": "GELU",
    "posemb_interpolation": "Position embeddings resized per image"
}
_DECIDERS = {"gelu_approximate": _gelu, "posemb_interpolation": _interpolation}
