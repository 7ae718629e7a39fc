"""The Flax files of Google's code bases in this project's names:
google-research/vision_transformer's released `.npz` files (older Flax
block names), the same code run with a current Flax, and big_vision's
checkpoints (current names, a top-level `pos_embedding`, NaFlex's layout);
which of them wrote a file, by its whole set of names. They, and this
project's Orbax workdirs, are origins of `origins.ORIGINS`, registered here.
"""

import functools
import re
from typing import Optional

from vit_jax.errors import WeightsError
from vit_jax.models import scan
from vit_jax.weights import mixer_layout
from vit_jax.weights import origins
from vit_jax.weights.big_vision import towers
from vit_jax.weights.names import POSEMB
from vit_jax.weights.names import Converted
from vit_jax.weights.names import posemb_prefix

# The block module names of the two Flax generations: older Flax counted
# modules without parameters (Dropout) in auto-names, current Flax does not.
_OLD_BLOCK_NAMES = ("MultiHeadDotProductAttention_1", "LayerNorm_2",
                    "MlpBlock_3")
_NEW_BLOCK_NAMES = ("MultiHeadDotProductAttention_0", "LayerNorm_1",
                    "MlpBlock_0")
_BLOCK_MODULE = re.compile(r"Transformer/encoderblock(?:_\d+)?/([^/]+)/")


def origin(names, path: str) -> str:
  """Which Google code base wrote a Flax file, by its names:

  released               google-research/vision_transformer (older Flax
                         names: MultiHeadDotProductAttention_1, LayerNorm_2,
                         MlpBlock_3), and this project's .npz exports;
  released_current_flax  the same code run with a current Flax
                         (MultiHeadDotProductAttention_0, LayerNorm_1,
                         MlpBlock_0) and Transformer/posembed_input;
  big_vision             current-Flax block names and a top-level
                         pos_embedding (no class-token entry), or none
                         (fixed sincos2d position embeddings).
  """
  names = list(flax_names(dict.fromkeys(names), path)[0])
  modules = {m.group(1) for n in names if (m := _BLOCK_MODULE.match(n))}
  old, new = modules & set(_OLD_BLOCK_NAMES), modules & set(_NEW_BLOCK_NAMES)
  top_posemb, nested_posemb = "pos_embedding" in names, POSEMB in names
  if not modules:
    raise WeightsError(f"{path} has no ViT parameters (names like "
                       f"'Transformer/encoderblock_0/...'); it holds "
                       f"{names[:5]}{' ...' if len(names) > 5 else ''}.")
  if old and new:
    raise WeightsError(f"{path} mixes two block namings ({sorted(old)} and "
                       f"{sorted(new)}); it is not a checkpoint of one model.")
  if old and not top_posemb:
    return "released"
  if new and top_posemb and not nested_posemb:
    return "big_vision"
  if new and nested_posemb and not top_posemb:
    return "released_current_flax"
  if new and not (top_posemb or nested_posemb):
    return "big_vision"  # Fixed (sincos2d) position embeddings: none stored.
  raise WeightsError(f"{path} has position embeddings both at "
                     f"'pos_embedding' and at '{POSEMB}'; it is not a "
                     "checkpoint of one model.")


def convert(origin_name: str, fmt: str, tensors, path: str) -> Converted:
  """A Flax file of `origin_name` (`origin`) in this project's names."""
  tensors, note = flax_names(tensors, path)
  if origin_name == "big_vision":
    converted = from_big_vision(tensors, path)
  else:
    if origin_name == "released_current_flax":
      tensors = {rename_block(k): v for k, v in tensors.items()}
    converted = from_released(tensors, fmt)
    converted.origin = origin_name
  converted.notes += [note] if note else []
  return converted


def flax_names(tensors, path) -> tuple[dict, Optional[str]]:
  """A Flax file's entries without wrappers, of one tower (`towers.py`),
  and what the report should say about the tower."""
  return towers.select(strip_prefixes(tensors), path)


def strip_prefixes(tensors):
  """Drops optimizer state and the 'params/' or 'opt/target/' wrappers."""
  out = {}
  for name, value in tensors.items():
    for prefix in ("params/", "opt/target/"):
      if name.startswith(prefix):
        name = name[len(prefix):]
        break
    else:
      if name.startswith(("opt/", "opt_state/")):
        continue
    out[name] = value
  return out


def from_released(tensors, fmt="npz") -> Converted:
  """google-research/vision_transformer names (and this project's own)."""
  params = {}
  for name, value in tensors.items():
    if re.search(r"(^|/)gn[^/]*/(scale|bias)$", name) and value.ndim == 4:
      value = value.reshape(-1)  # Older files: GroupNorm params as (1,1,1,C).
    params[name] = value
  params = scan.unstack_flat(params)
  return Converted(params, posemb_prefix(params),
                   "orbax" if fmt == "orbax" else "released")


def rename_block(name: str) -> str:
  """Current-Flax block module names -> the released (older Flax) ones."""
  if name.startswith("Transformer/encoderblock"):
    for new, old in zip(_NEW_BLOCK_NAMES, _OLD_BLOCK_NAMES):
      name = name.replace(f"/{new}/", f"/{old}/")
  return name


