"""A timm model built by its registered name, with random weights at
trained scales, in the PyTorch environment (.venv-torch, which has no JAX):

    .venv-torch/bin/python -m tests.helpers.timm_built MODEL IMAGES.npy OUT \
        [KWARGS_JSON]

writes OUT/model.safetensors (its state dict, as timm's files hold it) and
OUT/logits.npy (its logits of the NHWC images); KWARGS_JSON: a JSON object
of timm.create_model's keyword arguments (e.g. a tiny width). Nothing is
downloaded (pretrained=False); the weights are `stored.trained_like_state`
of its parameters (seed 0).
"""

import json
import os
import sys

import numpy as np

from tests.helpers import torch_reference
from tests.references import stored


def main(name: str, images: str, out: str, kwargs: str = "{}"):
  from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  model = torch_reference.import_timm().create_model(name, pretrained=False,
                                                     **json.loads(kwargs))
  parameters = [[n, list(p.shape)] for n, p in model.named_parameters()]
  # The parameters are the whole state: nothing else would be loaded.
  assert sorted(model.state_dict()) == sorted(n for n, _ in parameters)
  state = stored.trained_like_state(parameters)
  model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
  logits = torch_reference.torch_logits(model.eval(), np.load(images))
  st_numpy.save_file(state, os.path.join(out, "model.safetensors"))
  np.save(os.path.join(out, "logits.npy"), logits)


if __name__ == "__main__":
  main(*sys.argv[1:])
