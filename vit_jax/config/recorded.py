"""A run's recorded config (WORKDIR/config.json), upgraded where it is read.

A workdir records its whole decided config. One written by an older
version lacks the fields added since; `upgrade` gives each the value that
keeps the recorded run's meaning (the GELU of runs recorded before it was
an option was the exact erf; a new option's default is off, as the run
was), once, where the file is read, so nothing downstream reads a field
through a fallback.
"""

import json

from etils import epath

from vit_jax.config import model_form
from vit_jax.errors import WeightsError


def _added_for(model: dict) -> dict:
  """Fields added since whose value that keeps the run's meaning depends
  on its other fields: RoPE's augmentations were drawn per image before
  `rope_augment_per` (a run without them keeps the default)."""
  augmented = (model.get("rope_shift", 0) or model.get("rope_jitter", 1) != 1 or
               model.get("rope_rescale", 1) != 1)
  return {"rope_augment_per": "image"} if augmented else {}


def upgrade(recorded: dict) -> dict:
  """`recorded` (a config.json's object) with every model field added
  since: its default (a new option is off by default, which is what an
  older run computed), or where that would change the run's meaning the
  value it had (`Facts.absent_means`: the erf GELU of runs before it was
  an option, the bilinear resizing fixed before it was open)."""
  model = recorded.get("model", {})
  model = {
      **model_form.defaults(),
      **model_form.absent_values(),
      **_added_for(model),
      **model
  }
  return {**recorded, "model": model}


def read_json(path: epath.Path, what: str = "the weights beside it") -> dict:
  """A config.json (a workdir's, transformers' or timm's) as an object;
  one that is not is said in one line."""
  try:
    config, why = json.loads(path.read_text()), ""
  except ValueError as e:
    config, why = None, f" ({e})"
  if not isinstance(config, dict):
    raise WeightsError(
        f"{path} is not a JSON object{why}, so {what} cannot be read with "
        "it: restore the file (transformers and timm write theirs, `vit-jax "
        "train` a workdir's), or move it away and name the weights file "
        "itself.")
  return config


def read(path: epath.Path) -> dict:
  """WORKDIR/config.json at `path`, upgraded."""
  return upgrade(read_json(path, "the run"))
