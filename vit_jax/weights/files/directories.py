"""Directories the PyTorch code bases load: transformers' (`save_pretrained`,
config.json with `model_type`) and timm's (`save_for_hf`, config.json with
`architecture`), each beside a `model.safetensors` (as `vit-jax export`
writes them and the Hub serves them) or a `pytorch_model.bin` (timm's
save_for_hf default, older Hub repositories). Read as their weights file;
what their config.json says beside is read by each origin's room
(`origins.stated_options`).
"""

from typing import Optional

from etils import epath

from vit_jax.config import recorded

WEIGHTS = "model.safetensors"
# What timm's save_for_hf writes by default, and older Hub repositories hold.
PICKLED_WEIGHTS = "pytorch_model.bin"
CONFIG = "config.json"


def _weights(directory: epath.Path) -> Optional[epath.Path]:
  for name in (WEIGHTS, PICKLED_WEIGHTS):
    if (directory / name).exists():
      return directory / name
  return None


def config_json(directory: epath.Path) -> Optional[dict]:
  """The directory's config.json if it is one of the two code bases'."""
  if not (directory.is_dir() and _weights(directory) is not None and
          (directory / CONFIG).exists()):
    return None
  config = recorded.read_json(directory / CONFIG)
  if "model_type" in config or "architecture" in config:
    return config
  return None


def weights_file(directory: epath.Path) -> Optional[epath.Path]:
  """DIRECTORY/model.safetensors (else pytorch_model.bin) of such a
  directory; None otherwise."""
  return _weights(directory) if config_json(directory) is not None else None


def class_names(directory: epath.Path) -> Optional[list[str]]:
  """The class names its config.json gives (transformers' `id2label`,
  timm's `label_names`); None if it gives none."""
  config = config_json(directory)
  if config is None:
    return None
  if "label_names" in config:
    return [str(name) for name in config["label_names"]]
  labels = config.get("id2label")
  if labels and "architecture" not in config:
    return [str(labels[str(i)]) for i in range(len(labels))]
  return None
