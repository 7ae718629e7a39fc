"""Multi-head dot-product attention with an fp32 softmax, computed the way
that suits the device: explicit einsums, or `jax.nn.dot_product_attention`
(XLA's, or cuDNN's fused kernel on GPUs). Parameter names follow the
released checkpoints (`query`, `key`, `value`, `out`).
"""

import functools

import flax.linen as nn
from flax.linen import fp8_ops
import jax
import jax.numpy as jnp

from vit_jax.config.model_form import ModelForm
from vit_jax.models import partitioning as lx
from vit_jax.models import rope as rotary


def _fused_kernel_applies(dtype, head_dim: int) -> bool:
  """cuDNN's fused (flash) attention: NVIDIA GPUs, half precision, head
  widths up to 128 in multiples of 8."""
  return (jax.default_backend() == "gpu" and
          jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) and
          head_dim <= 128 and head_dim % 8 == 0)


# cuDNN's fused attention refuses to train on odd token counts (ViT-B/16 at
# 224 px has 197); padding further gained nothing (docs/speed.md).
_CUDNN_LENGTH_MULTIPLE = 2


def fused_attention(q_BxNxHxK, k_BxNxHxK, v_BxNxHxK, implementation: str,
                    length_multiple: int = 1, mask=None):
  """`jax.nn.dot_product_attention` of already-scaled queries, the tokens
  padded to a multiple of `length_multiple` and the padding masked out;
  `mask` (B x 1 x N x N, True: attend) as well where given."""
  batch, tokens = q_BxNxHxK.shape[:2]
  padded = -(-tokens // length_multiple) * length_multiple
  if padded == tokens:
    return jax.nn.dot_product_attention(q_BxNxHxK, k_BxNxHxK, v_BxNxHxK,
                                        mask=mask, scale=1.0,
                                        implementation=implementation)
  pad = lambda t: jnp.pad(t, ((0, 0), (0, padded - tokens), (0, 0), (0, 0)))
  if mask is not None:
    extra = padded - tokens
    mask = jnp.pad(mask, ((0, 0), (0, 0), (0, extra), (0, extra)))
  lengths = jnp.full((batch,), tokens, jnp.int32)
  y = jax.nn.dot_product_attention(
      pad(q_BxNxHxK), pad(k_BxNxHxK), pad(v_BxNxHxK), mask=mask, scale=1.0,
      query_seq_lengths=lengths, key_value_seq_lengths=lengths,
      implementation=implementation)
  return y[:, :tokens]


# The variable collection of the FP8 matmuls' scaling state.
FP8_STATE = fp8_ops.OVERWRITE_WITH_GRADIENT


def over_tokens(layer, x, feature_axes: int = 1):
  """`layer`, a Dense over the last `feature_axes` axes, applied to every
  token of `x` as one 2-D matmul (the leading axes flattened, then
  restored). The same numbers; but the backward pass of a matmul over 3-D
  activations contracts two axes for the weight gradient, for which XLA's
  CPU backend copies the activations into a transposed layout (half again
  as slow a ViT MLP's backward on 2 cores), where a 2-D one reads them as
  they lie."""
  lead = x.shape[:x.ndim - feature_axes]
  y = layer(x.reshape((-1,) + x.shape[x.ndim - feature_axes:]))
  return y.reshape(lead + y.shape[1:])


def fp8_matmuls(fp8: bool, deterministic: bool):
  """Flax's FP8 matmul (e4m3 inputs and kernels, e5m2 gradients, delayed
  scaling from an amax history kept in the `_overwrite_with_gradient`
  collection) where FP8 training is on; None (the dtype's) otherwise and
  in evaluation, which computes from the same parameters without it."""
  return fp8_ops.Fp8DirectDotGeneralOp if fp8 and not deterministic else None


class MultiHeadDotProductAttention(nn.Module):
  """Multi-head attention with an fp32 softmax.

  Returns (output, weights B x H x M x N, or None unless `need_weights`).
  Where the weights are needed (intermediates, attention dropout in
  training) they are computed explicitly. Otherwise `form.attention` says
  how: `explicit` the same einsums; `xla` or `cudnn` through
  `jax.nn.dot_product_attention` (cudnn: one fused kernel that never
  stores the weights); `auto` takes cudnn where it applies (GPUs in
  bf16/fp16) and the explicit form elsewhere (CPU, TPU, fp32), where it
  is what XLA fuses best.

  The form's options it reads: FP8 projections in training (`fp8`,
  `fp8_matmuls`), the query/key/value biases (`qkv_bias`, `key_bias`;
  none without `use_bias`, which also drops the output projection's), a
  LayerNorm over each head's queries and keys (`qk_norm`: `query_ln`,
  `key_ln`), a LayerNorm over all heads' outputs before `out`
  (`attention_norm`: `heads_ln`), the attention dropout, dtypes. `rope`
  rotates the queries and keys of the tokens after the form's prefix
  tokens (RoPE, `models/rope.py`), after their LayerNorms: (sin, cos)
  B x N x K tables, or the patches' positions B x N x 2: with
  `rope="mixed"`, turned by this block's learned `rope_frequencies`; in
  training with `rope_augment_per="block"`, moved by this block's own
  draw of DINOv3's augmentations first.

  `mask` (B x 1 x M x N, True where a query may attend to a key; patch
  sequences' images and padding) masks every form alike; no row may be
  all False.
  """
  num_heads: int
  form: ModelForm

  @nn.compact
  def __call__(self, q_BxMxD, kv_BxNxD, deterministic: bool,
               need_weights: bool = False, mask=None, rope=None):
    width = kv_BxNxD.shape[-1]
    if width % self.num_heads:  # The variant table never has this.
      raise ValueError(f"hidden_size {width} is not divisible by num_heads "
                       f"{self.num_heads}.")
    head_dim = width // self.num_heads
    form = self.form
    dtype, param_dtype = jnp.dtype(form.dtype), jnp.dtype(form.param_dtype)
    dot_general_cls = fp8_matmuls(form.fp8, deterministic)
    biased = form.use_bias and form.qkv_bias
    proj = functools.partial(nn.DenseGeneral, (self.num_heads, head_dim),
                             dtype=dtype, param_dtype=param_dtype,
                             kernel_init=nn.initializers.xavier_uniform(),
                             use_bias=biased, dot_general_cls=dot_general_cls)
    q_BxMxHxK = over_tokens(proj(name="query"), q_BxMxD)
    k_BxNxHxK = over_tokens(proj(name="key", use_bias=biased and form.key_bias),
                            kv_BxNxD)
    v_BxNxHxK = over_tokens(proj(name="value"), kv_BxNxD)
    if form.qk_norm:  # Over each head's features, before the scaling.
      norm = functools.partial(nn.LayerNorm, form.layer_norm_eps, dtype=dtype,
                               param_dtype=param_dtype, use_bias=form.use_bias)
      q_BxMxHxK = norm(name="query_ln")(q_BxMxHxK)
      k_BxNxHxK = norm(name="key_ln")(k_BxNxHxK)
    if rope is not None:
      if rotary.drawn_per_block(form, not deterministic):  # DINOv3's draw.
        rope = rotary.augmented(form, rope, self.make_rng("dropout"))
        if form.rope != "mixed":
          rope = rotary.sin_cos(form, rope, head_dim)
      if form.rope == "mixed":
        frequencies = self.param(
            "rope_frequencies",
            rotary.init_mixed_frequencies(form.rope_temperature),
            (2, self.num_heads, head_dim // 2), param_dtype)
        rope = rotary.mixed_sin_cos(rope, frequencies, form.rope_layout)
      prefix = form.num_prefix_tokens
      q_BxMxHxK = rotary.rotate(q_BxMxHxK, *rope, prefix, form.rope_layout)
      k_BxNxHxK = rotary.rotate(k_BxNxHxK, *rope, prefix, form.rope_layout)
    q_BxMxHxK = q_BxMxHxK / jnp.sqrt(head_dim).astype(dtype)
    q_BxMxHxK, k_BxNxHxK, v_BxNxHxK = (nn.with_logical_constraint(
        t, lx.QKV_AXES) for t in (q_BxMxHxK, k_BxNxHxK, v_BxNxHxK))

    implementation, dropout_rate = form.attention, form.attention_dropout_rate
    if implementation == "auto":
      implementation = ("cudnn" if _fused_kernel_applies(dtype, head_dim) else
                        "explicit")
    weights_BxHxMxN = None
    if (need_weights or implementation == "explicit" or
        (dropout_rate and not deterministic)):
      logits_BxHxMxN = jnp.einsum("bmhk,bnhk->bhmn", q_BxMxHxK,
                                  k_BxNxHxK).astype(jnp.float32)
      if mask is not None:
        logits_BxHxMxN = jnp.where(mask, logits_BxHxMxN,
                                   jnp.finfo(jnp.float32).min)
      weights_BxHxMxN = jax.nn.softmax(logits_BxHxMxN)
      dropped = nn.Dropout(dropout_rate)(weights_BxHxMxN, deterministic)
      y_BxMxHxK = jnp.einsum("bhmn,bnhk->bmhk", dropped.astype(dtype),
                             v_BxNxHxK)
    else:
      y_BxMxHxK = fused_attention(
          q_BxMxHxK, k_BxNxHxK, v_BxNxHxK, implementation,
          _CUDNN_LENGTH_MULTIPLE if implementation == "cudnn" else 1, mask)
    if form.attention_norm:
      y_BxMxHxK = nn.LayerNorm(form.layer_norm_eps, dtype=dtype,
                               param_dtype=param_dtype, reduction_axes=(-2, -1),
                               feature_axes=(-2, -1),
                               name="heads_ln")(y_BxMxHxK)
    out_BxMxD = over_tokens(
        nn.DenseGeneral(width, axis=(-2, -1), dtype=dtype,
                        param_dtype=param_dtype,
                        kernel_init=nn.initializers.xavier_uniform(),
                        use_bias=form.use_bias, dot_general_cls=dot_general_cls,
                        name="out"), y_BxMxHxK, feature_axes=2)
    return out_BxMxD, weights_BxHxMxN
