"""Writes `tiny_mae_full.pth`, `tiny_mae_encoder.pth` and
`tiny_mae_io.safetensors`: facebookresearch/mae's own
`models_mae.MaskedAutoencoderViT` (encoder and decoder) with random weights
at trained-like scales, saved as its full checkpoints are
(`torch.save({"model": state_dict})`) and as its encoder files are (the
same without the decoder and its [mask] token), and what its
`forward` computes on 4 images of 16 x 16 px with a mask drawn from a
known noise.

    git clone https://github.com/facebookresearch/mae /tmp/mae
    PYTHONPATH=/tmp/mae .venv-torch/bin/python -m tests.references.mae_reference

(`.venv-torch`: `make torch-env`; `tests/helpers/torch_reference.py` lets
timm import there beside torch's CPU build.)

Nothing of vit_jax is imported: the outputs stored are MAE's. Its code was
written for timm 0.3.2 and NumPy < 1.24, so two names it uses are given
back before it is imported, neither changing what it computes: NumPy's
`np.float` (its `pos_embed.py`, float64 either way) and timm's `Block`
keyword `qk_scale` (None there: the default 1/sqrt(head width)).

Stored (NHWC images, as vit_jax reads them): `images` in [-1, 1]; `noise`
(B x N, what its `random_masking` drew); `mask` (1: dropped) and
`ids_restore`; `latent` (the encoder's output, class token first, visible
patches in the shuffled order); `pred` (B x N x P*P*3); `loss` with the
normalised-pixel target and `loss_pixels` with the plain one.
"""

import functools
import importlib
import os

import numpy as np
from safetensors.numpy import save_file
import torch

# Before timm: torchvision's stand-in where the real one cannot load.
from tests.helpers import torch_reference

timm = torch_reference.import_timm()
timm_vit = importlib.import_module("timm.models.vision_transformer")


def _models_mae():
  """facebookresearch/mae's models_mae, imported with the two names it
  needs of older NumPy and timm given back."""
  np.float = float  # Removed in NumPy 1.24; its pos_embed.py names it.
  block = timm_vit.Block

  @functools.wraps(block)
  def block_without_qk_scale(*args, qk_scale=None, **kwargs):
    assert qk_scale is None  # models_mae.py's only value.
    return block(*args, **kwargs)

  timm_vit.Block = block_without_qk_scale
  return importlib.import_module("models_mae")


HERE = os.path.dirname(__file__)
WEIGHTS = os.path.join(HERE, "tiny_mae_full.pth")
ENCODER = os.path.join(HERE, "tiny_mae_encoder.pth")
IO = os.path.join(HERE, "tiny_mae_io.safetensors")
BATCH, SIZE, PATCH, RATIO = 4, 16, 4, 0.75
# The encoder's and decoder's sizes (the decoder has MAE's 16 heads).
CONFIG = dict(img_size=SIZE, patch_size=PATCH, in_chans=3, embed_dim=32,
              depth=2, num_heads=4, decoder_embed_dim=32, decoder_depth=2,
              decoder_num_heads=16, mlp_ratio=4.0, norm_layer=functools.partial(
                  torch.nn.LayerNorm, eps=1e-6))


def trained_like(model, seed=0):
  """Kernels at 1/sqrt(fan-in), norms' scales 1 + noise, biases and tokens
  O(0.3); the fixed sin-cos position embeddings kept."""
  rng = np.random.default_rng(seed)
  with torch.no_grad():
    for name, param in model.named_parameters():
      shape = tuple(param.shape)
      if "pos_embed" in name:
        continue
      if name.endswith("weight") and len(shape) == 1:  # LayerNorm scales.
        value = 1.0 + 0.2 * rng.normal(size=shape)
      elif name.endswith("weight"):  # Linear (out, in), Conv (out, in, p, p).
        value = rng.normal(size=shape) / np.sqrt(np.prod(shape[1:]))
      else:
        value = 0.3 * rng.normal(size=shape)
      param.copy_(torch.from_numpy(value.astype(np.float32)))


def main():
  model = _models_mae().MaskedAutoencoderViT(**CONFIG).eval()
  trained_like(model)
  state = model.state_dict()
  torch.save({"model": state}, WEIGHTS)
  torch.save(
      {
          "model": {
              k: v
              for k, v in state.items()
              if not k.startswith("decoder_") and k != "mask_token"
          }
      }, ENCODER)
  rng = np.random.default_rng(1)
  images = rng.uniform(-1, 1, (BATCH, SIZE, SIZE, 3)).astype(np.float32)
  x = torch.from_numpy(images.transpose(0, 3, 1, 2).copy())
  num_patches = (SIZE // PATCH)**2
  torch.manual_seed(0)
  noise = torch.rand(BATCH, num_patches)
  torch.manual_seed(0)  # forward's random_masking draws the same noise.
  with torch.no_grad():
    model.norm_pix_loss = True
    latent, mask, ids_restore = model.forward_encoder(x, RATIO)
    pred = model.forward_decoder(latent, ids_restore)
    loss = model.forward_loss(x, pred, mask)
    model.norm_pix_loss = False
    loss_pixels = model.forward_loss(x, pred, mask)
  assert torch.equal(ids_restore,
                     torch.argsort(torch.argsort(noise, dim=1), dim=1))
  outputs = {
      "images": images,
      "noise": noise.numpy(),
      "mask": mask.numpy(),
      "ids_restore": ids_restore.numpy().astype(np.int32),
      "latent": latent.numpy(),
      "pred": pred.numpy(),
      "loss": np.float32(loss.item()).reshape(1),
      "loss_pixels": np.float32(loss_pixels.item()).reshape(1),
  }
  # safetensors writes each array's raw buffer: `pred` is a view of the
  # decoder's output without its class token, so each is made C-ordered.
  outputs = {k: np.ascontiguousarray(v) for k, v in outputs.items()}
  save_file(outputs, IO, metadata={
      "torch": torch.__version__,
      "timm": timm.__version__
  })
  print(f"Wrote {WEIGHTS}, {ENCODER} and {IO}: loss {loss.item():.6f}, "
        f"pixels {loss_pixels.item():.6f}.")


if __name__ == "__main__":
  main()
