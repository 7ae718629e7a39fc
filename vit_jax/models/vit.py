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

from typing import Any
from typing import Callable
from typing import Optional

import flax.linen as nn
import jax.numpy as jnp

from vit_jax.models import resnet
from vit_jax.models import sequences
from vit_jax.models.attention import MultiHeadDotProductAttention
from vit_jax.models.embeddings import PatchEmbedding
from vit_jax.models.encoder import REMAT_POLICIES
from vit_jax.models.encoder import Encoder
from vit_jax.models.encoder import MlpBlock
from vit_jax.models.variants import ResNetSpec

Dtype = Any
CLASSIFIERS = ("token", "gap", "map")
# Position embeddings: learned (the paper), fixed 2D sin-cos ones
# (big_vision's `sincos2d`, as MoCo v3 defines them; nothing is stored), or
# NaViT's factorized ones (a learned table per axis, summed).
POSEMB_TYPES = ("learn", "sincos2d", "factorized")
__all__ = ["REMAT_POLICIES", "VisionTransformer", "MAPHead"]


class MAPHead(nn.Module):
  """Multihead attention pooling: a learned probe attends over the tokens.
  Returns (pooled B x D, the probe's attention B x H x 1 x N); with `mask`
  (B x K x N, a patch sequence's images) one probe per image: B x K x D."""
  mlp_dim: int
  num_heads: int
  gelu_approximate: bool = True
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x_BxNxD, mask_BxKxN=None):
    width = x_BxNxD.shape[-1]
    probes = 1 if mask_BxKxN is None else mask_BxKxN.shape[1]
    probe = self.param("probe", nn.initializers.xavier_uniform(), (1, 1, width),
                       self.param_dtype)
    probe_BxKxD = jnp.tile(probe, (x_BxNxD.shape[0], probes, 1)).astype(
        self.dtype)
    x_BxKxD, weights_BxHxKxN = MultiHeadDotProductAttention(
        self.num_heads, dtype=self.dtype, param_dtype=self.param_dtype,
        name="MultiHeadDotProductAttention_0")(
            probe_BxKxD, x_BxNxD, True, need_weights=True,
            mask=None if mask_BxKxN is None else mask_BxKxN[:, None])
    y = nn.LayerNorm(dtype=self.dtype, param_dtype=self.param_dtype,
                     name="LayerNorm_0")(x_BxKxD)
    x_BxKxD = x_BxKxD + MlpBlock(
        self.mlp_dim, gelu_approximate=self.gelu_approximate, dtype=self.dtype,
        param_dtype=self.param_dtype, name="MlpBlock_0")(y, True)
    return (x_BxKxD[:, 0] if mask_BxKxN is None else x_BxKxD), weights_BxHxKxN


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
  # How patch sequences resize learned position embeddings to each image's
  # grid (sequences.INTERPOLATIONS): bilinear (big_vision's NaFlex) or
  # bicubic (timm's), both antialiased; the form the weights learned with.
  posemb_interpolation: str = "bilinear"
  # timm's pos_embed_ar_preserving: the table resized to a square of the
  # image grid's longer side, read at the image's rows and columns.
  posemb_keep_aspect: bool = False
  fp8: bool = False  # The encoder's matmuls in FP8 in training (MlpBlock).
  # ViT-22B's block options (see encoder.Encoder1DBlock), each off.
  parallel_block: bool = False
  use_bias: bool = True
  qkv_bias: bool = True
  qk_norm: bool = False
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
    """`images_BxHxWxC`: images, or a `sequences.PatchSequence` or a dict
    of its fields (images at their own shape; see that module).
    `patch_embeddings_fn(x_BxNxD) -> x_BxNxD`, if given, changes the patch
    embeddings before the class token and the position embeddings join them
    (masked patch prediction corrupts them there)."""
    out = {}
    seq = sequences.as_sequence(images_BxHxWxC)
    if seq is None:
      x_BxNxD, grid_hw, posemb_grids = self._embed_images(images_BxHxWxC, out)
      coords, positions = sequences.grid_coords(*grid_hw), None
    else:
      x_BxNxD, grid_hw, posemb_grids = self._embed_sequence(seq), None, None
      grids = sequences.token_grids(seq)
      if self.posemb_keep_aspect:
        grids = jnp.broadcast_to(grids.max(-1, keepdims=True), grids.shape)
      positions = (seq.coords, grids)
      coords = seq.coords
    batch, _, width = x_BxNxD.shape
    if patch_embeddings_fn is not None:
      x_BxNxD = patch_embeddings_fn(x_BxNxD)

    if self.posemb == "sincos2d":  # Before the class token, which has none.
      x_BxNxD = x_BxNxD + sequences.sincos2d_at(coords, width).astype(
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
    segments = None if seq is None else jnp.pad(seq.segments,
                                                ((0, 0),
                                                 (prefix,
                                                  0)), constant_values=1)

    encoded, captured = Encoder(
        num_layers=self.num_layers, mlp_dim=self.mlp_dim,
        num_heads=self.num_heads, dropout_rate=self.dropout_rate,
        attention_dropout_rate=self.attention_dropout_rate,
        drop_path_rate=self.drop_path_rate, use_posemb=self.use_posemb and
        self.posemb != "sincos2d", posemb=self.posemb,
        posemb_interpolation=self.posemb_interpolation,
        posemb_grids=posemb_grids, posemb_skips=0 if
        (self.posemb_covers_prefix and self.posemb == "learn") else prefix,
        remat=self.remat, scan_layers=self.scan_layers,
        gelu_approximate=self.gelu_approximate, quick_gelu=self.quick_gelu,
        layer_scale=self.layer_scale, pre_norm=self.pre_norm,
        final_norm=not self.pooled_norm, layer_norm_eps=self.layer_norm_eps,
        attention=self.attention, fp8=self.fp8,
        parallel_block=self.parallel_block, use_bias=self.use_bias,
        qkv_bias=self.qkv_bias, qk_norm=self.qk_norm,
        gather_block=self.gather_block, dtype=self.dtype,
        param_dtype=self.param_dtype, name="Transformer")(
            x_BxNxD, not train, return_intermediates, grid_hw, positions,
            None if seq is None else sequences.attention_mask(segments))
    out["encoded"] = encoded
    # The patches' output tokens (without the class token).
    out["patch_tokens"] = patch_tokens = encoded[:, prefix:]
    if captured is not None:
      out["blocks"] = captured["block"]  # L x B x N x D
      out["attention_weights"] = captured["attention"]  # L x B x H x N x N

    # A sequence of K images pools each: B x K x D (K = 1: B x D).
    pool_mask = None if seq is None else sequences.pooling_mask(
        seq.segments, seq.images_per_sequence)
    if self.classifier == "token":
      x_BxD = encoded[:, 0]
    elif self.classifier == "gap" and seq is None:
      x_BxD = jnp.mean(patch_tokens, axis=1)
    elif self.classifier == "gap":
      x_BxD = sequences.masked_mean(patch_tokens, pool_mask)
    elif self.classifier == "map":
      x_BxD, probe_attention = MAPHead(
          self.mlp_dim, self.num_heads, self.gelu_approximate, dtype=self.dtype,
          param_dtype=self.param_dtype, name="MAPHead_0")(patch_tokens,
                                                          pool_mask)
      if return_intermediates:
        out["map_attention"] = probe_attention  # B x H x K x N
    else:  # models.check_model_config refuses others before this runs.
      raise ValueError(f"Unknown classifier {self.classifier!r}.")
    if seq is not None and seq.images_per_sequence == 1 and x_BxD.ndim == 3:
      x_BxD = x_BxD[:, 0]
    if self.pooled_norm:
      x_BxD = nn.LayerNorm(self.layer_norm_eps, dtype=self.dtype,
                           param_dtype=self.param_dtype,
                           name="pooled_norm")(x_BxD)
    out["head_input"] = x_BxD

    return pre_logits_and_head(self, x_BxD, out)

  def _embed_images(self, images_BxHxWxC, out: dict):
    """Patch embeddings of images (through the hybrid's stem, if any):
    (B x N x D, the grid, FlexiViT's posemb_grids)."""
    x = images_BxHxWxC.astype(self.dtype)
    if self.resnet is not None:
      x = out["stem"] = resnet.resnet_stem(x, self.resnet, self.dtype,
                                           self.param_dtype)
    run = self.run_patch_size or self.patch_size
    _check_divisible(x.shape[1:3], run, self.resnet is not None)
    posemb_grids = None
    if run != self.patch_size:
      stored_grid = tuple(s // self.patch_size for s in x.shape[1:3])
      posemb_grids = (stored_grid, (x.shape[1] // run, x.shape[2] // run))
    x = self._patch_embedding(run)(x)
    batch, grid_h, grid_w, width = x.shape
    out["grid"] = (grid_h, grid_w)
    return x.reshape(batch, grid_h * grid_w,
                     width), (grid_h, grid_w), posemb_grids

  def _embed_sequence(self, seq: sequences.PatchSequence):
    """Patch embeddings of a patch sequence: the conv kernel (P, P, C, D),
    PI-resized where FlexiViT runs at another size, read as a Dense
    (P*P*C, D) layer."""
    if self.resnet is not None:
      raise ValueError("A hybrid's stem needs whole images, not patches.")
    if seq.images_per_sequence > 1 and (self.num_prefix_tokens or
                                        self.classifier == "token"):
      raise ValueError("Packed sequences pool each image's patches; a class "
                       "token or registers would be shared by all of them.")
    run = self.run_patch_size or self.patch_size
    batch, length, features = seq.patches.shape
    # Each patch embedded alone by the image path's conv: a square image's
    # patches then embed bit for bit as the image does (a matmul over the
    # flattened patches rounds differently).
    tiles = seq.patches.reshape(batch * length, run, run, features // run**2)
    x = self._patch_embedding(run)(tiles.astype(self.dtype))
    return x.reshape(batch, length, -1)

  def _patch_embedding(self, run: int) -> nn.Module:
    """The patch embedding at patch size `run`: a conv, or FlexiViT's
    PI-resized kernel where it runs at another size than stored."""
    if run == self.patch_size:
      return nn.Conv(self.hidden_size, (run, run), strides=(run, run),
                     padding="VALID", dtype=self.dtype,
                     param_dtype=self.param_dtype, name="embedding")
    return PatchEmbedding(self.hidden_size, self.patch_size, run,
                          dtype=self.dtype, param_dtype=self.param_dtype,
                          name="embedding")


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
