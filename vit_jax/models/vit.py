"""Vision Transformer (Dosovitskiy et al., 2021) in Flax Linen.

    z_0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos
    z'_l = MSA(LN(z_{l-1})) + z_{l-1}
    z_l  = MLP(LN(z'_l)) + z'_l
    y    = LN(z_L^0)

Parameter names follow the released checkpoints (`embedding`, `cls`,
`Transformer/posembed_input/pos_embedding`, `Transformer/encoderblock_{i}/...`,
`Transformer/encoder_norm`, `pre_logits`, `head`), so released `.npz` files map
1:1. With `scan_layers` the blocks live in one `Transformer/encoderblock` whose
parameters carry a leading layer axis (see `scan.py` for conversion). The
model holds nothing only training uses: masked patch prediction composes its
[mask] token and head around it (`masked_patch.MaskedPatchViT`).

big_vision's plain ViTs ("Better plain ViT baselines", SigLIP's image
towers) differ in three options, each a field here: fixed 2D sin-cos position
embeddings (`posemb="sincos2d"`, added to the patches before any class
token), no class token (`class_token=False`; gap and map pool the patch
tokens), and pooling by global average or a MAP head (`classifier`).

Precision: `dtype` is the compute dtype of every matmul/conv, `param_dtype` the
storage dtype; softmax, LayerNorm statistics and the logits are fp32.

GELU: `gelu_approximate=True` is the tanh approximation, which both Google
code bases that trained the released weights use; False is the exact erf
form of timm and Hugging Face.
"""

import functools
from typing import Any
from typing import Callable
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.models import partitioning as lx
from vit_jax.models import resnet
from vit_jax.models.attention import FP8_STATE
from vit_jax.models.attention import MultiHeadDotProductAttention
from vit_jax.models.attention import fp8_matmuls
from vit_jax.models.embeddings import AddPositionEmbs
from vit_jax.models.embeddings import PatchEmbedding
from vit_jax.models.embeddings import posemb_sincos2d
from vit_jax.models.variants import ResNetSpec

Dtype = Any
CLASSIFIERS = ("token", "gap", "map")
# Position embeddings: learned (the paper), or fixed 2D sin-cos ones
# (big_vision's `sincos2d`, as MoCo v3 defines them; nothing is stored).
POSEMB_TYPES = ("learn", "sincos2d")
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
  """Pre-LN transformer block; returns (output, per-layer intermediates)."""
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
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x_BxNxD, deterministic: bool):
    norm = functools.partial(nn.LayerNorm, epsilon=self.layer_norm_eps,
                             dtype=self.dtype, param_dtype=self.param_dtype)
    y = norm(name="LayerNorm_0")(x_BxNxD)
    y, weights_BxHxNxN = MultiHeadDotProductAttention(
        self.num_heads, self.attention_dropout_rate, self.attention,
        fp8=self.fp8, dtype=self.dtype, param_dtype=self.param_dtype,
        name="MultiHeadDotProductAttention_1")(
            y, y, deterministic, need_weights=self.return_intermediates)
    y = nn.Dropout(self.dropout_rate)(y, deterministic)
    if self.layer_scale is not None:
      y = LayerScale(self.layer_scale, self.param_dtype,
                     name="LayerScale_attention")(y)
    x_BxNxD = x_BxNxD + drop_path(self.drop_path_rate)(y, deterministic)

    y = norm(name="LayerNorm_2")(x_BxNxD)
    y = MlpBlock(self.mlp_dim, self.dropout_rate, self.gelu_approximate,
                 self.quick_gelu, self.fp8, dtype=self.dtype,
                 param_dtype=self.param_dtype, name="MlpBlock_3")(y,
                                                                  deterministic)
    if self.layer_scale is not None:
      y = LayerScale(self.layer_scale, self.param_dtype,
                     name="LayerScale_mlp")(y)
    y = drop_path(self.drop_path_rate)(y, deterministic)
    x_BxNxD = nn.with_logical_constraint(x_BxNxD + y, lx.TOKENS_AXES)
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
  # FSDP in training: `{"params": block} -> {"params": gathered block}`.
  gather_block: Optional[Callable[[Any], Any]] = None
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x_BxNxD, deterministic: bool,
               return_intermediates: bool = False):
    if self.use_posemb:
      posemb_1xNxD = AddPositionEmbs(
          param_dtype=self.param_dtype, grids=self.posemb_grids,
          skip=self.posemb_skips, name="posembed_input")
      x_BxNxD = posemb_1xNxD(x_BxNxD)
    x_BxNxD = nn.with_logical_constraint(x_BxNxD, lx.TOKENS_AXES)
    x_BxNxD = nn.Dropout(self.dropout_rate)(x_BxNxD, deterministic)
    if self.pre_norm:
      x_BxNxD = nn.LayerNorm(self.layer_norm_eps, dtype=self.dtype,
                             param_dtype=self.param_dtype,
                             name="pre_norm")(x_BxNxD)

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
        attention=self.attention, fp8=self.fp8, dtype=self.dtype,
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
          x_BxNxD, deterministic)
    else:
      per_layer = []
      for i in range(self.num_layers):
        x_BxNxD, c = block_cls(name=f"encoderblock_{i}", **block_kwargs)(
            x_BxNxD, deterministic)
        per_layer.append(c)
      captured = (jax.tree.map(lambda *a: jnp.stack(a), *per_layer)
                  if return_intermediates else None)

    if not self.final_norm:
      return x_BxNxD, captured
    encoded = nn.LayerNorm(self.layer_norm_eps, dtype=self.dtype,
                           param_dtype=self.param_dtype,
                           name="encoder_norm")(x_BxNxD)
    return encoded, captured


