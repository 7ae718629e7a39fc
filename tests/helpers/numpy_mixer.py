"""An independent float64 numpy forward pass of MLP-Mixer.

Written from the paper's equations (Tolstikhin et al., 2021, eq. 1); it
never calls `vit_jax`. For a table X of N patches by C channels:

  U_{*,i} = X_{*,i} + W2 gelu(W1 LayerNorm(X)_{*,i})    for each channel i
  Y_{j,*} = U_{j,*} + W4 gelu(W3 LayerNorm(U)_{j,*})    for each patch j

that is, the token-mixing MLP acts on columns (one patch-long vector per
channel) and the channel-mixing MLP on rows. Here each is written as an
explicit loop over the vectors it mixes, not as a transpose, so the
reference does not share the model's formulation. Then LayerNorm, the
mean over patches, optional tanh pre-logits and the head. The shared pieces
(GELU forms, LayerNorm eps 1e-6, patchify) come from `numpy_reference`.

Parameters are the nested tree of the released names.
"""

import numpy as np

from tests.helpers import numpy_reference as ref


def mlp(v, p, gelu):
  """Dense -> GELU -> Dense applied to the vectors along v's last axis."""
  return ref.dense(gelu(ref.dense(v, p["Dense_0"])), p["Dense_1"])


def mixer_block(x_BxNxC, p, gelu=ref.gelu_tanh):
  """Eq. 1 of the paper for a batch of patch-by-channel tables."""
  u = np.array(x_BxNxC, np.float64)
  normed = ref.layer_norm(u, p["LayerNorm_0"])
  for i in range(u.shape[2]):  # Token mixing: one column per channel.
    u[:, :, i] += mlp(normed[:, :, i], p["token_mixing"], gelu)
  y = np.array(u)
  normed = ref.layer_norm(u, p["LayerNorm_1"])
  for j in range(u.shape[1]):  # Channel mixing: one row per patch.
    y[:, j, :] += mlp(normed[:, j, :], p["channel_mixing"], gelu)
  return y


def mixer(params, images_BxHxWxC, patch, gelu=ref.gelu_tanh):
  """Returns (logits or None, pre-logits, per-block outputs L x B x N x C)."""
  p = ref._to_float64(params)  # pylint: disable=protected-access
  kernel = p["stem"]["kernel"]  # (P, P, 3, C)
  x = ref.patchify(np.asarray(images_BxHxWxC, np.float64), patch)
  x = x @ kernel.reshape(-1, kernel.shape[-1]) + p["stem"]["bias"]
  blocks = []
  for i in range(sum(k.startswith("MixerBlock_") for k in p)):
    x = mixer_block(x, p[f"MixerBlock_{i}"], gelu)
    blocks.append(x)
  x = ref.layer_norm(x, p["pre_head_layer_norm"]).mean(axis=1)
  if "pre_logits" in p:
    x = np.tanh(ref.dense(x, p["pre_logits"]))
  logits = ref.dense(x, p["head"]) if "head" in p else None
  return logits, x, np.stack(blocks)
