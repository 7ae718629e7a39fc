"""A checkpoint ready to apply: a classifier for `predict` and `analyze`
(`classifier.py`, this package's face), an image-text model for
`zeroshot` and `predict --class_names` (`zero_shot.py`).

    loaded = inference.load("workdirs/demo/pretrain")
    loaded = zero_shot.load("workdirs/siglip")
"""

from vit_jax.inference.classifier import SEQUENCE_PP_EVAL
from vit_jax.inference.classifier import Loaded
from vit_jax.inference.classifier import class_names
from vit_jax.inference.classifier import config_for
from vit_jax.inference.classifier import describe
from vit_jax.inference.classifier import load
from vit_jax.inference.classifier import make_apply_fn
from vit_jax.inference.classifier import names_of_classes
from vit_jax.inference.classifier import predict
from vit_jax.inference.classifier import probabilities
from vit_jax.inference.classifier import require_head

__all__ = [
    "SEQUENCE_PP_EVAL", "Loaded", "class_names", "config_for", "describe",
    "load", "make_apply_fn", "names_of_classes", "predict", "probabilities",
    "require_head"
]
