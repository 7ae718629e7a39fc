"""The image-text model (CLIP, SigLIP, LiT): an image tower (any ViT form
we build) and a text tower (`text.py`), each projecting to one embedding
width and L2-normalised, and a learned temperature `t` (stored as its log)
and, for SigLIP, a learned bias `b`; CLIP's t stays in [1, 100]
(`clamped`). Names as big_vision's two-tower files
(`img/`, `txt/`, `t`, `b`), so a file holds both towers whole.

    zimg, ztxt, out = model.apply({"params": p}, images, texts)
    logits = out["t"] * zimg @ ztxt.T + out.get("b", 0)
"""

from typing import Optional

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from vit_jax.models.text import TextTransformer
from vit_jax.models.vit import VisionTransformer

# big_vision's: a zero-norm embedding stays finite.
_NORM_EPS = 1e-8


def normalized(z_BxE):
  """Each row divided by its L2 norm (in float32)."""
  z_BxE = z_BxE.astype(jnp.float32)
  return z_BxE / (jnp.linalg.norm(z_BxE, axis=-1, keepdims=True) + _NORM_EPS)


class TwoTowers(nn.Module):
  """`__call__(images, texts)` -> (zimg B x E, ztxt B x E, outputs); either
  input may be None (that tower is not run: zero-shot's class texts, an
  image's embedding alone). outputs: `t` (the temperature, exp of the
  parameter), `b` (SigLIP's bias, if any), each tower's own outputs under
  `img/` and `txt/`."""
  img: VisionTransformer
  txt: TextTransformer
  temperature_init: float = 10.0
  bias_init: Optional[float] = None
  text_length: int = 16  # The texts' length at init (its position table).
  # CLIP's bound: after every update the parameter log t is clamped into
  # [0, ln max_temperature] (`clamped`), as OpenCLIP clamps its logit_scale
  # in place after each optimizer step (the CLIP paper: "clipped to prevent
  # scaling the logits by more than 100"); None: unbounded (SigLIP's).
  max_temperature: Optional[float] = None

  @nn.compact
  def __call__(self, images=None, texts=None, *, train: bool = False):
    out = {}
    if texts is None and self.is_initializing():  # Both towers get made.
      texts = jnp.zeros((1, self.text_length), jnp.int32)
    zimg = ztxt = None
    if images is not None:
      zimg, img_out = self.img(images, train=train)
      out.update({f"img/{k}": v for k, v in img_out.items()})
      zimg = normalized(zimg)
    if texts is not None:
      ztxt, txt_out = self.txt(texts, train=train)
      out.update({f"txt/{k}": v for k, v in txt_out.items()})
      ztxt = normalized(ztxt)
    log_t = self.param("t",
                       nn.initializers.constant(jnp.log(self.temperature_init)),
                       (1,), jnp.float32)
    out["t"] = jnp.exp(log_t[0])
    if self.bias_init is not None:
      out["b"] = self.param("b", nn.initializers.constant(self.bias_init), (1,),
                            jnp.float32)[0]
    return zimg, ztxt, out

  def clamped(self, params):
    """`params` with log t clamped into [0, ln max_temperature]: what the
    train step applies after each update. The forward reads exp(log t) as
    it is, so its gradient at the bound is exp(log t)'s and the next step
    may move t down at once (a clip inside the forward would zero it, and
    leave a parameter past the bound stuck there)."""
    if self.max_temperature is None:
      return params
    bound = np.log(self.max_temperature).astype(np.float32)
    return {**params, "t": jnp.clip(params["t"], 0.0, bound)}
