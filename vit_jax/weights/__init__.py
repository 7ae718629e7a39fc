"""Weights from any supported file: formats, conversion, resizing, loading.

Imports no TensorFlow: converting and loading run on accelerator hosts.
`init_params(config, path, params, shardings)` is what training calls to
start from a checkpoint (`config.init.checkpoint`).
"""

from vit_jax.weights.formats import WeightsError
from vit_jax.weights.loader import (Report, file_origin, init_params, load,
                                    load_for_config, resolve_gelu, target_grid)

__all__ = ["WeightsError", "Report", "load", "load_for_config", "init_params",
           "target_grid", "resolve_gelu", "file_origin"]
