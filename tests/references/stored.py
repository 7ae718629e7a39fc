"""What timm and Hugging Face computed, stored here for the parity tests.

The suite runs without PyTorch: on Python 3.12+ the package registry has
only torch's CUDA build (several GB), and the CPU build this machine kind
keeps on disk is for Python 3.11. So the numbers the tests compare with were
computed by timm and transformers themselves, in a Python 3.11 environment
with the versions of `requirements.txt`, by `generate.py`, and committed:

  tiny_timm.safetensors    timm's ViT (width 32, depth 2, patch 8, 32 px,
                           10 classes), random weights: its state dict
  tiny_timm.pth            the same state dict, written by torch.save
  tiny_hybrid.safetensors  timm's ResNetV2 + ViT hybrid (patch 1, 5 classes)
  tiny_hf.safetensors      transformers' ViTForImageClassification (the
                           tiny timm model's shape), transformers 5's names
  tiny_logits.safetensors  the images all tiny models were run on (NHWC)
                           and each model's logits
  tiny_mixer.safetensors   timm's MlpMixer (width 32, 2 blocks, patch 8,
                           32 px so 16 tokens, token MLP 16 and channel MLP
                           128 wide, 10 classes), random weights
  tiny_mixer_logits.safetensors
                           its logits of the same images ("mixer"); a file
                           of its own, written by `generate.py mixer`
  full_size.json           timm's ViT-B/16 and R50+ViT-B/16 and Hugging
                           Face's ViT-B/16 at 224 px: each parameter's name
                           and shape in creation order, and the logits of
                           2 images; the weights are `trained_like_state`
                           (seeded numpy), so both sides make the same ones

Regenerate (`make references`) after changing `generate.py` or the pins.
This module needs numpy and safetensors only; `generate.py` imports it
too.
"""

import json
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TINY_IMAGE_SIZE = 32
FULL_SIZE_IMAGE_SIZE = 224


def path(name: str) -> str:
  """A stored file, e.g. path('tiny_timm.safetensors')."""
  return os.path.join(HERE, name)


def tiny_images() -> np.ndarray:
  """The (3, 32, 32, 3) float32 images in [-1, 1] the tiny models saw."""
  return _tiny_outputs()["images"]


def tiny_logits(model: str) -> np.ndarray:
  """'timm', 'hybrid' or 'hf': that tiny model's logits of tiny_images()."""
  return _tiny_outputs()[model]


def tiny_mixer_logits() -> np.ndarray:
  """timm's tiny MLP-Mixer's logits of tiny_images()."""
  from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top
  return st_numpy.load_file(path("tiny_mixer_logits.safetensors"))["mixer"]


def _tiny_outputs() -> dict:
  from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top
  return st_numpy.load_file(path("tiny_logits.safetensors"))


def full_size_images(batch: int = 2, seed: int = 0) -> np.ndarray:
  """NHWC float32 in [-1, 1], seeded (numpy's generators are stable)."""
  return np.random.default_rng(seed).uniform(
      -1, 1, (batch, FULL_SIZE_IMAGE_SIZE, FULL_SIZE_IMAGE_SIZE, 3)).astype(
          np.float32)


def full_size() -> dict:
  """name -> {'parameters': [[name, shape], ...], 'logits': array,
  'library': ...} of the full-size models (see the module doc)."""
  with open(path("full_size.json")) as f:
    models = json.load(f)["models"]
  for entry in models.values():
    entry["logits"] = np.asarray(entry["logits"], np.float32)
  return models


def trained_like_state(parameters, seed: int = 0) -> dict:
  """A PyTorch-named state dict of float32 numpy arrays at trained scales.

  `parameters`: [(name, shape), ...] in the module's creation order (each
  value is drawn in turn from one seeded generator). Dense kernels std
  1/sqrt(fan-in); stem conv kernels (names with 'backbone') a std drawn
  per layer from [0.01, 0.05]; norm scales 1 + noise; biases, tokens and
  position embeddings O(0.3), as `numpy_reference.trained_like_params`.
  """
  rng = np.random.default_rng(seed)
  state = {}
  for name, shape in parameters:
    shape = tuple(shape)
    if len(shape) == 4 and "backbone" in name:
      value = rng.uniform(0.01, 0.05) * rng.normal(size=shape)
    elif len(shape) >= 2 and name.endswith("weight"):
      value = rng.normal(size=shape) / np.sqrt(np.prod(shape[1:]))
    elif name.endswith("weight"):  # LayerNorm / GroupNorm scales.
      value = 1.0 + 0.2 * rng.normal(size=shape)
    else:
      value = 0.3 * rng.normal(size=shape)
    state[name] = value.astype(np.float32)
  return state
