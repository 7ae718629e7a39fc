"""An independent float64 numpy forward pass of ViT and the hybrid stem.

Written from the paper's equations (1)-(4) and the published formulas of
the code that trained the released weights; it never calls `vit_jax`, so
comparing with it checks the model rather than restating it:

  GELU (tanh)      0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  GELU (erf)       0.5 x (1 + erf(x / sqrt(2)))   (timm, Hugging Face)
  LayerNorm        eps 1e-6, biased variance
  StdConv kernel   (w - mean) / (std + 1e-5) per output channel, biased std
  GroupNorm        32 groups, eps 1e-6
  convolutions     'SAME' padding as XLA pads (extra pixel at the end)
  sincos2d         MoCo v3's fixed position embeddings (Chen et al. 2021):
                   per token at column x and row y, D/4 channels each of
                   sin(x w), cos(x w), sin(y w), cos(y w) with
                   w_k = 10000^(-k / (D/4 - 1)); added to the patches only
  MAP head         a learned probe attends over the patch tokens (one query),
                   then probe + MLP(LN(probe)) (Lee et al. 2019; big_vision)

Parameters are the nested tree of the released names.
"""

import numpy as np
from scipy import special


def gelu_tanh(x):
  return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def gelu_erf(x):
  return 0.5 * x * (1.0 + special.erf(x / np.sqrt(2.0)))


def layer_norm(x, p, eps=1e-6):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean)**2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def dense(x, p):
  return x @ p["kernel"] + p["bias"]


def softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def attention(x_BxNxD, p):
  """MSA with q/k/v kernels (D, H, K) and the out kernel (H, K, D)."""
  proj = lambda name: (np.einsum("bnd,dhk->bnhk", x_BxNxD, p[name]["kernel"]) +
                       p[name]["bias"])
  q, k, v = proj("query"), proj("key"), proj("value")
  weights = softmax(np.einsum("bmhk,bnhk->bhmn", q, k) / np.sqrt(q.shape[-1]))
  y = np.einsum("bhmn,bnhk->bmhk", weights, v)
  return np.einsum("bmhk,hkd->bmd", y, p["out"]["kernel"]) + p["out"]["bias"]


