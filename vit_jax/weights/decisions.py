"""What a config leaves open, decided once, before anything is built.

The defaults leave one field open: `config.model.gelu_approximate` (None:
follow the weights the run starts from). `decide` turns a user's config,
with the run it resumes or the checkpoint it starts from, into a decided
copy, and says why at INFO: the field kept where set; else as the resumed
run computed it (its config.json; one written before the option existed:
the exact erf); else as the origin of the checkpoint
computes it (timm, Hugging Face: exact erf; the released .npz files: tanh);
else the released models' tanh approximation. Training, inference,
few-shot sweeps, VTAB and `inspect` call it first, and `models.build_model`
refuses a config that has not been through it, so every part reads the
same decided value (and config.json records it).
"""

import os
from typing import Optional

from absl import logging
import ml_collections

from vit_jax import paths
from vit_jax.weights import convert
from vit_jax.weights import loader
from vit_jax.weights import pytorch_dir
from vit_jax.weights import released


def _recorded_gelu(workdir) -> Optional[bool]:
  """The GELU form WORKDIR/config.json records (a run written before the
  option existed computed the exact erf: False); None without the file."""
  path = paths.resolve(workdir) / paths.CONFIG_FILE
  if not path.exists():
    return None
  value = pytorch_dir.read_config_json(path).get("model", {}).get(
      "gelu_approximate", False)
  return None if value is None else bool(value)


def _released_name(checkpoint: str) -> bool:
  """A released checkpoint's name (not a local file of that name)."""
  return released.lookup(str(checkpoint)) is not None and not os.path.exists(
      os.path.expanduser(str(checkpoint)))


def decide(config: ml_collections.ConfigDict, resumed_workdir=None,
           checkpoint: Optional[str] = None) -> ml_collections.ConfigDict:
  """`config` decided (a copy if anything changes). `resumed_workdir`: the
  workdir of a run being resumed; `checkpoint`: the weights it starts
  from (None: config.init.checkpoint)."""
  if checkpoint is None:
    checkpoint = config.init.checkpoint
  if checkpoint:  # Before a released checkpoint is downloaded.
    loader.check_released_variant(checkpoint, config.model.variant)
  if config.model.gelu_approximate is not None:
    return config
  value, why = True, "the released models' form (random init)"
  resumed = (_recorded_gelu(resumed_workdir)
             if resumed_workdir is not None else None)
  if resumed is not None:
    value, why = resumed, "as the resumed run computed it (its config.json)"
  elif checkpoint and _released_name(checkpoint):  # Known without a download.
    value, why = convert.ORIGIN_GELU_APPROXIMATE["released"], (
        "as the released models compute it")
  elif checkpoint:
    origin, approximate = loader.file_origin(checkpoint, config.init.cache_dir)
    if approximate is not None:
      value, why = approximate, f"as the weights' origin ({origin}) computes"
  config = config.copy_and_resolve_references()
  config.model.gelu_approximate = value
  logging.info("GELU: %s, %s (config.model.gelu_approximate was unset).",
               loader.GELU_NAMES[value], why)
  return config