class MAPHead(nn.Module):
  """Multihead attention pooling: a learned probe attends over the tokens.
  Returns (pooled B x D, the probe's attention B x H x 1 x N)."""
  mlp_dim: int
  num_heads: int
  gelu_approximate: bool = True
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x_BxNxD):
    width = x_BxNxD.shape[-1]
    probe = self.param("probe", nn.initializers.xavier_uniform(), (1, 1, width),
                       self.param_dtype)
    probe_Bx1xD = jnp.tile(probe, (x_BxNxD.shape[0], 1, 1)).astype(self.dtype)
    x_Bx1xD, weights_BxHx1xN = MultiHeadDotProductAttention(
        self.num_heads, dtype=self.dtype, param_dtype=self.param_dtype,
        name="MultiHeadDotProductAttention_0")(probe_Bx1xD, x_BxNxD, True,
                                               need_weights=True)
    y = nn.LayerNorm(dtype=self.dtype, param_dtype=self.param_dtype,
                     name="LayerNorm_0")(x_Bx1xD)
    x_Bx1xD = x_Bx1xD + MlpBlock(
        self.mlp_dim, gelu_approximate=self.gelu_approximate, dtype=self.dtype,
        param_dtype=self.param_dtype, name="MlpBlock_0")(y, True)
    return x_Bx1xD[:, 0], weights_BxHx1xN


