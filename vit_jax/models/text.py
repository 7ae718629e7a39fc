"""The text tower of an image-text model: token and learned position
embeddings, the ViT's pre-LN encoder, one output token (or a pooling of
them) and a projection. big_vision's `text_transformer` computes the same;
the names are its (`Embed_0`, `pos_embedding`, `Encoder_0`, `head`), the
blocks inside `Encoder_0` ours (as the image tower's `Transformer`).

No causal mask, as big_vision's and SigLIP's: texts are padded with EOS
("sticky" EOS, `vit_jax/data/tokenizer.py`), so the last token has read every
token of the text and is its embedding with pool `last`.
"""

from typing import Any
from typing import Callable
from typing import Literal
from typing import Optional

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from vit_jax.config.model_form import ModelForm
from vit_jax.models import partitioning as lx
from vit_jax.models.encoder import Encoder
from vit_jax.models.variants import Variant
from vit_jax.models.vit import MAPHead

POOLS = ("last", "first", "gap", "map")


def text_form(image_form: ModelForm) -> ModelForm:
  """The text tower's form: big_vision's plain blocks, with what it shares
  with the image tower (`ModelForm.for_part`: the numerics, dtypes, GELU
  and LayerNorm epsilon, and the memory choices, remat and scan), so one
  config sets both towers' compute. Its position embeddings are its own
  (`pos_embedding`), none in the encoder."""
  return image_form.for_part("text", classifier="gap", class_token=False,
                             posemb="none")


class TextTransformer(nn.Module):
  """Texts B x L of token ids -> (B x num_classes embedding, outputs);
  `num_classes` None: no projection (the pooled token is the embedding).
  `size` gives the widths, depth and heads (a ViT variant's)."""
  num_classes: Optional[int]
  size: Variant
  vocab_size: int
  form: ModelForm
  pool: Literal["last", "first", "gap", "map"] = "last"
  gather_block: Optional[Callable[[Any], Any]] = None  # FSDP: see Encoder.

  @nn.compact
  def __call__(self, text_BxL, *, train: bool = False):
    form, size, out = self.form, self.size, {}
    dtype, param_dtype = jnp.dtype(form.dtype), jnp.dtype(form.param_dtype)
    width = size.hidden_size
    embed = nn.Embed(self.vocab_size, width, dtype=dtype,
                     param_dtype=param_dtype, name="Embed_0")
    x_BxLxD = embed(text_BxL)
    # big_vision's init: unit-variance tokens after the table's N(0, 1/D).
    posemb = self.param("pos_embedding",
                        nn.initializers.normal(stddev=1 / np.sqrt(width)),
                        (1, text_BxL.shape[1], width), param_dtype)
    x_BxLxD = x_BxLxD + posemb.astype(dtype)
    encoded, _ = Encoder(size.num_layers, size.mlp_dim, size.num_heads, form,
                         gather_block=self.gather_block, name="Encoder_0")(
                             x_BxLxD, not train)
    out["encoded"] = encoded
    if self.pool == "last":
      x_BxD = encoded[:, -1]
    elif self.pool == "first":
      x_BxD = encoded[:, 0]
    elif self.pool == "gap":
      x_BxD = jnp.mean(encoded, axis=1)
    else:
      x_BxD, _ = MAPHead(size.mlp_dim, size.num_heads, form,
                         name="MAPHead_0")(encoded)
    x_BxD = nn.with_logical_constraint(x_BxD, (lx.BATCH, lx.EMBED))
    out["pre_logits"] = x_BxD
    if self.num_classes:
      x_BxD = nn.Dense(self.num_classes, dtype=dtype, param_dtype=param_dtype,
                       name="head")(x_BxD)
    return x_BxD, out
