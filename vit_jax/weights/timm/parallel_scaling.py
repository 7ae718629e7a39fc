"""timm's ParallelScalingBlock (ViT-22B's parallel block, `vit_pwee_*`)
read in the names of timm's standard block, which `timm_names.from_timm`
then reads as config.model.parallel_block's (no norm2).
"""

import re

import numpy as np

from vit_jax.errors import WeightsError

# timm's ParallelScalingBlock's modules with a standard block's counterpart
# (its in_proj, out_proj, mlp_bias and ls are split in `as_standard_blocks`).
_PARALLEL_RENAMES = {
    "in_norm": "norm1",  # Read by both branches: our LayerNorm_0.
    "q_norm": "attn.q_norm",
    "k_norm": "attn.k_norm",
    "attn_out_proj": "attn.proj",
    "mlp_out_proj": "mlp.fc2",
}
_PARALLEL_BLOCK = re.compile(r"blocks\.(\d+)\.")


def is_parallel(names) -> bool:
  """Whether a timm state dict has ParallelScalingBlocks (a fused in_proj)."""
  return any(".in_proj." in n for n in names)


def as_standard_blocks(tensors, path) -> dict:
  """timm's ParallelScalingBlock (ViT-22B's parallel block, `vit_pwee_*`)
  in the names of timm's standard block, which `timm_names.from_timm` then
  reads as config.model.parallel_block's (no norm2):

    in_norm            norm1 (our LayerNorm_0, read by both branches)
    in_proj            split in timm's order [MLP hidden, q, k, v]: mlp.fc1
                       and attn.q/k/v, weights and (qkv_bias) biases
    mlp_bias           mlp.fc1.bias (qkv_bias=False: in_proj has no bias)
    attn_out_proj      attn.proj;  mlp_out_proj: mlp.fc2
    out_proj           (fuse_out_proj) its columns [attention, MLP] as
                       attn.proj and mlp.fc2, its bias attn.proj's
    ls.gamma           ls1.gamma and ls2.gamma: timm scales the sum of the
                       branches, gamma * (a + m) = gamma * a + gamma * m

  A missing projection bias (proj_bias=False) is zero here. A block with
  parameters of no such name (DiffParallelScalingBlock's) is refused.
  """
  out = {}
  blocks = {}  # Index -> {suffix: array} of the blocks with an in_proj.
  for name, value in tensors.items():
    m = _PARALLEL_BLOCK.match(name)
    if m:
      blocks.setdefault(int(m.group(1)), {})[name[m.end():]] = value
    else:
      out[name] = value
  for i, block in sorted(blocks.items()):
    pre = f"blocks.{i}."
    if "in_proj.weight" not in block:
      raise WeightsError(
          f"{path} mixes timm's ParallelScalingBlock (blocks.N.in_proj) "
          f"with other blocks ({pre[:-1]} has none); it is not one model.")
    fused = block.pop("in_proj.weight")
    width = fused.shape[1]
    hidden = fused.shape[0] - 3 * width
    bounds = [hidden, hidden + width, hidden + 2 * width]
    parts = ("mlp.fc1", "attn.q", "attn.k", "attn.v")
    for part, value in zip(parts, np.split(fused, bounds)):
      out[f"{pre}{part}.weight"] = value
    if "in_proj.bias" in block:
      for part, value in zip(parts, np.split(block.pop("in_proj.bias"),
                                             bounds)):
        out[f"{pre}{part}.bias"] = value
    if "mlp_bias" in block:
      out[f"{pre}mlp.fc1.bias"] = block.pop("mlp_bias")
    if "out_proj.weight" in block:  # fuse_out_proj: [attention, MLP].
      attn, mlp = np.split(block.pop("out_proj.weight"), [width], axis=1)
      out[f"{pre}attn.proj.weight"], out[f"{pre}mlp.fc2.weight"] = attn, mlp
      if "out_proj.bias" in block:
        out[f"{pre}attn.proj.bias"] = block.pop("out_proj.bias")
    if "ls.gamma" in block:
      gamma = block.pop("ls.gamma")
      out[f"{pre}ls1.gamma"], out[f"{pre}ls2.gamma"] = gamma, gamma.copy()
    for suffix in list(block):
      module, _, leaf = suffix.rpartition(".")
      if module in _PARALLEL_RENAMES:
        out[f"{pre}{_PARALLEL_RENAMES[module]}.{leaf}"] = block.pop(suffix)
    if block:
      raise WeightsError(
          f"{path}: timm's parallel block {pre[:-1]} has "
          f"{sorted(block)}, which its ParallelScalingBlock has not (e.g. "
          "DiffParallelScalingBlock's differential attention); not "
          "converted.")
    for proj in ("attn.proj", "mlp.fc2"):  # proj_bias=False: zero.
      weight = out.get(f"{pre}{proj}.weight")
      if weight is not None:
        out.setdefault(f"{pre}{proj}.bias",
                       np.zeros(weight.shape[:1], weight.dtype))
  return out
