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

from vit_jax.models import partitioning as lx
from vit_jax.models.attention import FP8_STATE
from vit_jax.models.attention import MultiHeadDotProductAttention
from vit_jax.models.attention import fp8_matmuls
from vit_jax.models.embeddings import AddPositionEmbs
from vit_jax.models.embeddings import FactorizedPositionEmbs

Dtype = Any
REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


class MlpBlock(nn.Module):
  """Dense -> GELU -> Dense, with dropout after each."""
  mlp_dim: int
  dropout_rate: float = 0.0
  gelu_approximate: bool = True
  quick_gelu: bool = False  # x sigmoid(1.702 x) instead (OpenAI's CLIP).
  fp8: bool = False  # Training matmuls in FP8 (`fp8_matmuls`).
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x_BxNxD, deterministic: bool):
    dense = functools.partial(
        nn.Dense, dtype=self.dtype, param_dtype=self.param_dtype,
        kernel_init=nn.initializers.xavier_uniform(),
        bias_init=nn.initializers.normal(stddev=1e-6),
        dot_general_cls=fp8_matmuls(self.fp8, deterministic))
    h_BxNxF = dense(self.mlp_dim, name="Dense_0")(x_BxNxD)
    if self.quick_gelu:
      h_BxNxF = h_BxNxF * nn.sigmoid(1.702 * h_BxNxF)
    else:
      h_BxNxF = nn.gelu(h_BxNxF, approximate=self.gelu_approximate)
    h_BxNxF = nn.with_logical_constraint(h_BxNxF, lx.HIDDEN_AXES)
    h_BxNxF = nn.Dropout(self.dropout_rate)(h_BxNxF, deterministic)
    y_BxNxD = dense(x_BxNxD.shape[-1], name="Dense_1")(h_BxNxF)
    return nn.Dropout(self.dropout_rate)(y_BxNxD, deterministic)


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

  ViT-22B's options (`BLOCK_OPTIONS`), each off by default: `parallel_block`
  (attention and MLP read the same LayerNorm, `LayerNorm_0`, and both are
  added to the residual; no `LayerNorm_2`), `use_bias=False` (no biases in
  the attention's projections or the LayerNorms; the MLP keeps its),
  `qkv_bias=False` (none in the query/key/value projections alone, timm's
  form) and `qk_norm` (a LayerNorm on each head's queries and keys).
  """
  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  drop_path_rate: float = 0.0  # See `drop_path`.
  return_intermediates: bool = False
  gelu_approximate: bool = True
  quick_gelu: bool = False  # See MlpBlock.
  layer_scale: Optional[float] = None  # LayerScale's init; None: none.
  layer_norm_eps: float = 1e-6
  attention: str = "auto"  # See MultiHeadDotProductAttention.
  fp8: bool = False  # See MlpBlock.
  parallel_block: bool = False
  use_bias: bool = True
  qkv_bias: bool = True
  qk_norm: bool = False
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x_BxNxD, deterministic: bool, mask=None):
    norm = functools.partial(nn.LayerNorm, epsilon=self.layer_norm_eps,
                             use_bias=self.use_bias, dtype=self.dtype,
                             param_dtype=self.param_dtype)

    def branch(y, scale_name):  # LayerScale (if any), stochastic depth.
      if self.layer_scale is not None:
        y = LayerScale(self.layer_scale, self.param_dtype, name=scale_name)(y)
      return drop_path(self.drop_path_rate)(y, deterministic)

    y = norm(name="LayerNorm_0")(x_BxNxD)
    attn_BxNxD, weights_BxHxNxN = MultiHeadDotProductAttention(
        self.num_heads, self.attention_dropout_rate, self.attention,
        fp8=self.fp8, qkv_bias=self.use_bias and self.qkv_bias,
        use_bias=self.use_bias, qk_norm=self.qk_norm,
        layer_norm_eps=self.layer_norm_eps, dtype=self.dtype,
        param_dtype=self.param_dtype, name="MultiHeadDotProductAttention_1")(
            y, y, deterministic, need_weights=self.return_intermediates,
            mask=mask)
    attn_BxNxD = nn.Dropout(self.dropout_rate)(attn_BxNxD, deterministic)
    attn_BxNxD = branch(attn_BxNxD, "LayerScale_attention")
    if not self.parallel_block:  # The MLP reads the attention's output.
      x_BxNxD = x_BxNxD + attn_BxNxD
      y = norm(name="LayerNorm_2")(x_BxNxD)
    mlp_BxNxD = MlpBlock(self.mlp_dim, self.dropout_rate, self.gelu_approximate,
                         self.quick_gelu, self.fp8, dtype=self.dtype,
                         param_dtype=self.param_dtype, name="MlpBlock_3")(
                             y, deterministic)
    mlp_BxNxD = branch(mlp_BxNxD, "LayerScale_mlp")
    if self.parallel_block:
      mlp_BxNxD = attn_BxNxD + mlp_BxNxD
    x_BxNxD = x_BxNxD + mlp_BxNxD
    x_BxNxD = nn.with_logical_constraint(x_BxNxD, lx.TOKENS_AXES)
    captured = ({
        "block": x_BxNxD,
        "attention": weights_BxHxNxN
    } if self.return_intermediates else None)
    return x_BxNxD, captured


class Encoder(nn.Module):
  """Position embeddings, L blocks (loop or scan), final LayerNorm."""
  num_layers: int
  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  drop_path_rate: float = 0.0
  use_posemb: bool = True
  posemb: str = "learn"  # learn or factorized, where use_posemb.
  posemb_interpolation: str = "bilinear"  # See VisionTransformer.
  # FlexiViT: ((stored H, W), (run H, W)) grids of the learned position
  # embeddings (see AddPositionEmbs); None: stored as run.
  posemb_grids: Optional[tuple] = None
  remat: str = "none"
  scan_layers: bool = False
  gelu_approximate: bool = True
  quick_gelu: bool = False
  layer_scale: Optional[float] = None
  posemb_skips: int = 0  # Leading tokens without a position embedding.
  pre_norm: bool = False  # A LayerNorm before the blocks (CLIP's).
  final_norm: bool = True  # False: the model normalises pooled features.
  layer_norm_eps: float = 1e-6
  attention: str = "auto"
  fp8: bool = False  # See MlpBlock.
  parallel_block: bool = False  # This and the next three: Encoder1DBlock.
  use_bias: bool = True  # Also the pre_norm's and encoder_norm's biases.
  qkv_bias: bool = True
  qk_norm: bool = False
  # FSDP in training: `{"params": block} -> {"params": gathered block}`.
  gather_block: Optional[Callable[[Any], Any]] = None
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x_BxNxD, deterministic: bool,
               return_intermediates: bool = False, grid_hw=None, positions=None,
               mask=None):
    """`grid_hw`: the patches' grid (images); `positions`: (coords, grids)
    per patch and `mask` the attention mask (patch sequences)."""
    if self.use_posemb and self.posemb == "factorized":
      x_BxNxD = FactorizedPositionEmbs(self.param_dtype, self.posemb_skips,
                                       name="posembed_input")(x_BxNxD, grid_hw,
                                                              positions)
    elif self.use_posemb:
      posemb_1xNxD = AddPositionEmbs(
          param_dtype=self.param_dtype, grids=self.posemb_grids,
          skip=self.posemb_skips, interpolation=self.posemb_interpolation,
          name="posembed_input")
      x_BxNxD = posemb_1xNxD(x_BxNxD, positions)
    x_BxNxD = nn.with_logical_constraint(x_BxNxD, lx.TOKENS_AXES)
    x_BxNxD = nn.Dropout(self.dropout_rate)(x_BxNxD, deterministic)
    if self.pre_norm:
      x_BxNxD = nn.LayerNorm(self.layer_norm_eps, dtype=self.dtype,
                             param_dtype=self.param_dtype,
                             use_bias=self.use_bias, name="pre_norm")(x_BxNxD)

    block_cls = Encoder1DBlock
    policy = REMAT_POLICIES[self.remat]
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
      block_cls = nn.remat(block_cls, prevent_cse=not self.scan_layers,
                           static_argnums=(2,), policy=policy)
    block_kwargs = dict(
        mlp_dim=self.mlp_dim, num_heads=self.num_heads,
        dropout_rate=self.dropout_rate,
        attention_dropout_rate=self.attention_dropout_rate,
        drop_path_rate=self.drop_path_rate,
        return_intermediates=return_intermediates,
        gelu_approximate=self.gelu_approximate, quick_gelu=self.quick_gelu,
        layer_scale=self.layer_scale, layer_norm_eps=self.layer_norm_eps,
        attention=self.attention, fp8=self.fp8,
        parallel_block=self.parallel_block, use_bias=self.use_bias,
        qkv_bias=self.qkv_bias, qk_norm=self.qk_norm, dtype=self.dtype,
        param_dtype=self.param_dtype)

    if self.scan_layers:
      scanned = nn.scan(block_cls, variable_axes={
          "params": 0,
          FP8_STATE: 0
      }, split_rngs={
          "params": True,
          "dropout": True
      }, in_axes=nn.broadcast, length=self.num_layers)
      x_BxNxD, captured = scanned(name="encoderblock", **block_kwargs)(
          x_BxNxD, deterministic, mask)
    else:
      per_layer = []
      for i in range(self.num_layers):
        x_BxNxD, c = block_cls(name=f"encoderblock_{i}", **block_kwargs)(
            x_BxNxD, deterministic, mask)
        per_layer.append(c)
      captured = (jax.tree.map(lambda *a: jnp.stack(a), *per_layer)
                  if return_intermediates else None)

    if not self.final_norm:
      return x_BxNxD, captured
    encoded = nn.LayerNorm(self.layer_norm_eps, dtype=self.dtype,
                           param_dtype=self.param_dtype, use_bias=self.use_bias,
                           name="encoder_norm")(x_BxNxD)
    return encoded, captured
