"""Masked patch prediction, the paper's self-supervised objective (App. B.1.2).

Half of each image's patch embeddings are corrupted, as BERT corrupts
words: of the corrupted ones, 80% are replaced by a learnt [mask]
embedding, 10% by the embedding of another patch of the same image, and
10% are kept as they are. From each corrupted patch's output token the
model predicts a target computed from that patch's pixels:

  mean_color  its mean colour, each channel quantised to `color_bits` bits
              (3 bits: 512 classes), the paper's choice (best few-shot);
  downsized   its `size` x `size` downsized version (4 x 4 in the paper),
              each cell's mean colour quantised as above: 16 predictions
              of 512 classes;
  pixels_l2   all of its pixel values, by L2 regression (256 x 3 values
              for a 16 x 16 patch).

The loss averages over the corrupted patches only. A "patch" is one token
of the grid: `stride` x `stride` pixels (the patch size of a plain ViT, the
stem stride times the patch size of a hybrid). Images are in [-1, 1] (the
`value_range` op). Everything here is plain jax.numpy (no TensorFlow).

`MaskedPatchViT` composes the objective's two parts, a learnt [mask] token
and a per-patch prediction head, around a `VisionTransformer`, in the same
parameter scope (`mask_token` and `masked_patch_head` beside `embedding`,
`Transformer`, ...), so the ViT holds nothing only this objective uses.
"""

import functools
from typing import Any
from typing import Optional

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

TARGETS = ("mean_color", "downsized", "pixels_l2")

# What happened to each patch embedding.
UNTOUCHED, MASKED, REPLACED, KEPT = 0, 1, 2, 3


@flax.struct.dataclass
class Corruption:
  """Per patch: its kind (above) and, for REPLACED, the patch of the same
  image whose embedding takes its place."""
  kind_BxN: jax.Array  # int32
  source_BxN: jax.Array  # int32, a patch index other than its own.

  @property
  def corrupted_BxN(self) -> jax.Array:
    """Where a prediction is made: masked, replaced and kept patches."""
    return self.kind_BxN != UNTOUCHED


def num_corrupted(num_patches: int, corrupt_rate: float) -> int:
  """Patches corrupted per image: the rate's share, at least one (Python's
  round: halves to even, e.g. 24 of 49 at 0.5)."""
  return max(1, round(corrupt_rate * num_patches))


def sample_corruption(rng, batch: int, num_patches: int,
                      corrupt_rate: float = 0.5, mask_rate: float = 0.8,
                      replace_rate: float = 0.1) -> Corruption:
  """Picks `num_corrupted` patches of each image uniformly without
  replacement; each becomes MASKED, REPLACED or KEPT with probabilities
  mask_rate, replace_rate and the rest. A REPLACED patch's source is drawn
  uniformly from the image's other patches, never itself."""
  pick_rng, kind_rng, source_rng = jax.random.split(rng, 3)
  count = num_corrupted(num_patches, corrupt_rate)
  # The `count` smallest of i.i.d. uniforms are a uniform random subset.
  noise_BxN = jax.random.uniform(pick_rng, (batch, num_patches))
  rank_BxN = jnp.argsort(jnp.argsort(noise_BxN, axis=1), axis=1)
  chosen_BxN = rank_BxN < count
  draw_BxN = jax.random.uniform(kind_rng, (batch, num_patches))
  kind_BxN = jnp.where(
      draw_BxN < mask_rate, MASKED,
      jnp.where(draw_BxN < mask_rate + replace_rate, REPLACED, KEPT))
  kind_BxN = jnp.where(chosen_BxN, kind_BxN, UNTOUCHED).astype(jnp.int32)
  # Uniform over the other N - 1 positions: draw from [0, N-1), skip self.
  own_BxN = jnp.arange(num_patches)[None, :]
  other_BxN = jax.random.randint(source_rng, (batch, num_patches), 0,
                                 max(num_patches - 1, 1))
  source_BxN = (other_BxN + (other_BxN >= own_BxN)).astype(jnp.int32)
  return Corruption(kind_BxN=kind_BxN, source_BxN=source_BxN)


def corrupt(x_BxNxD, mask_token_D, corruption: Corruption):
  """Applies `corruption` to patch embeddings (before position embeddings,
  so a replaced patch keeps its own position)."""
  other_BxNxD = jnp.take_along_axis(x_BxNxD, corruption.source_BxN[..., None],
                                    axis=1)
  kind_BxNx1 = corruption.kind_BxN[..., None]
  x_BxNxD = jnp.where(kind_BxNx1 == REPLACED, other_BxNxD, x_BxNxD)
  return jnp.where(kind_BxNx1 == MASKED, mask_token_D.astype(x_BxNxD.dtype),
                   x_BxNxD)


def patch_pixels(images_BxHxWxC, grid: tuple[int, int]):
  """B x N x s x s x C: the pixels of each token, row-major like the tokens."""
  batch, height, width, channels = images_BxHxWxC.shape
  gh, gw = grid
  sh, sw = height // gh, width // gw
  x = images_BxHxWxC.reshape(batch, gh, sh, gw, sw, channels)
  return x.transpose(0, 1, 3, 2, 4, 5).reshape(batch, gh * gw, sh, sw, channels)