class VisionTransformer(nn.Module):
  """ViT or hybrid; `__call__` returns (logits, dict of named intermediates)."""
  num_classes: Optional[int]  # None: no head, logits are the pre-logits.
  hidden_size: int
  mlp_dim: int
  num_heads: int
  num_layers: int
  patch_size: int
  resnet: Optional[ResNetSpec] = None
  classifier: str = "token"  # How the head pools: one of CLASSIFIERS.
  # A class token before the patches; None: exactly when classifier="token".
  # gap and map pool the patch tokens only.
  class_token: Optional[bool] = None
  posemb: str = "learn"  # One of POSEMB_TYPES.
  # FlexiViT: the patch size it runs at (None: patch_size). The parameters
  # keep patch_size's shapes (position embeddings: the grid patch_size
  # makes of the image); the kernel is PI-resized, learned position
  # embeddings resized to the grid, in every step.
  run_patch_size: Optional[int] = None
  representation_size: Optional[int] = None
  head_bias_init: float = 0.0
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  drop_path_rate: float = 0.0  # Stochastic depth, see `drop_path`.
  use_posemb: bool = True
  remat: str = "none"
  scan_layers: bool = False
  gelu_approximate: bool = True  # tanh (released weights); False: erf.
  # The options of PyTorch's ViT families (DINOv2, DeiT III, CLIP), each off
  # by default: register tokens after the class token (never with a
  # position embedding of their own unless the table covers the prefix),
  # whether learned position embeddings cover the prefix tokens (timm's
  # `no_embed_class` is False) or the patches only, LayerScale's init
  # value, a LayerNorm before the blocks, QuickGELU, and the final
  # LayerNorm on the pooled features instead of every token (timm's
  # `fc_norm`).
  num_registers: int = 0
  posemb_covers_prefix: bool = True
  layer_scale: Optional[float] = None
  pre_norm: bool = False
  quick_gelu: bool = False
  pooled_norm: bool = False
  layer_norm_eps: float = 1e-6  # Every LayerNorm's (timm's CLIP: 1e-5).
  attention: str = "auto"  # See MultiHeadDotProductAttention; one of ATTENTION.
  fp8: bool = False  # The encoder's matmuls in FP8 in training (MlpBlock).
  gather_block: Optional[Callable[[Any], Any]] = None  # See Encoder.
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @property
  def has_class_token(self) -> bool:
    return has_class_token(self.classifier, self.class_token)

  @property
  def num_prefix_tokens(self) -> int:
    """Tokens before the patch grid: the class token (if any) and the
    registers."""
    return int(self.has_class_token) + self.num_registers

  @nn.compact
  def __call__(self, images_BxHxWxC, *, train: bool = False,
               return_intermediates: bool = False,
               patch_embeddings_fn: Optional[Callable] = None):
    """`patch_embeddings_fn(x_BxNxD) -> x_BxNxD`, if given, changes the
    patch embeddings before the class token and the position embeddings
    join them (masked patch prediction corrupts them there)."""
    out = {}
    x = images_BxHxWxC.astype(self.dtype)
    if self.resnet is not None:
      x = out["stem"] = resnet.resnet_stem(x, self.resnet, self.dtype,
                                           self.param_dtype)
    run = self.run_patch_size or self.patch_size
    _check_divisible(x.shape[1:3], run, self.resnet is not None)
    posemb_grids = None
    if run == self.patch_size:
      x = nn.Conv(self.hidden_size, (self.patch_size,) * 2,
                  strides=(self.patch_size,) * 2, padding="VALID",
                  dtype=self.dtype, param_dtype=self.param_dtype,
                  name="embedding")(x)
    else:
      stored_grid = tuple(s // self.patch_size for s in x.shape[1:3])
      x = PatchEmbedding(self.hidden_size, self.patch_size, run,
                         dtype=self.dtype, param_dtype=self.param_dtype,
                         name="embedding")(x)
      posemb_grids = (stored_grid, x.shape[1:3])
    batch, grid_h, grid_w, width = x.shape
    x_BxNxD = jnp.reshape(x, (batch, grid_h * grid_w, width))
    out["grid"] = (grid_h, grid_w)
    if patch_embeddings_fn is not None:
      x_BxNxD = patch_embeddings_fn(x_BxNxD)

    if self.posemb == "sincos2d":  # Before the class token, which has none.
      x_BxNxD = x_BxNxD + posemb_sincos2d(grid_h, grid_w, width).astype(
          x_BxNxD.dtype)
    prefix = self.num_prefix_tokens
    if self.num_registers:
      registers = self.param("registers", nn.initializers.normal(1e-6),
                             (1, self.num_registers, width), self.param_dtype)
      x_BxNxD = jnp.concatenate(
          [jnp.tile(registers,
                    (batch, 1, 1)).astype(self.dtype), x_BxNxD], axis=1)
    if prefix > self.num_registers:
      cls = self.param("cls", nn.initializers.zeros, (1, 1, width),
                       self.param_dtype)
      cls_Bx1xD = jnp.tile(cls, (batch, 1, 1)).astype(self.dtype)
      x_BxNxD = jnp.concatenate([cls_Bx1xD, x_BxNxD], axis=1)

    encoded, captured = Encoder(
        num_layers=self.num_layers, mlp_dim=self.mlp_dim,
        num_heads=self.num_heads, dropout_rate=self.dropout_rate,
        attention_dropout_rate=self.attention_dropout_rate,
        drop_path_rate=self.drop_path_rate, use_posemb=self.use_posemb and
        self.posemb == "learn", posemb_grids=posemb_grids,
        posemb_skips=0 if self.posemb_covers_prefix else prefix,
        remat=self.remat, scan_layers=self.scan_layers,
        gelu_approximate=self.gelu_approximate, quick_gelu=self.quick_gelu,
        layer_scale=self.layer_scale, pre_norm=self.pre_norm,
        final_norm=not self.pooled_norm, layer_norm_eps=self.layer_norm_eps,
        attention=self.attention, fp8=self.fp8, gather_block=self.gather_block,
        dtype=self.dtype, param_dtype=self.param_dtype, name="Transformer")(
            x_BxNxD, not train, return_intermediates)
    out["encoded"] = encoded
    # The patches' output tokens (without the class token).
    out["patch_tokens"] = patch_tokens = encoded[:, prefix:]
    if captured is not None:
      out["blocks"] = captured["block"]  # L x B x N x D
      out["attention_weights"] = captured["attention"]  # L x B x H x N x N

    if self.classifier == "token":
      x_BxD = encoded[:, 0]
    elif self.classifier == "gap":
      x_BxD = jnp.mean(patch_tokens, axis=1)
    elif self.classifier == "map":
      x_BxD, probe_attention = MAPHead(
          self.mlp_dim, self.num_heads, self.gelu_approximate, dtype=self.dtype,
          param_dtype=self.param_dtype, name="MAPHead_0")(patch_tokens)
      if return_intermediates:
        out["map_attention"] = probe_attention  # B x H x 1 x N
    else:  # models.check_model_config refuses others before this runs.
      raise ValueError(f"Unknown classifier {self.classifier!r}.")
    if self.pooled_norm:
      x_BxD = nn.LayerNorm(self.layer_norm_eps, dtype=self.dtype,
                           param_dtype=self.param_dtype,
                           name="pooled_norm")(x_BxD)
    out["head_input"] = x_BxD

    return pre_logits_and_head(self, x_BxD, out)


def pre_logits_and_head(model: nn.Module, x_BxD, out: dict):
  """The tail every model here shares, called inside its `__call__`: the
  optional tanh pre-logits layer and the zero-initialised head (fields
  representation_size, num_classes, head_bias_init of `model`). Returns
  (logits, or the pre-logits without a head; `out` with both added)."""
  if model.representation_size is not None:
    x_BxD = nn.tanh(
        nn.Dense(model.representation_size, dtype=model.dtype,
                 param_dtype=model.param_dtype, name="pre_logits")(x_BxD))
  out["pre_logits"] = x_BxD = x_BxD.astype(jnp.float32)
  if model.num_classes is None:
    return x_BxD, out
  logits_BxK = nn.Dense(
      model.num_classes, dtype=jnp.float32, param_dtype=model.param_dtype,
      kernel_init=nn.initializers.zeros, bias_init=nn.initializers.constant(
          model.head_bias_init), name="head")(x_BxD)
  out["logits"] = logits_BxK
  return logits_BxK, out


def has_class_token(classifier: str, class_token: Optional[bool]) -> bool:
  """Whether the model has a class token (`class_token` None: the classifier
  says, token pooling being the class token's)."""
  return classifier == "token" if class_token is None else bool(class_token)


def _check_divisible(size_hw, patch_size: int, hybrid: bool):
  """The config checks (and `inference.config_for`) refuse an image size
  that is not a multiple of the patch stride before the model runs."""
  if size_hw[0] % patch_size or size_hw[1] % patch_size:
    where = "stem feature map" if hybrid else "image"
    raise ValueError(f"The {where} size {tuple(size_hw)} is not divisible by "
                     f"the patch size {patch_size}.")
