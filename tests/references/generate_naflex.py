"""Writes what timm's NaFlexViT computes, for tests/test_naflex_weights.py:

  tiny_naflex_timm_<name>.safetensors   timm's weights file of each of
                                        NAFLEX (its model.safetensors)
  tiny_naflex_timm_gap.bin              `gap`'s pytorch_model.bin
  tiny_naflex_timm_io.safetensors       the patch sequences (patches,
                                        coords, valid) and each model's
                                        logits; the versions in metadata

    make references   # all of them, or these only:
    .venv-torch/bin/python -m tests.references.generate naflex

Runs where torch and timm are installed (not vit_jax): each model is built
by its timm function at the size of vit_jax's `testing` variant (width
16, 2 blocks of 2 heads, MLP 32, patch 4, a 4 x 4 position table, 7
classes), with random weights, and written by timm's `save_for_hf`;
nothing is downloaded.
"""

import json
import os

import numpy as np

from tests.helpers import torch_reference  # Before timm: torchvision.

HERE = os.path.dirname(__file__)
# name -> timm function: learned (bicubic) + 4 registers + GAP + fc_norm;
# factorized, aspect-preserving; SigLIP 2's port (bilinear, MAP, tanh GELU).
NAFLEX = {
    "gap": "naflexvit_base_patch16_gap",
    "parfac": "naflexvit_base_patch16_parfac_gap",
    "siglip": "naflexvit_base_patch16_siglip",
}
SIZE = dict(patch_size=4, embed_dim=16, depth=2, num_heads=2, mlp_ratio=2.0,
            pos_embed_grid_size=(4, 4), num_classes=7, img_size=16)
GRIDS = ((3, 5), (4, 4), (2, 2), (4, 6), (1, 7))
LENGTH = 24


def inputs():
  rng = np.random.default_rng(1)
  batch = len(GRIDS)
  patches = np.zeros((batch, LENGTH, 4 * 4 * 3), np.float32)
  coords = np.zeros((batch, LENGTH, 2), np.int64)
  valid = np.zeros((batch, LENGTH), bool)
  for b, (rows, cols) in enumerate(GRIDS):
    count = rows * cols
    patches[b, :count] = rng.uniform(-1, 1, (count, 48))
    valid[b, :count] = True
    coords[b, :count] = np.stack(np.divmod(np.arange(count), cols), -1)
  return patches, coords, valid


def write(versions: dict):
  """The files of the module doc; `versions` (python, torch, timm) go in
  the IO file's metadata."""
  from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top
  import timm  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  patches, coords, valid = inputs()
  out = {"patches": patches, "coords": coords, "valid": valid}
  x = {
      "patches": torch.from_numpy(patches),
      "patch_coord": torch.from_numpy(coords),
      "patch_valid": torch.from_numpy(valid)
  }
  for seed, (name, function) in enumerate(NAFLEX.items()):
    model = timm.create_model(function, pretrained=False, **SIZE).eval()
    model = torch_reference.randomize_family(model, seed=30 + seed)
    torch_reference.save_timm_file(
        model, os.path.join(HERE, f"tiny_naflex_timm_{name}.safetensors"))
    if name == "gap":  # As save_for_hf writes by default: pytorch_model.bin.
      torch_reference.save_timm_file(
          model, os.path.join(HERE, "tiny_naflex_timm_gap.bin"))
    with torch.no_grad():
      out[f"logits_{name}"] = model(x).numpy()
  metadata = {
      **versions,
      "functions": json.dumps(NAFLEX),
      "size": json.dumps(SIZE),
  }
  st_numpy.save_file(out, os.path.join(HERE, "tiny_naflex_timm_io.safetensors"),
                     metadata=metadata)
