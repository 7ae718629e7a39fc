"""Logits of exported directories as transformers and timm compute them,
run in the PyTorch environment (.venv-torch, which has no JAX):

    .venv-torch/bin/python -m tests.helpers.exported_logits IMAGES.npy \
        OUT.npz NAME=FORMAT:DIR [NAME=FORMAT:DIR ...]

FORMAT `hf`: ViTForImageClassification.from_pretrained(DIR), every weight
present and used; `timm-dir`: timm.create_model('local-dir:DIR',
pretrained=True). OUT.npz holds each NAME's logits of the NHWC images.
Nothing is downloaded.
"""

import sys

import numpy as np

from tests.helpers import torch_reference


def main(images: str, out: str, *requests: str):
  images_nhwc = np.load(images)
  read = {
      "hf": torch_reference.hf_vit_logits_from_dir,
      "timm-dir": torch_reference.timm_logits_from_dir
  }
  logits = {}
  for request in requests:
    name, rest = request.split("=", 1)
    fmt, directory = rest.split(":", 1)
    logits[name] = np.asarray(read[fmt](directory, images_nhwc), np.float32)
  np.savez(out, **logits)


if __name__ == "__main__":
  main(*sys.argv[1:])