def from_big_vision(tensors, path) -> Converted:
  """big_vision: top-level `pos_embedding` without the class token's entry,
  blocks named `MultiHeadDotProductAttention_0`, `LayerNorm_1`, `MlpBlock_0`.
  NaFlex's (SigLIP 2): the table H x W x D, the patch embedding a Dense
  (P*P*3, D) of flattened patches."""
  params, naflex = {}, False
  for name, value in scan.unstack_flat(tensors).items():
    if name == "pos_embedding":
      name = POSEMB
      if value.ndim == 3 and value.shape[0] > 1:  # NaFlex: H x W x D.
        value, naflex = value.reshape(1, -1, value.shape[-1]), True
    elif name == "embedding/kernel" and value.ndim == 2:
      # NaFlex embeds flattened patches (row, column, channel) by a Dense
      # layer: the conv kernel, reshaped.
      value, naflex = _conv_kernel(value, path), True
    elif name.startswith("Transformer/encoderblock"):
      name = rename_block(name)
    elif name.startswith("MAPHead_0/") or name in (
        "cls", "embedding/kernel", "embedding/bias") or name.startswith(
            ("head/", "pre_logits/", "Transformer/encoder_norm/")):
      pass
    else:
      raise WeightsError(f"{path}: unknown big_vision parameter {name!r}.")
    params[name] = value
  # The class token is added after the position embeddings there: its
  # position embedding is zero here, which is the same model.
  notes = [
      "NaFlex's layout: its Dense patch embedding read as the conv "
      "kernel, its H x W position table row by row"
  ] if naflex else []
  return Converted(params, 0, "big_vision", notes, sequences=naflex)


def _conv_kernel(kernel_FxD, path, channels: int = 3):
  """A Dense patch embedding (P*P*C, D) as the conv kernel (P, P, C, D)."""
  patch = int(round((kernel_FxD.shape[0] / channels)**0.5))
  if patch * patch * channels != kernel_FxD.shape[0]:
    raise WeightsError(f"{path}: a patch embedding of {kernel_FxD.shape[0]} "
                       f"inputs is not P x P x {channels} pixels.")
  return kernel_FxD.reshape(patch, patch, channels, kernel_FxD.shape[-1])


def current_flax_block(name: str) -> str:
  """The inverse of `rename_block`: a block's released (older Flax) module
  names as current Flax's (big_vision's)."""
  for new, old in zip(_NEW_BLOCK_NAMES, _OLD_BLOCK_NAMES):
    name = name.replace(f"/{old}/", f"/{new}/")
  return name


def to_big_vision(params: dict, path: str = "the model",
                  naflex: bool = False) -> dict:
  """A ViT's flat params (ours) in big_vision's names: current-Flax block
  names, the top-level `pos_embedding` of the patches alone (a class
  token's entry added to the token itself, as big_vision reads older
  files: the same model). What big_vision's ViT has no place for refuses."""
  out = {}
  posemb = params.get(POSEMB)
  for name, value in scan.unstack_flat(params).items():
    if name == POSEMB:
      continue
    if name.startswith("Transformer/encoderblock"):
      name = current_flax_block(name)
    elif not (name.startswith(
        ("MAPHead_0/", "head/", "pre_logits/", "Transformer/encoder_norm/",
         "embedding/")) or name == "cls"):
      raise WeightsError(f"big_vision's ViT has no place for {path}'s "
                         f"{name}; write it with --format=npz's released "
                         "layout instead (a model without a text tower).")
    out[name] = value
  if posemb is not None:
    if "cls" in params and posemb.shape[1] == posemb_grid_tokens(posemb) + 1:
      out["cls"] = params["cls"] + posemb[:, :1]
      posemb = posemb[:, 1:]
    out["pos_embedding"] = posemb
  if naflex:  # SigLIP 2's NaFlex layout: a Dense of flattened patches and
    # the H x W x D table.
    kernel = out["embedding/kernel"]
    out["embedding/kernel"] = kernel.reshape(-1, kernel.shape[-1])
    if posemb is not None:
      side = int(round(out["pos_embedding"].shape[1]**0.5))
      out["pos_embedding"] = out["pos_embedding"].reshape(side, side, -1)
  return out


def posemb_grid_tokens(posemb) -> int:
  """The patch entries of a table of P or 1 + P entries (P a square)."""
  count = posemb.shape[1]
  side = int(round(count**0.5))
  return count if side * side == count else count - 1


def _origin_or_mixer(names, path: str) -> str:
  """`origin`; an MLP-Mixer in the released names is `released` (big_vision's
  Mixers have the same names)."""
  return "released" if mixer_layout.is_mixer(names) else origin(names, path)


def _convert_as(origin_name: str, fmt: str, tensors, num_heads: int,
                path: str) -> Converted:
  del num_heads  # Flax files store the heads in their kernels' shapes.
  return convert(origin_name, fmt, tensors, path)


for _name, _words in (
    ("orbax", "this project (Orbax)"),
    ("released", "google-research/vision_transformer"),
    ("released_current_flax",
     "google-research/vision_transformer, current Flax names"),
    ("big_vision", "big_vision"),
):  # Both Google code bases compute tanh GELU; a workdir says its own.
  origins.register(
      _name,
      origins.Origin(_words, None if _name == "orbax" else True,
                     functools.partial(_convert_as, _name)))
origins.register_flax(origins.FlaxReader(_origin_or_mixer, flax_names))
