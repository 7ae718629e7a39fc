"""The MAP head (big_vision's multihead attention pooling, `MAPHead_0`) as
timm's `AttentionPoolLatent` (`attn_pool`, its `global_pool='map'`), both
ways. The modules compute the same: a learned probe (`latent`) attends over
the tokens, then a residual MLP on the LayerNorm of the result. timm fuses
key and value into `kv` (key first); its Linear weights are (out, in).
"""

import numpy as np

_OURS = "MAPHead_0/"
_THEIRS = "attn_pool."
# (our module, timm's) of the parts that are plain Dense / LayerNorm.
_DENSE = (("MlpBlock_0/Dense_0", "mlp.fc1"), ("MlpBlock_0/Dense_1", "mlp.fc2"))


def to_timm(params: dict) -> tuple[dict, set]:
  """(timm's attn_pool arrays, the names of ours they came from) of flat
  `params`; empty where there is no MAP head."""
  if _OURS + "probe" not in params:
    return {}, set()
  p = {
      k[len(_OURS):]: np.asarray(v)
      for k, v in params.items()
      if k.startswith(_OURS)
  }
  heads_in = lambda kernel: kernel.reshape(kernel.shape[0], -1).T  # noqa: E731
  attention = "MultiHeadDotProductAttention_0/"
  out = {
      "latent": p["probe"],
      "q.weight": heads_in(p[attention + "query/kernel"]),
      "q.bias": p[attention + "query/bias"].reshape(-1),
      "kv.weight": np.concatenate([
          heads_in(p[attention + "key/kernel"]),
          heads_in(p[attention + "value/kernel"])
      ]),
      "kv.bias": np.concatenate([
          p[attention + "key/bias"].reshape(-1),
          p[attention + "value/bias"].reshape(-1)
      ]),
      "proj.weight": p[attention + "out/kernel"].reshape(
          -1, p[attention + "out/kernel"].shape[-1]).T,
      "proj.bias": p[attention + "out/bias"],
      "norm.weight": p["LayerNorm_0/scale"],
      "norm.bias": p["LayerNorm_0/bias"],
  }
  for ours, theirs in _DENSE:
    out[theirs + ".weight"] = p[ours + "/kernel"].T
    out[theirs + ".bias"] = p[ours + "/bias"]
  return ({
      _THEIRS + k: np.ascontiguousarray(v) for k, v in out.items()
  }, {_OURS + k for k in p})


def from_timm(tensors: dict, num_heads: int) -> tuple[dict, set]:
  """(our MAPHead_0 arrays, the timm names they came from); the inverse of
  `to_timm`."""
  if _THEIRS + "latent" not in tensors:
    return {}, set()
  t = {
      k[len(_THEIRS):]: np.asarray(v)
      for k, v in tensors.items()
      if k.startswith(_THEIRS)
  }
  width = t["latent"].shape[-1]
  heads_in = lambda weight: weight.T.reshape(width, num_heads, -1)  # noqa: E731
  key, value = np.split(t["kv.weight"], 2)
  key_bias, value_bias = np.split(t["kv.bias"], 2)
  out = {
      "probe": t["latent"],
      "MultiHeadDotProductAttention_0/query/kernel": heads_in(t["q.weight"]),
      "MultiHeadDotProductAttention_0/query/bias": t["q.bias"].reshape(
          num_heads, -1),
      "MultiHeadDotProductAttention_0/key/kernel": heads_in(key),
      "MultiHeadDotProductAttention_0/key/bias": key_bias.reshape(
          num_heads, -1),
      "MultiHeadDotProductAttention_0/value/kernel": heads_in(value),
      "MultiHeadDotProductAttention_0/value/bias": value_bias.reshape(
          num_heads, -1),
      "MultiHeadDotProductAttention_0/out/kernel": t["proj.weight"].T.reshape(
          num_heads, -1, width),
      "MultiHeadDotProductAttention_0/out/bias": t["proj.bias"],
      "LayerNorm_0/scale": t["norm.weight"],
      "LayerNorm_0/bias": t["norm.bias"],
  }
  for ours, theirs in _DENSE:
    out[ours + "/kernel"] = t[theirs + ".weight"].T
    out[ours + "/bias"] = t[theirs + ".bias"]
  return {_OURS + k: v for k, v in out.items()}, {_THEIRS + k for k in t}
