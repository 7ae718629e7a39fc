"""Weights from any supported file: formats, conversion, resizing, loading.

Imports no TensorFlow: converting and loading run on accelerator hosts.
`init_params(config, params, shardings)` is what training calls to start
from `config.init.checkpoint`.
"""

import re

import flax
import jax
import ml_collections
import numpy as np
from absl import logging

from vit_jax.models import layout, variants
from vit_jax.weights.formats import WeightsError
from vit_jax.weights.loader import Report, file_origin, load, resolve_gelu

__all__ = ["WeightsError", "Report", "load", "load_for_config", "init_params",
           "target_grid", "resolve_gelu", "file_origin"]


def target_grid(config: ml_collections.ConfigDict) -> tuple[int, int]:
  stride = variants.get_variant(config.model.variant).stride
  return (config.image_size // stride,) * 2


def load_for_config(config: ml_collections.ConfigDict, path: str, params):
  """`load` with the config's policy; `params` may be in the scanned layout.

  Returns (loaded {looped name: array}, Report).
  """
  if layout.is_scanned(params):
    params = jax.eval_shape(layout.unstack_layers, params)
  return load(path, params,
              num_prefix_tokens=1 if config.model.classifier == "token" else 0,
              grid=target_grid(config), dont_load=config.init.dont_load,
              resize_method=config.init.posemb_resize,
              source_grid=config.init.source_grid,
              gelu_approximate=(True if config.model.gelu_approximate is None
                                else config.model.gelu_approximate))


def init_params(config: ml_collections.ConfigDict, params, params_sharding):
  """`params` with every entry the file provides replaced, already sharded.

  Works on any mesh and number of processes: each process reads the file and
  places only its own shards. A scanned-layers model is loaded through the
  looped names and stacked back.
  """
  loaded, report = load_for_config(config, config.init.checkpoint, params)
  if jax.process_index() == 0:
    logging.info("Initialised from %s", report.table())
  if layout.is_scanned(params):
    loaded = _stack_loaded(loaded, params)
  flat = flax.traverse_util.flatten_dict(params, sep="/")
  shardings = flax.traverse_util.flatten_dict(params_sharding, sep="/")
  for name, value in loaded.items():
    flat[name] = jax.make_array_from_callback(
        value.shape, shardings[name], lambda index, v=value: v[index])
  return flax.traverse_util.unflatten_dict(flat, sep="/")


def _stack_loaded(loaded, params):
  """Looped names -> the scanned tree's stacked leaves (all layers or none)."""
  num_layers = jax.tree.leaves(params["Transformer"]["encoderblock"])[0].shape[0]
  out, per_leaf = {}, {}
  for name, value in loaded.items():
    m = re.match(r"Transformer/encoderblock_(\d+)/(.*)", name)
    if m:
      per_leaf.setdefault(m.group(2), {})[int(m.group(1))] = value
    else:
      out[name] = value
  for rest, layers in per_leaf.items():
    if len(layers) != num_layers:
      raise WeightsError(f"Only some layers of encoderblock/{rest} are loaded; "
                         "a scanned model loads all layers of a parameter or "
                         "none (see config.init.dont_load).")
    out[f"Transformer/encoderblock/{rest}"] = np.stack(
        [layers[i] for i in range(num_layers)])
  return out