def patchify(images_BxHxWxC, patch):
  """(B, H, W, C) -> (B, N, P*P*C): patches row-major, pixels (row, col,
  channel)."""
  b, h, w, c = images_BxHxWxC.shape
  x = images_BxHxWxC.reshape(b, h // patch, patch, w // patch, patch, c)
  return x.transpose(0, 1, 3, 2, 4, 5).reshape(b, (h // patch) * (w // patch),
                                               patch * patch * c)


# ------------------------------------------------------------ hybrid stem --


def standardize(kernel_HxWxIxO, eps=1e-5):
  w = kernel_HxWxIxO - kernel_HxWxIxO.mean(axis=(0, 1, 2))
  return w / (w.std(axis=(0, 1, 2)) + eps)


def _same_pads(size, kernel, stride):
  out = -(-size // stride)
  total = max((out - 1) * stride + kernel - size, 0)
  return total // 2, total - total // 2


def conv(x_BxHxWxI, kernel_KxKxIxO, stride):
  """Cross-correlation with 'SAME' padding, by summing over kernel taps."""
  kh, kw, _, out_channels = kernel_KxKxIxO.shape
  b, h, w, _ = x_BxHxWxI.shape
  (top, bottom), (left, right) = (_same_pads(h, kh,
                                             stride), _same_pads(w, kw, stride))
  x = np.pad(x_BxHxWxI, ((0, 0), (top, bottom), (left, right), (0, 0)))
  out_h, out_w = -(-h // stride), -(-w // stride)
  y = np.zeros((b, out_h, out_w, out_channels))
  for i in range(kh):
    for j in range(kw):
      window = x[:, i:i + stride * out_h:stride, j:j + stride * out_w:stride]
      y += window @ kernel_KxKxIxO[i, j]
  return y


def group_norm(x_BxHxWxC, p, groups=32, eps=1e-6):
  b, h, w, c = x_BxHxWxC.shape
  g = x_BxHxWxC.reshape(b, h, w, groups, c // groups)
  mean = g.mean(axis=(1, 2, 4), keepdims=True)
  var = ((g - mean)**2).mean(axis=(1, 2, 4), keepdims=True)
  g = (g - mean) / np.sqrt(var + eps)
  return g.reshape(b, h, w, c) * p["scale"] + p["bias"]


def max_pool_3x3_s2(x_BxHxWxC):
  b, h, w, c = x_BxHxWxC.shape
  (top, bottom), (left, right) = _same_pads(h, 3, 2), _same_pads(w, 3, 2)
  x = np.pad(x_BxHxWxC, ((0, 0), (top, bottom), (left, right), (0, 0)),
             constant_values=-np.inf)
  out_h, out_w = -(-h // 2), -(-w // 2)
  return np.max([
      x[:, i:i + 2 * out_h:2, j:j + 2 * out_w:2]
      for i in range(3)
      for j in range(3)
  ], axis=0)


def residual_unit(x, p, stride, standardize_fn):
  std_conv = lambda name, inp, s=1: conv(inp, standardize_fn(p[name]["kernel"]),
                                         s)
  relu = lambda v: np.maximum(v, 0)
  residual = x
  if "conv_proj" in p:
    residual = group_norm(std_conv("conv_proj", x, stride), p["gn_proj"])
  y = relu(group_norm(std_conv("conv1", x), p["gn1"]))
  y = relu(group_norm(std_conv("conv2", y, stride), p["gn2"]))
  y = group_norm(std_conv("conv3", y), p["gn3"])
  return relu(residual + y)


def resnet_stem(x, p, standardize_fn=standardize):
  """Root conv (stride 2), GroupNorm, ReLU, 3x3 max-pool, then the stages."""
  x = conv(x, standardize_fn(p["conv_root"]["kernel"]), 2)
  x = max_pool_3x3_s2(np.maximum(group_norm(x, p["gn_root"]), 0))
  stage = 1
  while f"block{stage}" in p:
    units = p[f"block{stage}"]
    for u in range(1, len(units) + 1):
      stride = 2 if stage > 1 and u == 1 else 1
      x = residual_unit(x, units[f"unit{u}"], stride, standardize_fn)
    stage += 1
  return x


# -------------------------------------------------------------------- ViT --


def sincos2d(grid_h, grid_w, width, temperature=10_000.0):
  """(H*W, D), tokens row by row."""
  quarter = width // 4
  omega = temperature**(-np.arange(quarter) / (quarter - 1))
  rows, cols = np.divmod(np.arange(grid_h * grid_w), grid_w)
  return np.concatenate([
      np.sin(np.outer(cols, omega)),
      np.cos(np.outer(cols, omega)),
      np.sin(np.outer(rows, omega)),
      np.cos(np.outer(rows, omega))
  ], axis=1)


def mlp_block(x, p, gelu):
  return dense(gelu(dense(x, p["Dense_0"])), p["Dense_1"])


def map_head(x_BxNxD, p, gelu=gelu_tanh):
  """Multihead attention pooling: B x D."""
  probe = np.broadcast_to(p["probe"], (x_BxNxD.shape[0], 1, x_BxNxD.shape[-1]))
  mha = p["MultiHeadDotProductAttention_0"]
  proj = lambda inp, name: (np.einsum("bnd,dhk->bnhk", inp, mha[name]["kernel"])
                            + mha[name]["bias"])
  q, k, v = proj(probe, "query"), proj(x_BxNxD, "key"), proj(x_BxNxD, "value")
  weights = softmax(np.einsum("bmhk,bnhk->bhmn", q, k) / np.sqrt(q.shape[-1]))
  y = np.einsum("bhmn,bnhk->bmhk", weights, v)
  y = np.einsum("bmhk,hkd->bmd", y, mha["out"]["kernel"]) + mha["out"]["bias"]
  y = y + mlp_block(layer_norm(y, p["LayerNorm_0"]), p["MlpBlock_0"], gelu)
  return y[:, 0]


def vit(params, images_BxHxWxC, patch, classifier="token", gelu=gelu_tanh,
        standardize_fn=standardize, class_token=None, posemb="learn"):
  """Returns (logits, pre-logits) of ViT or the hybrid (if `conv_root`).

  `class_token` None: with one exactly for the token classifier; gap pools
  the patch tokens, map every token (timm's attn_pool does). `posemb`:
  learn (the stored table covers the class token too) or sincos2d (the
  patches only).
  """
  p = _to_float64(params)
  x = np.asarray(images_BxHxWxC, np.float64)
  if "conv_root" in p:
    x = resnet_stem(x, p, standardize_fn)
  kernel = p["embedding"]["kernel"]  # (P, P, C, D)
  grid = (x.shape[1] // patch, x.shape[2] // patch)
  x = patchify(x, patch) @ kernel.reshape(-1, kernel.shape[-1])
  x = x + p["embedding"]["bias"]
  if posemb == "sincos2d":
    x = x + sincos2d(*grid, x.shape[-1])
  prefix = int(classifier == "token" if class_token is None else class_token)
  if prefix:
    cls = np.broadcast_to(p["cls"], (x.shape[0], 1, x.shape[-1]))
    x = np.concatenate([cls, x], axis=1)
  enc = p["Transformer"]
  if posemb == "learn":
    x = x + enc["posembed_input"]["pos_embedding"]
  for i in range(sum(k.startswith("encoderblock_") for k in enc)):
    block = enc[f"encoderblock_{i}"]
    x = x + attention(layer_norm(x, block["LayerNorm_0"]),
                      block["MultiHeadDotProductAttention_1"])
    x = x + mlp_block(layer_norm(x, block["LayerNorm_2"]), block["MlpBlock_3"],
                      gelu)
  x = layer_norm(x, enc["encoder_norm"])
  if classifier == "token":
    x = x[:, 0]
  elif classifier == "map":
    x = map_head(x, p["MAPHead_0"], gelu)
  else:
    x = x[:, prefix:].mean(axis=1)
  if "pre_logits" in p:
    x = np.tanh(dense(x, p["pre_logits"]))
  if "head" not in p:
    return x, x
  return dense(x, p["head"]), x


def _to_float64(tree):
  if isinstance(tree, dict):
    return {k: _to_float64(v) for k, v in tree.items()}
  return np.asarray(tree, np.float64)


# ------------------------------------------------------ trained-like weights --


def trained_like_params(shapes, seed: int = 0, conv_std=(0.01, 0.05)):
  """Random parameters at the scales trained weights have.

  Dense and attention kernels: std 1/sqrt(fan-in) (0.036 at width 768, as
  in trained B/16), so pre-activations are O(1) and the GELU forms differ
  visibly; conv kernels of the stem: a std drawn per layer from `conv_std`
  (trained stems' range), which standardisation then undoes only if its
  epsilon is placed as in the released code; LayerNorm and GroupNorm scales
  1 + noise; biases, tokens and position embeddings O(0.1-1).
  `shapes`: a nested dict of arrays or ShapeDtypeStructs.
  """
  rng = np.random.default_rng(seed)

  def fill(path, shape):
    name = path[-1]
    if name == "scale":
      return 1.0 + 0.2 * rng.normal(size=shape)
    if name == "kernel" and len(shape) == 4 and path[0] != "embedding":
      return rng.uniform(*conv_std) * rng.normal(size=shape)
    if name == "kernel":  # q/k/v kernels are (D, H, K): D inputs.
      fan_in = (shape[0] if path[-2] in ("query", "key",
                                         "value") else int(np.prod(shape[:-1])))
      return rng.normal(size=shape) / np.sqrt(fan_in)
    return 0.3 * rng.normal(size=shape)

  def walk(tree, path):
    if isinstance(tree, dict):
      return {k: walk(v, path + (k,)) for k, v in tree.items()}
    return fill(path, tuple(tree.shape)).astype(np.float32)

  return walk(shapes, ())


# ------------------------------------------------------- patch sequences --
#
# NaFlex / NaViT: each image of a sequence is cut out of it and run alone
# (no mask: its tokens are all it sees), its learned position embeddings
# the stored grid resized to its own grid. The resize is written as PIL
# defines its antialiased filters (Resample.c): output pixel i of n reads
# the input around centre (i + 0.5) * S / n, its kernel widened by
# max(S / n, 1), weights renormalised over the taps inside the table.


def keys_cubic(t, a=-0.5):
  t = np.abs(t)
  return np.where(t < 1, ((a + 2) * t - (a + 3)) * t * t + 1,
                  np.where(t < 2, ((t - 5) * t + 8) * t * a - 4 * a, 0.0))


def antialiased_matrix(stored: int, size: int, method: str,
                       antialias: bool = True):
  """(size, stored): out = M @ table along one axis."""
  scale = stored / size
  support = max(scale, 1.0) if antialias else 1.0
  matrix = np.zeros((size, stored))
  for i in range(size):
    centre = (i + 0.5) * scale
    for j in range(stored):
      t = abs(j + 0.5 - centre) / support
      matrix[i, j] = (max(0.0, 1 -
                          t) if method == "bilinear" else float(keys_cubic(t)))
    matrix[i] /= matrix[i].sum()
  return matrix


def _image_posemb(p, enc, grid, width, posemb, interpolation):
  """(h*w, D) position embeddings of one image's grid."""
  h, w = grid
  if posemb == "sincos2d":
    return sincos2d(h, w, width)
  if posemb == "factorized":
    table_y = enc["posembed_input"]["pos_embedding_y"][0]
    table_x = enc["posembed_input"]["pos_embedding_x"][0]
    rows = antialiased_matrix(len(table_y), h, "bilinear", False) @ table_y
    cols = antialiased_matrix(len(table_x), w, "bilinear", False) @ table_x
    return (rows[:, None] + cols[None]).reshape(h * w, width)
  table = enc["posembed_input"]["pos_embedding"][0]
  side = int(round(np.sqrt(len(table))))
  table = table[len(table) - side * side:].reshape(side, side, width)
  rows = antialiased_matrix(side, h, interpolation)
  cols = antialiased_matrix(side, w, interpolation)
  return np.einsum("ia,jb,abd->ijd", rows, cols, table).reshape(h * w, width)


def vit_sequence(params, patches_BxNxF, coords_BxNx2, segments_BxN, grids_BxKx2,
                 classifier="map", gelu=gelu_tanh, posemb="learn",
                 interpolation="bilinear", class_token=False):
  """Logits of each image of each sequence (B x K x classes; NaN where a
  slot holds no image). Patches are row-major within their image."""
  p = _to_float64(params)
  enc = p["Transformer"]
  kernel = p["embedding"]["kernel"]
  width = kernel.shape[-1]
  batch, slots = grids_BxKx2.shape[:2]
  out = np.full((batch, slots, p["head"]["kernel"].shape[-1]), np.nan)
  for b in range(batch):
    for k in range(slots):
      where = np.flatnonzero(segments_BxN[b] == k + 1)
      if not where.size:
        continue
      grid = tuple(grids_BxKx2[b, k])
      order = coords_BxNx2[b, where, 0] * grid[1] + coords_BxNx2[b, where, 1]
      x = np.asarray(patches_BxNxF[b, where], np.float64) @ kernel.reshape(
          -1, width) + p["embedding"]["bias"]
      x = x + _image_posemb(p, enc, grid, width, posemb, interpolation)[order]
      if class_token:
        posemb_cls = (enc["posembed_input"]["pos_embedding"][0, :1]
                      if posemb == "learn" else 0.0)
        x = np.concatenate([p["cls"][0] + posemb_cls, x])
      x = x[None]
      for i in range(sum(n.startswith("encoderblock_") for n in enc)):
        block = enc[f"encoderblock_{i}"]
        x = x + attention(layer_norm(x, block["LayerNorm_0"]),
                          block["MultiHeadDotProductAttention_1"])
        x = x + mlp_block(layer_norm(x, block["LayerNorm_2"]),
                          block["MlpBlock_3"], gelu)
      x = layer_norm(x, enc["encoder_norm"])
      if classifier == "token":
        pooled = x[:, 0]
      elif classifier == "map":
        pooled = map_head(x, p["MAPHead_0"], gelu)
      else:
        pooled = x[:, int(class_token):].mean(axis=1)
      out[b, k] = dense(pooled, p["head"])[0]
  return out