def color_classes(rgb_Xx3, bits: int):
  """Colours in [-1, 1] -> one of 2^(3 bits) classes: each channel
  quantised to `bits` bits (R most significant)."""
  levels = 2**bits
  unit = (rgb_Xx3.astype(jnp.float32) + 1.0) / 2.0
  q = jnp.clip(jnp.floor(unit * levels), 0, levels - 1).astype(jnp.int32)
  return (q[..., 0] * levels + q[..., 1]) * levels + q[..., 2]


def output_width(target: str, stride: int, color_bits: int,
                 downsized_size: int) -> int:
  """Outputs of the prediction head per token."""
  classes = 2**(3 * color_bits)
  if target == "mean_color":
    return classes
  if target == "downsized":
    return downsized_size**2 * classes
  return stride * stride * 3  # pixels_l2


def patch_targets(images_BxHxWxC, grid, target: str, color_bits: int,
                  downsized_size: int):
  """Per token: mean_color int32 B x N; downsized int32 B x N x size^2;
  pixels_l2 float32 B x N x (s*s*3)."""
  pixels = patch_pixels(images_BxHxWxC.astype(jnp.float32), grid)
  batch, num, s, _, channels = pixels.shape
  if target == "mean_color":
    return color_classes(pixels.mean(axis=(2, 3)), color_bits)
  if target == "downsized":
    d = downsized_size
    cells = pixels.reshape(batch, num, d, s // d, d, s // d, channels)
    return color_classes(cells.mean(axis=(3, 5)), color_bits).reshape(
        batch, num, d * d)
  return pixels.reshape(batch, num, s * s * channels)


def per_patch_loss_and_correct(predictions_BxNxO, targets, target: str,
                               color_bits: int):
  """(loss B x N, correct B x N) for every token; callers weight them by
  `Corruption.corrupted_BxN`. `correct` is the share of right classes (for
  pixels_l2: whether the predicted pixels' mean colour has the target's
  colour class)."""
  logits = predictions_BxNxO.astype(jnp.float32)
  if target == "pixels_l2":
    loss = jnp.mean(jnp.square(logits - targets), axis=-1)
    mean_color = lambda x: x.reshape(x.shape[:2] + (-1, 3)).mean(axis=2)
    correct = (color_classes(mean_color(logits), color_bits) == color_classes(
        mean_color(targets), color_bits))
    return loss, correct.astype(jnp.float32)
  if target == "downsized":  # B x N x cells x classes, averaged over cells.
    logits = logits.reshape(targets.shape + (-1,))
  xent = -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None],
                              axis=-1)[..., 0]
  correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
  if target == "downsized":
    return xent.mean(axis=-1), correct.mean(axis=-1)
  return xent, correct


class MaskedPatchHead(nn.Module):
  """Masked patch prediction's outputs per token (fp32), with BERT's
  masked-LM head: Dense -> GELU -> LayerNorm -> Dense. The transform keeps
  the encoder's last layer from specialising to the targets; with one Dense
  the class token's few-shot accuracy swung with the learning rate
  (docs/selfsup.md)."""
  outputs: int
  gelu_approximate: bool = True
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x_BxNxD):
    dense = functools.partial(nn.Dense, dtype=self.dtype,
                              param_dtype=self.param_dtype)
    h_BxNxD = nn.gelu(
        dense(x_BxNxD.shape[-1], name="Dense_0")(x_BxNxD),
        approximate=self.gelu_approximate)
    h_BxNxD = nn.LayerNorm(dtype=self.dtype, param_dtype=self.param_dtype,
                           name="LayerNorm_0")(h_BxNxD)
    return dense(self.outputs, name="Dense_1",
                 kernel_init=nn.initializers.zeros)(h_BxNxD).astype(jnp.float32)


class MaskedPatchViT(nn.Module):
  """A ViT with masked patch prediction's [mask] token and head, sharing
  the ViT's parameter scope. Called with a `corruption` (training and the
  objective's evaluator), it corrupts the patch embeddings and puts the
  head's outputs per patch in `out["patch_predictions"]`; without one it
  is the ViT alone (feature extraction, fine-tuning's load)."""
  vit: nn.Module  # vit_jax.models.vit.VisionTransformer
  outputs: int  # The head's outputs per patch (`output_width`).

  def setup(self):
    nn.share_scope(self, self.vit)

  @nn.compact
  def __call__(self, images_BxHxWxC, *, train: bool = False,
               return_intermediates: bool = False,
               corruption: Optional[Corruption] = None):
    vit, form = self.vit, self.vit.form
    mask_token = self.param("mask_token", nn.initializers.normal(0.02),
                            (1, 1, vit.size.hidden_size),
                            jnp.dtype(form.param_dtype))
    corrupt_fn = None if corruption is None else (
        lambda x_BxNxD: corrupt(x_BxNxD, mask_token[0, 0], corruption))
    logits, out = vit(images_BxHxWxC, train=train,
                      return_intermediates=return_intermediates,
                      patch_embeddings_fn=corrupt_fn)
    out["patch_predictions"] = MaskedPatchHead(
        self.outputs, form.gelu_approximate, dtype=jnp.dtype(form.dtype),
        param_dtype=jnp.dtype(form.param_dtype), name="masked_patch_head")(
            out["patch_tokens"])
    return logits, out
