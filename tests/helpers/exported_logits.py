"""Logits of exported directories as transformers and timm compute them,
run in the PyTorch environment (.venv-torch, which has no JAX):

    .venv-torch/bin/python -m tests.helpers.exported_logits IMAGES.npy \
        OUT.npz NAME=FORMAT:DIR [NAME=FORMAT:DIR ...]

FORMAT `hf`: ViTForImageClassification.from_pretrained(DIR), every weight
present and used (a ViTModel's directory: its pooler output, the
pre-logits; a DINOv3ViTModel's: its pooler output, the class token);
`timm-dir`: timm.create_model('local-dir:DIR', pretrained=True). OUT.npz
holds each NAME's logits of the NHWC images.
`timm-naflex`: the same for a NaFlexViT, IMAGES then an .npz of patch
sequences (patches, coords, valid). Nothing is downloaded.
"""

import json
import os
import sys

import numpy as np

from tests.helpers import torch_reference


def _pooler_output(directory: str, images_nhwc: np.ndarray,
                   model_class: str) -> np.ndarray:
  """The pooler output of transformers' `model_class` (ViTModel: the
  pre-logits layer; DINOv3ViTModel: the class token after the final norm)
  from `directory`; every weight present and used."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  model, info = getattr(transformers, model_class).from_pretrained(
      directory, local_files_only=True, output_loading_info=True)
  problems = {k: v for k, v in info.items() if v}
  if problems:
    raise ValueError(f"{directory}: {problems}")
  x = torch.from_numpy(np.ascontiguousarray(images_nhwc.transpose(0, 3, 1, 2)))
  with torch.no_grad():
    return model.eval()(pixel_values=x).pooler_output.numpy()


def _hf(directory: str, images_nhwc: np.ndarray) -> np.ndarray:
  with open(os.path.join(directory, "config.json")) as f:
    architectures = json.load(f)["architectures"]
  if architectures in (["ViTModel"], ["DINOv3ViTModel"]):
    return _pooler_output(directory, images_nhwc, architectures[0])
  return torch_reference.hf_vit_logits_from_dir(directory, images_nhwc)


def _timm_naflex(directory: str, sequences) -> np.ndarray:
  import timm  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  model = timm.create_model(f"local-dir:{directory}", pretrained=True).eval()
  x = {
      "patches": torch.from_numpy(sequences["patches"]),
      "patch_coord": torch.from_numpy(sequences["coords"].astype(np.int64)),
      "patch_valid": torch.from_numpy(sequences["valid"])
  }
  with torch.no_grad():
    return model(x).numpy()


def main(images: str, out: str, *requests: str):
  images_nhwc = np.load(images)
  read = {
      "hf": _hf,
      "timm-dir": torch_reference.timm_logits_from_dir,
      "timm-naflex": _timm_naflex
  }
  logits = {}
  for request in requests:
    name, rest = request.split("=", 1)
    fmt, directory = rest.split(":", 1)
    logits[name] = np.asarray(read[fmt](directory, images_nhwc), np.float32)
  np.savez(out, **logits)


if __name__ == "__main__":
  main(*sys.argv[1:])
