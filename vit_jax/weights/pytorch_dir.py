"""Directories the PyTorch code bases load: transformers' (`save_pretrained`,
config.json with `model_type`) and timm's (`save_for_hf`, config.json with
`architecture`), each beside a `model.safetensors` (as `vit-jax export`
writes them and the Hub serves them) or a `pytorch_model.bin` (timm's
save_for_hf default, older Hub repositories). Read as their weights file,
plus what their config.json says and the weights cannot show: the
activation, the LayerNorm epsilon, and a NaFlexViT's resizing of its
position table.
"""

import json
from typing import Optional

from etils import epath

from vit_jax.errors import WeightsError
from vit_jax.weights import timm_naflex

WEIGHTS = "model.safetensors"
# What timm's save_for_hf writes by default, and older Hub repositories hold.
PICKLED_WEIGHTS = "pytorch_model.bin"
CONFIG = "config.json"
# timm's act_layer / transformers' hidden_act -> config.model fields.
_ACTIVATIONS = {
    "gelu": dict(gelu_approximate=False),
    "gelu_tanh": dict(gelu_approximate=True),
    "gelu_pytorch_tanh": dict(gelu_approximate=True),
    "gelu_new": dict(gelu_approximate=True),
    "quick_gelu": dict(quick_gelu=True),
}


def read_config_json(path: epath.Path) -> dict:
  """A config.json beside weights (transformers', timm's or a workdir's);
  one that is not a JSON object is said in one line."""
  try:
    config, why = json.loads(path.read_text()), ""
  except ValueError as e:
    config, why = None, f" ({e})"
  if not isinstance(config, dict):
    raise WeightsError(
        f"{path} is not a JSON object{why}, so the weights beside it cannot "
        "be read with it: restore the file (transformers and timm write "
        "theirs, `vit-jax train` a workdir's), or move it away and name the "
        "weights file itself.")
  return config


def _weights(directory: epath.Path) -> Optional[epath.Path]:
  for name in (WEIGHTS, PICKLED_WEIGHTS):
    if (directory / name).exists():
      return directory / name
  return None


def _config(directory: epath.Path) -> Optional[dict]:
  """The directory's config.json if it is one of the two code bases'."""
  if not (directory.is_dir() and _weights(directory) is not None and
          (directory / CONFIG).exists()):
    return None
  config = read_config_json(directory / CONFIG)
  if "model_type" in config or "architecture" in config:
    return config
  return None


def weights_file(directory: epath.Path) -> Optional[epath.Path]:
  """DIRECTORY/model.safetensors (else pytorch_model.bin) of such a
  directory; None otherwise."""
  return _weights(directory) if _config(directory) is not None else None


def class_names(directory: epath.Path) -> Optional[list[str]]:
  """The class names its config.json gives (transformers' `id2label`,
  timm's `label_names`); None if it gives none."""
  config = _config(directory)
  if config is None:
    return None
  if "label_names" in config:
    return [str(name) for name in config["label_names"]]
  labels = config.get("id2label")
  if labels and "architecture" not in config:
    return [str(labels[str(i)]) for i in range(len(labels))]
  return None


def model_options(directory: epath.Path) -> dict:
  """The `config.model` fields its config.json states (none for a file)."""
  config = _config(directory)
  if config is None:
    return {}
  if "architecture" in config:  # timm's.
    args = config.get("model_args", {})
    naflex = config["architecture"].startswith("naflexvit")
    if naflex:  # What its function sets, then model_args over it.
      args = {**timm_naflex.function_options(config["architecture"]), **args}
    options = dict(_ACTIVATIONS.get(args.get("act_layer", "gelu"), {}))
    if naflex:
      options["posemb_interpolation"] = args.get("pos_embed_interp_mode",
                                                 "bicubic")
      options["posemb_keep_aspect"] = bool(
          args.get("pos_embed_ar_preserving", False))
    if "_clip_" in config["architecture"]:
      options["layer_norm_eps"] = 1e-5  # timm's CLIP functions' LayerNorm.
    if "_quickgelu_" in config["architecture"] and "act_layer" not in args:
      options["quick_gelu"] = True  # e.g. vit_base_patch16_clip_quickgelu_224.
    return options
  options = dict(_ACTIVATIONS.get(config.get("hidden_act", "gelu"), {}))
  if "layer_norm_eps" in config:
    options["layer_norm_eps"] = float(config["layer_norm_eps"])
  return options
