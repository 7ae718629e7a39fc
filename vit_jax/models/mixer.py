"""MLP-Mixer (Tolstikhin et al., 2021) in Flax Linen: ViT's sibling without
attention. Each block mixes across patches, then across channels:

    U = X + W2 GELU(W1 LN(X)^T)^T      token mixing (over the N patches)
    Y = U + W4 GELU(W3 LN(U))           channel mixing (over the D channels)

then a LayerNorm, the mean over patches and a linear head. There are no
position embeddings and no class token.

Parameter names are those of the released Mixer checkpoints
(google-research/vision_transformer and big_vision): `stem`,
`MixerBlock_{i}/{LayerNorm_0, token_mixing/Dense_{0,1}, LayerNorm_1,
channel_mixing/Dense_{0,1}}`, `pre_head_layer_norm`, `head`, plus an optional
`pre_logits` as in the ViT. Initialisers are Flax's defaults, as in that code.

The options are the model's form (`config/model_form.py`), read whole by
each module; precision and GELU as in `vit.py`: `dtype` computes,
`param_dtype` stores, LayerNorm statistics and logits are fp32; tanh GELU
(the released weights) unless `gelu_approximate=False` (timm's exact erf).
"""

import functools
from typing import Callable
from typing import Optional

import flax.linen as nn
import jax.numpy as jnp

from vit_jax.config.model_form import ModelForm
from vit_jax.models import encoder
from vit_jax.models import partitioning as lx
from vit_jax.models import vit
from vit_jax.models.variants import MixerVariant


class MixerMlp(nn.Module):
  """Dense -> GELU -> Dense along the last axis, with dropout after each;
  of the form it reads the GELU, the dropout and the dtypes.

  Not `encoder.MlpBlock`: this one keeps Flax's default initialisers, as the
  released Mixer does, and takes its hidden units' logical axes, which
  differ between the two mixing MLPs.
  """
  mlp_dim: int
  hidden_axes: lx.LogicalAxes
  form: ModelForm

  @nn.compact
  def __call__(self, x, deterministic: bool):
    form = self.form
    dense = functools.partial(nn.Dense, dtype=jnp.dtype(form.dtype),
                              param_dtype=jnp.dtype(form.param_dtype))
    h = nn.gelu(
        dense(self.mlp_dim, name="Dense_0")(x),
        approximate=form.gelu_approximate)
    h = nn.with_logical_constraint(h, self.hidden_axes)
    h = nn.Dropout(form.dropout_rate)(h, deterministic)
    y = dense(x.shape[-1], name="Dense_1")(h)
    return nn.Dropout(form.dropout_rate)(y, deterministic)


class MixerBlock(nn.Module):
  """Token mixing, then channel mixing, each pre-LN and residual."""
  tokens_mlp_dim: int
  channels_mlp_dim: int
  form: ModelForm
  drop_path_rate: float = 0.0  # This block's rate; see `encoder.drop_path`.

  @nn.compact
  def __call__(self, x_BxNxD, deterministic: bool):
    form = self.form
    norm = functools.partial(nn.LayerNorm, dtype=jnp.dtype(form.dtype),
                             param_dtype=jnp.dtype(form.param_dtype))
    mlp = functools.partial(MixerMlp, form=form)
    drop_path = encoder.drop_path(self.drop_path_rate)

    y_BxDxN = jnp.swapaxes(norm(name="LayerNorm_0")(x_BxNxD), 1, 2)
    y_BxDxN = mlp(self.tokens_mlp_dim, lx.TOKEN_MIXING_HIDDEN_AXES,
                  name="token_mixing")(y_BxDxN, deterministic)
    y_BxNxD = jnp.swapaxes(y_BxDxN, 1, 2)
    x_BxNxD = x_BxNxD + drop_path(y_BxNxD, deterministic)
    x_BxNxD = nn.with_logical_constraint(x_BxNxD, lx.TOKENS_AXES)

    y_BxNxD = mlp(self.channels_mlp_dim, lx.HIDDEN_AXES, name="channel_mixing")(
        norm(name="LayerNorm_1")(x_BxNxD), deterministic)
    x_BxNxD = x_BxNxD + drop_path(y_BxNxD, deterministic)
    return nn.with_logical_constraint(x_BxNxD, lx.TOKENS_AXES)


