"""Weights from any supported file: formats, conversion, resizing, loading.

Imports no TensorFlow: converting and loading run on accelerator hosts.
`decide(config, ...)` settles what a config leaves open (the GELU form)
before a model is built; `init_params(config, path, params, shardings)` is
what training calls to start from a checkpoint (`config.init.checkpoint`).
"""

from vit_jax.errors import WeightsError
from vit_jax.weights.decisions import decide
from vit_jax.weights.loader import Report
from vit_jax.weights.loader import file_origin
from vit_jax.weights.loader import init_params
from vit_jax.weights.loader import load
from vit_jax.weights.loader import load_for_config
from vit_jax.weights.loader import target_grid

__all__ = [
    "WeightsError", "Report", "load", "load_for_config", "init_params",
    "target_grid", "decide", "file_origin"
]
