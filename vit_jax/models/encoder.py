"""The transformer encoder of a ViT: pre-LN blocks (attention, MLP,
optional LayerScale and stochastic depth), looped or scanned, rematerialised
as configured, gathered per block under FSDP, with the position embeddings
added first and the final LayerNorm last. Parameter names are the released
checkpoints' (`Transformer/encoderblock_{i}/...`).
"""

import functools
from typing import Any
from typing import Callable
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.config.model_form import ModelForm
from vit_jax.models import partitioning as lx
from vit_jax.models.attention import FP8_STATE
from vit_jax.models.attention import MultiHeadDotProductAttention
from vit_jax.models.attention import fp8_matmuls
from vit_jax.models.attention import over_tokens
from vit_jax.models.embeddings import AddPositionEmbs
from vit_jax.models.embeddings import FactorizedPositionEmbs

Dtype = Any
REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


class MlpBlock(nn.Module):
  """Dense -> GELU (the form's: tanh, erf or QuickGELU) -> Dense, with
  dropout after each; FP8 matmuls in training where the form says. With
  `swiglu`, SiLU(x Gate) * (x Dense_0) in place of the GELU; with
  `mlp_norm`, a LayerNorm (`LayerNorm_0`) before `Dense_1`."""
  mlp_dim: int
  form: ModelForm

  @nn.compact
  def __call__(self, x_BxNxD, deterministic: bool):
    form = self.form
    dense = functools.partial(
        nn.Dense, dtype=jnp.dtype(form.dtype), param_dtype=jnp.dtype(
            form.param_dtype), kernel_init=nn.initializers.xavier_uniform(),
        bias_init=nn.initializers.normal(stddev=1e-6),
        dot_general_cls=fp8_matmuls(form.fp8, deterministic))
    h_BxNxF = over_tokens(dense(self.mlp_dim, name="Dense_0"), x_BxNxD)
    if form.swiglu:
      gate_BxNxF = over_tokens(dense(self.mlp_dim, name="Gate"), x_BxNxD)
      h_BxNxF = nn.silu(gate_BxNxF) * h_BxNxF
    elif form.quick_gelu:  # x sigmoid(1.702 x): OpenAI's CLIP.
      h_BxNxF = h_BxNxF * nn.sigmoid(1.702 * h_BxNxF)
    else:
      h_BxNxF = nn.gelu(h_BxNxF, approximate=form.gelu_approximate)
    h_BxNxF = nn.with_logical_constraint(h_BxNxF, lx.HIDDEN_AXES)
    h_BxNxF = nn.Dropout(form.dropout_rate)(h_BxNxF, deterministic)
    if form.mlp_norm:
      h_BxNxF = nn.LayerNorm(form.layer_norm_eps, dtype=jnp.dtype(
          form.dtype), param_dtype=jnp.dtype(form.param_dtype),
                             name="LayerNorm_0")(h_BxNxF)
    y_BxNxD = over_tokens(dense(x_BxNxD.shape[-1], name="Dense_1"), h_BxNxF)
    return nn.Dropout(form.dropout_rate)(y_BxNxD, deterministic)


def drop_path(rate: float):
  """Stochastic depth: a residual branch dropped for whole examples (the
  mask broadcasts over tokens and features), the rest scaled by 1/(1-rate)."""
  return nn.Dropout(rate, broadcast_dims=(1, 2))


class LayerScale(nn.Module):
  """A learned per-channel scale of a residual branch (CaiT's LayerScale,
  used by DINOv2 and DeiT III), initialised to `init_value`."""
  init_value: float
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, y_BxNxD):
    scale = self.param("scale", nn.initializers.constant(self.init_value),
                       (y_BxNxD.shape[-1],), self.param_dtype)
    return y_BxNxD * scale.astype(y_BxNxD.dtype)


class Encoder1DBlock(nn.Module):
  """Pre-LN transformer block; returns (output, per-layer intermediates).

  The form's block options, each off by default: LayerScale
  (`layer_scale`'s init), stochastic depth (`drop_path_rate`), and
  ViT-22B's `parallel_block` (attention and MLP read the same LayerNorm,
  `LayerNorm_0`, and both are added to the residual; no `LayerNorm_2`) and
  `use_bias=False` (no LayerNorm biases here; the attention's own options
  in `MultiHeadDotProductAttention`).
  """
  mlp_dim: int
  num_heads: int
  form: ModelForm
  return_intermediates: bool = False

  @nn.compact
  def __call__(self, x_BxNxD, deterministic: bool, mask=None, rope=None):
    form = self.form
    norm = functools.partial(
        nn.LayerNorm, epsilon=form.layer_norm_eps, use_bias=form.use_bias,
        dtype=jnp.dtype(form.dtype), param_dtype=jnp.dtype(form.param_dtype))

    def branch(y, scale_name):  # LayerScale (if any), stochastic depth.
      if form.layer_scale is not None:
        y = LayerScale(form.layer_scale, jnp.dtype(form.param_dtype),
                       name=scale_name)(y)
      return drop_path(form.drop_path_rate)(y, deterministic)

    y = norm(name="LayerNorm_0")(x_BxNxD)
    attn_BxNxD, weights_BxHxNxN = MultiHeadDotProductAttention(
        self.num_heads, form, name="MultiHeadDotProductAttention_1")(
            y, y, deterministic, need_weights=self.return_intermediates,
            mask=mask, rope=rope)
    attn_BxNxD = nn.Dropout(form.dropout_rate)(attn_BxNxD, deterministic)
    attn_BxNxD = branch(attn_BxNxD, "LayerScale_attention")
    if not form.parallel_block:  # The MLP reads the attention's output.
      x_BxNxD = x_BxNxD + attn_BxNxD
      y = norm(name="LayerNorm_2")(x_BxNxD)
    mlp_BxNxD = MlpBlock(self.mlp_dim, form, name="MlpBlock_3")(y,
                                                                deterministic)
    mlp_BxNxD = branch(mlp_BxNxD, "LayerScale_mlp")
    if form.parallel_block:
      mlp_BxNxD = attn_BxNxD + mlp_BxNxD
    x_BxNxD = x_BxNxD + mlp_BxNxD
    x_BxNxD = nn.with_logical_constraint(x_BxNxD, lx.TOKENS_AXES)
    captured = ({
        "block": x_BxNxD,
        "attention": weights_BxHxNxN
    } if self.return_intermediates else None)
    return x_BxNxD, captured