def block_drop_path_rates(rate: float, num_layers: int) -> list[float]:
  """Stochastic depth rising linearly from 0 (first block) to `rate` (last),
  as big_vision's Mixer schedules it. Each drop is the ViT's (survivors
  scaled by 1/(1-rate), as timm does; big_vision's Mixer does not scale)."""
  return [rate * i / max(num_layers - 1, 1) for i in range(num_layers)]


class MlpMixer(nn.Module):
  """`__call__` returns (logits, dict of named intermediates), as the ViT.

  `size` gives its widths (`variants.MixerVariant`); of the form it reads
  the pre-logits width and head init, dropout, stochastic depth (the last
  block's; see block_drop_path_rates), the GELU, remat, dtypes and
  `mixer_tiles` (its token-mixing MLP K^2 times as wide).
  """
  num_classes: Optional[int]  # None: no head, logits are the pre-logits.
  size: MixerVariant
  form: ModelForm

  num_prefix_tokens = 0  # No class token (as `VisionTransformer`'s).
  has_class_token = False

  @nn.compact
  def __call__(self, images_BxHxWxC, *, train: bool = False,
               return_intermediates: bool = False,
               patch_embeddings_fn: Optional[Callable] = None):
    """`patch_embeddings_fn(x_BxNxD) -> x_BxNxD`, if given, changes the
    patch embeddings before the first block (as in the ViT)."""
    size, form, out = self.size, self.form, {}
    dtype, param_dtype = jnp.dtype(form.dtype), jnp.dtype(form.param_dtype)
    patch = size.patch_size
    size_hw = images_BxHxWxC.shape[1:3]
    if size_hw[0] % patch or size_hw[1] % patch:
      raise ValueError(f"The image size {tuple(size_hw)} is not divisible by "
                       f"the patch size {patch}.")
    x = nn.Conv(size.hidden_size, (patch,) * 2, strides=(patch,) * 2,
                padding="VALID", dtype=dtype, param_dtype=param_dtype,
                name="stem")(images_BxHxWxC.astype(dtype))
    batch, grid_h, grid_w, width = x.shape
    out["grid"] = (grid_h, grid_w)
    x_BxNxD = jnp.reshape(x, (batch, grid_h * grid_w, width))
    if patch_embeddings_fn is not None:
      x_BxNxD = patch_embeddings_fn(x_BxNxD)
    x_BxNxD = nn.with_logical_constraint(x_BxNxD, lx.TOKENS_AXES)

    block_cls = MixerBlock
    policy = encoder.REMAT_POLICIES[form.remat]
    if policy is not None:
      block_cls = nn.remat(block_cls, static_argnums=(2,), policy=policy)
    per_layer = []
    for i, rate in enumerate(
        block_drop_path_rates(form.drop_path_rate, size.num_layers)):
      x_BxNxD = block_cls(size.tokens_mlp_dim * form.mixer_tiles**2,
                          size.channels_mlp_dim, form, drop_path_rate=rate,
                          name=f"MixerBlock_{i}")(x_BxNxD, not train)
      per_layer.append(x_BxNxD)
    if return_intermediates:
      out["blocks"] = jnp.stack(per_layer)  # L x B x N x D

    encoded = nn.LayerNorm(dtype=dtype, param_dtype=param_dtype,
                           name="pre_head_layer_norm")(x_BxNxD)
    # No class token: every output token is a patch's.
    out["encoded"] = out["patch_tokens"] = encoded
    x_BxD = out["head_input"] = jnp.mean(encoded, axis=1)

    return vit.pre_logits_and_head(self, x_BxD, out)
