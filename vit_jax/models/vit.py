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
towers) differ in three options, each a field of the form: fixed 2D sin-cos
position embeddings (`posemb="sincos2d"`, added to the patches before any class
token), no class token (`class_token=False`; gap and map pool the patch
tokens), and pooling by global average or a MAP head (`classifier`).

The options are the model's form (`config/model_form.py`), one value that
every module here reads. Precision: its `dtype` is the compute dtype of
every matmul/conv, `param_dtype` the storage dtype; softmax, LayerNorm
statistics and the logits are fp32.

GELU: `gelu_approximate=True` is the tanh approximation, which both Google
code bases that trained the released weights use; False is the exact erf
form of timm and Hugging Face.
"""

from typing import Any
from typing import Callable
from typing import Optional

import flax.linen as nn
import jax.numpy as jnp

from vit_jax.config.model_form import ModelForm
from vit_jax.models import resnet
from vit_jax.models import rope as rotary
from vit_jax.models import sequences
from vit_jax.models.attention import MultiHeadDotProductAttention
from vit_jax.models.embeddings import PatchEmbedding
from vit_jax.models.encoder import Encoder
from vit_jax.models.encoder import MlpBlock
from vit_jax.models.variants import Variant

__all__ = ["VisionTransformer", "MAPHead"]


class MAPHead(nn.Module):
  """Multihead attention pooling: a learned probe attends over the tokens.
  Returns (pooled B x D, the probe's attention B x H x 1 x N); with `mask`
  (B x K x N, a patch sequence's images) one probe per image: B x K x D.

  big_vision's form whatever the encoder's: of the model's form it reads
  what the head shares with it (`ModelForm.for_part`: the GELU, the
  LayerNorm epsilon and the dtypes).
  """
  mlp_dim: int
  num_heads: int
  form: ModelForm

  @nn.compact
  def __call__(self, x_BxNxD, mask_BxKxN=None):
    form = self.form.for_part("map_head")
    dtype, param_dtype = jnp.dtype(form.dtype), jnp.dtype(form.param_dtype)
    width = x_BxNxD.shape[-1]
    probes = 1 if mask_BxKxN is None else mask_BxKxN.shape[1]
    probe = self.param("probe", nn.initializers.xavier_uniform(), (1, 1, width),
                       param_dtype)
    probe_BxKxD = jnp.tile(probe, (x_BxNxD.shape[0], probes, 1)).astype(dtype)
    x_BxKxD, weights_BxHxKxN = MultiHeadDotProductAttention(
        self.num_heads, form, name="MultiHeadDotProductAttention_0")(
            probe_BxKxD, x_BxNxD, True, need_weights=True,
            mask=None if mask_BxKxN is None else mask_BxKxN[:, None])
    y = nn.LayerNorm(form.layer_norm_eps, dtype=dtype, param_dtype=param_dtype,
                     name="LayerNorm_0")(x_BxKxD)
    x_BxKxD = x_BxKxD + MlpBlock(self.mlp_dim, form, name="MlpBlock_0")(y, True)
    return (x_BxKxD[:, 0] if mask_BxKxN is None else x_BxKxD), weights_BxHxKxN


class VisionTransformer(nn.Module):
  """ViT or hybrid; `__call__` returns (logits, dict of named intermediates).

  `size` gives the widths, depth, heads, patch size and hybrid stem (a
  variant of `variants.py`), `form` everything else it computes
  (`config.model`'s options: classifier, class token, position
  embeddings, the blocks' options, dtypes, ...), read whole by each module.
  """
  num_classes: Optional[int]  # None: no head, logits are the pre-logits.
  size: Variant
  form: ModelForm
  gather_block: Optional[Callable[[Any], Any]] = None  # See Encoder.
  # False: the head starts at LeCun-normal, as an image-text tower's
  # projection must (a zero embedding has no direction to normalise).
  head_zeroinit: bool = True

  @property
  def has_class_token(self) -> bool:
    return self.form.has_class_token

  @property
  def num_prefix_tokens(self) -> int:
    """Tokens before the patch grid: the class token (if any) and the
    registers."""
    return self.form.num_prefix_tokens

  @nn.compact
  def __call__(self, images_BxHxWxC, *, train: bool = False,
               return_intermediates: bool = False,
               patch_embeddings_fn: Optional[Callable] = None):
    """`images_BxHxWxC`: images, or a `sequences.PatchSequence` or a dict
    of its fields (images at their own shape; see that module).
    `patch_embeddings_fn(x_BxNxD) -> x_BxNxD`, if given, changes the patch
    embeddings before the class token and the position embeddings join them
    (masked patch prediction corrupts them there)."""
    form, out = self.form, {}
    dtype, param_dtype = jnp.dtype(form.dtype), jnp.dtype(form.param_dtype)
    seq = sequences.as_sequence(images_BxHxWxC)
    if seq is None:
      x_BxNxD, grid_hw, posemb_grids = self._embed_images(images_BxHxWxC, out)
      coords, positions = sequences.grid_coords(*grid_hw), None
    else:
      x_BxNxD, grid_hw, posemb_grids = self._embed_sequence(seq), None, None
      grids = sequences.token_grids(seq)
      if form.posemb_keep_aspect:
        grids = jnp.broadcast_to(grids.max(-1, keepdims=True), grids.shape)
      positions = (seq.coords, grids)
      coords = seq.coords
    batch, _, width = x_BxNxD.shape
    if patch_embeddings_fn is not None:
      x_BxNxD = patch_embeddings_fn(x_BxNxD)

    if form.posemb == "sincos2d":  # Before the class token, which has none.
      x_BxNxD = x_BxNxD + sequences.sincos2d_at(coords, width).astype(
          x_BxNxD.dtype)
    prefix = form.num_prefix_tokens
    if form.num_registers:
      registers = self.param("registers", nn.initializers.normal(1e-6),
                             (1, form.num_registers, width), param_dtype)
      x_BxNxD = jnp.concatenate(
          [jnp.tile(registers, (batch, 1, 1)).astype(dtype), x_BxNxD], axis=1)
    if form.has_class_token:
      cls = self.param("cls", nn.initializers.zeros, (1, 1, width), param_dtype)
      cls_Bx1xD = jnp.tile(cls, (batch, 1, 1)).astype(dtype)
      x_BxNxD = jnp.concatenate([cls_Bx1xD, x_BxNxD], axis=1)
    segments = None if seq is None else jnp.pad(seq.segments,
                                                ((0, 0),
                                                 (prefix,
                                                  0)), constant_values=1)

    size = self.size
    encoded, captured = Encoder(
        size.num_layers, size.mlp_dim, size.num_heads, form,
        posemb_grids=posemb_grids, posemb_skips=0 if
        (form.posemb_covers_prefix and form.posemb == "learn") else prefix,
        gather_block=self.gather_block, name="Transformer")(
            x_BxNxD, not train, return_intermediates, grid_hw, positions,
            None if seq is None else sequences.attention_mask(segments),
            self._rope(coords, grid_hw, seq, train, batch))
    out["encoded"] = encoded
    # The patches' output tokens (without the class token).
    out["patch_tokens"] = patch_tokens = encoded[:, prefix:]
    if captured is not None:
      out["blocks"] = captured["block"]  # L x B x N x D
      out["attention_weights"] = captured["attention"]  # L x B x H x N x N

    # A sequence of K images pools each: B x K x D (K = 1: B x D).
    pool_mask = None if seq is None else sequences.pooling_mask(
        seq.segments, seq.images_per_sequence)
    if form.classifier == "token":
      x_BxD = encoded[:, 0]
    elif form.classifier == "gap" and seq is None:
      x_BxD = jnp.mean(patch_tokens, axis=1)
    elif form.classifier == "gap":
      x_BxD = sequences.masked_mean(patch_tokens, pool_mask)
    elif form.classifier == "map":  # Over every token, as timm's (PE's).
      if pool_mask is not None and prefix:
        pool_mask = jnp.pad(pool_mask, ((0, 0), (0, 0), (prefix, 0)),
                            constant_values=True)
      x_BxD, probe_attention = MAPHead(size.mlp_dim, form.map_heads or
                                       size.num_heads, form, name="MAPHead_0")(
                                           encoded, pool_mask)
      if return_intermediates:
        out["map_attention"] = probe_attention  # B x H x K x N
    else:  # The config's checks refuse others before this runs.
      raise ValueError(f"Unknown classifier {form.classifier!r}.")
    if seq is not None and seq.images_per_sequence == 1 and x_BxD.ndim == 3:
      x_BxD = x_BxD[:, 0]
    if form.pooled_norm:
      x_BxD = nn.LayerNorm(form.layer_norm_eps, dtype=dtype,
                           param_dtype=param_dtype, name="pooled_norm")(x_BxD)
    out["head_input"] = x_BxD

    return pre_logits_and_head(self, x_BxD, out)

  def _rope(self, coords, grid_hw, seq, train: bool, batch: int):
    """RoPE's (sin, cos) tables of the patches, or their positions where
    each block turns them itself (learned frequencies: mixed) or moves
    them by a draw of its own (`rotary.drawn_per_block`); None without
    RoPE. Each patch's position is in its own image's grid, moved in
    training by the form's augmentations (if any)."""
    form, size = self.form, self.size
    if form.rope == "none":
      return None
    grids = (jnp.asarray(grid_hw)[None, None]
             if seq is None else sequences.token_grids(seq))
    grids = jnp.broadcast_to(grids, coords.shape)
    positions = rotary.positions(form, coords, grids)
    per_block = rotary.drawn_per_block(form, train)
    if train and rotary.augments(form) and not per_block:
      if form.rope_augment_per == "image":
        positions = jnp.broadcast_to(positions, (batch, *positions.shape[1:]))
      positions = rotary.augmented(form, positions, self.make_rng("dropout"))
    if form.rope == "mixed" or per_block:
      return positions
    return rotary.sin_cos(form, positions, size.hidden_size // size.num_heads)

  def _embed_images(self, images_BxHxWxC, out: dict):
    """Patch embeddings of images (through the hybrid's stem, if any):
    (B x N x D, the grid, FlexiViT's posemb_grids)."""
    size, form = self.size, self.form
    dtype, param_dtype = jnp.dtype(form.dtype), jnp.dtype(form.param_dtype)
    x = images_BxHxWxC.astype(dtype)
    if size.resnet is not None:
      x = out["stem"] = resnet.resnet_stem(x, size.resnet, dtype, param_dtype)
    run = form.patch_size or size.patch_size
    _check_divisible(x.shape[1:3], run, size.resnet is not None)
    posemb_grids = None
    if run != size.patch_size:
      stored_grid = tuple(s // size.patch_size for s in x.shape[1:3])
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
    if self.size.resnet is not None:
      raise ValueError("A hybrid's stem needs whole images, not patches.")
    if seq.images_per_sequence > 1 and (self.form.num_prefix_tokens or
                                        self.form.classifier == "token"):
      raise ValueError("Packed sequences pool each image's patches; a class "
                       "token or registers would be shared by all of them.")
    run = self.form.patch_size or self.size.patch_size
    batch, length, features = seq.patches.shape
    # Each patch embedded alone by the image path's conv: a square image's
    # patches then embed bit for bit as the image does (a matmul over the
    # flattened patches rounds differently).
    tiles = seq.patches.reshape(batch * length, run, run, features // run**2)
    x = self._patch_embedding(run)(tiles.astype(jnp.dtype(self.form.dtype)))
    return x.reshape(batch, length, -1)

  def _patch_embedding(self, run: int) -> nn.Module:
    """The patch embedding at patch size `run`: a conv, or FlexiViT's
    PI-resized kernel where it runs at another size than stored."""
    size, form = self.size, self.form
    dtype, param_dtype = jnp.dtype(form.dtype), jnp.dtype(form.param_dtype)
    if run == size.patch_size:
      return nn.Conv(size.hidden_size, (run, run), strides=(run, run),
                     padding="VALID", dtype=dtype, param_dtype=param_dtype,
                     name="embedding")
    return PatchEmbedding(size.hidden_size, size.patch_size, run, dtype=dtype,
                          param_dtype=param_dtype, name="embedding")


def pre_logits_and_head(model: nn.Module, x_BxD, out: dict):
  """The tail every model here shares, called inside its `__call__`: the
  optional tanh pre-logits layer and the zero-initialised head (its
  form's representation_size and head_bias_init, its num_classes).
  Returns (logits, or the pre-logits without a head; `out` with both
  added)."""
  form = model.form
  param_dtype = jnp.dtype(form.param_dtype)
  if form.representation_size is not None:
    x_BxD = nn.tanh(
        nn.Dense(form.representation_size, dtype=jnp.dtype(form.dtype),
                 param_dtype=param_dtype, name="pre_logits")(x_BxD))
  out["pre_logits"] = x_BxD = x_BxD.astype(jnp.float32)
  if model.num_classes is None:
    return x_BxD, out
  # The Mixer has no such field: its head starts at zero.
  zero = getattr(model, "head_zeroinit", True)
  logits_BxK = nn.Dense(
      model.num_classes, dtype=jnp.float32, param_dtype=param_dtype,
      kernel_init=(nn.initializers.zeros
                   if zero else nn.initializers.lecun_normal()),
      bias_init=nn.initializers.constant(
          form.head_bias_init), name="head")(x_BxD)
  out["logits"] = logits_BxK
  return logits_BxK, out


def _check_divisible(size_hw, patch_size: int, hybrid: bool):
  """The config checks (and `inference.config_for`) refuse an image size
  that is not a multiple of the patch stride before the model runs."""
  if size_hw[0] % patch_size or size_hw[1] % patch_size:
    where = "stem feature map" if hybrid else "image"
    raise ValueError(f"The {where} size {tuple(size_hw)} is not divisible by "
                     f"the patch size {patch_size}.")