class Encoder(nn.Module):
  """Position embeddings, L blocks (loop or scan), final LayerNorm.

  The form's `posemb` (learned or factorized tables here; sincos2d ones
  are added by the ViT before the class token), `pre_norm` (a LayerNorm
  before the blocks, CLIP's), `pooled_norm` (no final LayerNorm here: the
  ViT normalises the pooled features), `remat` and `scan_layers`.
  """
  num_layers: int
  mlp_dim: int
  num_heads: int
  form: ModelForm
  # FlexiViT: ((stored H, W), (run H, W)) grids of the learned position
  # embeddings (see AddPositionEmbs); None: stored as run.
  posemb_grids: Optional[tuple] = None
  posemb_skips: int = 0  # Leading tokens without a position embedding.
  # FSDP in training: `{"params": block} -> {"params": gathered block}`.
  gather_block: Optional[Callable[[Any], Any]] = None

  @nn.compact
  def __call__(self, x_BxNxD, deterministic: bool,
               return_intermediates: bool = False, grid_hw=None, positions=None,
               mask=None, rope=None):
    """`grid_hw`: the patches' grid (images); `positions`: (coords, grids)
    per patch and `mask` the attention mask (patch sequences); `rope`: the
    blocks' RoPE tables (`models/rope.py`), None without."""
    form = self.form
    dtype, param_dtype = jnp.dtype(form.dtype), jnp.dtype(form.param_dtype)
    if form.posemb == "factorized":
      x_BxNxD = FactorizedPositionEmbs(param_dtype, self.posemb_skips,
                                       name="posembed_input")(x_BxNxD, grid_hw,
                                                              positions)
    elif form.posemb == "learn":
      posemb_1xNxD = AddPositionEmbs(
          param_dtype=param_dtype, grids=self.posemb_grids,
          skip=self.posemb_skips, interpolation=form.posemb_interpolation,
          init=form.posemb_init, name="posembed_input")
      x_BxNxD = posemb_1xNxD(x_BxNxD, positions, grid_hw)
    x_BxNxD = nn.with_logical_constraint(x_BxNxD, lx.TOKENS_AXES)
    x_BxNxD = nn.Dropout(form.dropout_rate)(x_BxNxD, deterministic)
    if form.pre_norm:
      x_BxNxD = nn.LayerNorm(form.layer_norm_eps, dtype=dtype,
                             param_dtype=param_dtype, use_bias=form.use_bias,
                             name="pre_norm")(x_BxNxD)

    block_cls = Encoder1DBlock
    policy = REMAT_POLICIES[form.remat]
    if self.gather_block is not None:
      # FSDP: each block gathers its own weights where it runs, as a remat
      # region, so the backward pass gathers them again instead of holding
      # every layer's. With remat "none" the region keeps the weight
      # matmuls' outputs and recomputes only attention and elementwise ops
      # (what each costs: docs/scaling.md).
      block_cls = nn.map_variables(block_cls, "params",
                                   trans_in_fn=self.gather_block,
                                   init=self.is_initializing())
      policy = policy or REMAT_POLICIES["dots"]
    if policy is not None:
      block_cls = nn.remat(block_cls, prevent_cse=not form.scan_layers,
                           static_argnums=(2,), policy=policy)
    block_fields = dict(mlp_dim=self.mlp_dim, num_heads=self.num_heads,
                        form=form, return_intermediates=return_intermediates)

    if form.scan_layers:
      scanned = nn.scan(block_cls, variable_axes={
          "params": 0,
          FP8_STATE: 0
      }, split_rngs={
          "params": True,
          "dropout": True
      }, in_axes=nn.broadcast, length=self.num_layers)
      x_BxNxD, captured = scanned(name="encoderblock", **block_fields)(
          x_BxNxD, deterministic, mask, rope)
    else:
      per_layer = []
      for i in range(self.num_layers):
        x_BxNxD, c = block_cls(name=f"encoderblock_{i}", **block_fields)(
            x_BxNxD, deterministic, mask, rope)
        per_layer.append(c)
      captured = (jax.tree.map(lambda *a: jnp.stack(a), *per_layer)
                  if return_intermediates else None)

    if form.pooled_norm:  # The ViT normalises the pooled features instead.
      return x_BxNxD, captured
    encoded = nn.LayerNorm(form.layer_norm_eps, dtype=dtype,
                           param_dtype=param_dtype, use_bias=form.use_bias,
                           name="encoder_norm")(x_BxNxD)
    return encoded, captured
