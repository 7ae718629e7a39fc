"""Renaming foreign ViT weights into this project's parameter names, and back.

Every converter returns a `Converted`: flat '/'-joined names of this
project's tree (the released vision_transformer names) and the number of
prefix tokens its position embeddings carry (1 when they include the class
token's, 0 when not), which the loader needs to resize them.
"""

import dataclasses
import re

import numpy as np

from vit_jax.models import scan
from vit_jax.weights.formats import WeightsError

POSEMB = "Transformer/posembed_input/pos_embedding"
_BLOCK = "Transformer/encoderblock_{}"


def is_masked_patch_part(name: str) -> bool:
  """The [mask] token and prediction head of masked patch prediction: used
  in self-supervised pre-training only (models/masked_patch.py)."""
  return name == "mask_token" or name.startswith("masked_patch_head/")


@dataclasses.dataclass
class Converted:
  params: dict[str, np.ndarray]
  posemb_prefix_tokens: int  # Prefix tokens in the stored position embeddings.
  origin: str  # The code base that wrote it (`detect_origin`).


# The block module names of the two Flax generations: older Flax counted
# modules without parameters (Dropout) in auto-names, current Flax does not.
_OLD_BLOCK_NAMES = ("MultiHeadDotProductAttention_1", "LayerNorm_2",
                    "MlpBlock_3")
_NEW_BLOCK_NAMES = ("MultiHeadDotProductAttention_0", "LayerNorm_1",
                    "MlpBlock_0")
_BLOCK_MODULE = re.compile(r"Transformer/encoderblock(?:_\d+)?/([^/]+)/")

# What each origin computes for GELU: True is the tanh
# approximation (both Google code bases), False the exact erf. An Orbax
# workdir's form is read from its config.json (see loader.origin_gelu).
ORIGIN_GELU_APPROXIMATE = {
    "released": True,
    "released_current_flax": True,
    "big_vision": True,
    "timm": False,
    "hugging_face": False
}


def detect_origin(fmt: str, names, path: str) -> str:
  """Which code base wrote the file, decided by the whole set of names.

  released               google-research/vision_transformer (older Flax
                         names: MultiHeadDotProductAttention_1, LayerNorm_2,
                         MlpBlock_3), and this project's .npz exports;
  released_current_flax  the same code run with a current Flax
                         (MultiHeadDotProductAttention_0, LayerNorm_1,
                         MlpBlock_0) and Transformer/posembed_input;
  big_vision             current-Flax block names and a top-level
                         pos_embedding (no class-token entry);
  timm, hugging_face     PyTorch names; orbax: this project's workdirs.
  """
  if fmt == "orbax":
    return "orbax"
  if any("MixerBlock" in n for n in names):
    raise WeightsError(f"{path} is an MLP-Mixer checkpoint, not a ViT.")
  if fmt in ("safetensors", "torch"):
    if any(n.startswith(("blocks.", "patch_embed.")) for n in names):
      return "timm"
    if any(
        re.match(r"(vit\.)?(embeddings|encoder|layers)\.", n) for n in names):
      return "hugging_face"
    raise WeightsError(f"{path} holds PyTorch weights but neither timm's nor "
                       "Hugging Face's ViT names (e.g. 'blocks.0.attn.qkv."
                       "weight' or 'vit.embeddings.cls_token').")
  names = list(_strip_prefixes(dict.fromkeys(names)))
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
    raise WeightsError(f"{path} has no position embeddings; only learned "
                       "('learn') position embeddings are read.")
  raise WeightsError(f"{path} has position embeddings both at "
                     f"'pos_embedding' and at '{POSEMB}'; it is not a "
                     "checkpoint of one model.")


def convert(fmt: str, tensors: dict[str, np.ndarray], num_heads: int,
            path: str) -> Converted:
  """Picks the converter from the names in the file."""
  origin = detect_origin(fmt, list(tensors), path)
  if origin == "timm":
    return from_timm(tensors, num_heads, path)
  if origin == "hugging_face":
    return from_hugging_face(tensors, num_heads, path)
  tensors = _strip_prefixes(tensors)
  if origin == "big_vision":
    return from_big_vision(tensors, path)
  if origin == "released_current_flax":
    tensors = {_rename_block(k): v for k, v in tensors.items()}
  converted = from_released(tensors, fmt)
  converted.origin = origin
  return converted


def _strip_prefixes(tensors):
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
  prefix = 1 if "cls" in params else 0
  return Converted(params, prefix, "orbax" if fmt == "orbax" else "released")


def _rename_block(name: str) -> str:
  """Current-Flax block module names -> the released (older Flax) ones."""
  if name.startswith("Transformer/encoderblock"):
    for new, old in zip(_NEW_BLOCK_NAMES, _OLD_BLOCK_NAMES):
      name = name.replace(f"/{new}/", f"/{old}/")
  return name


def from_big_vision(tensors, path) -> Converted:
  """big_vision: top-level `pos_embedding` without the class token's entry,
  blocks named `MultiHeadDotProductAttention_0`, `LayerNorm_1`, `MlpBlock_0`."""
  params = {}
  for name, value in scan.unstack_flat(tensors).items():
    if name == "pos_embedding":
      name = POSEMB
    elif name.startswith("Transformer/encoderblock"):
      name = _rename_block(name)
    elif name.startswith("MAPHead_0/") or name in (
        "cls", "embedding/kernel", "embedding/bias") or name.startswith(
            ("head/", "pre_logits/", "Transformer/encoder_norm/")):
      pass
    else:
      raise WeightsError(f"{path}: unknown big_vision parameter {name!r}.")
    params[name] = value
  # The class token is added after the position embeddings there: its
  # position embedding is zero here, which is the same model.
  return Converted(params, 0, "big_vision")


def _dense(weight):  # torch Linear (out, in) -> flax Dense (in, out).
  return weight.T


def _heads_in(weight_out_in, num_heads):  # (D_out, D_in) -> (D_in, H, K).
  d_out, d_in = weight_out_in.shape
  return weight_out_in.T.reshape(d_in, num_heads, d_out // num_heads)


def _heads_out(weight_out_in, num_heads):  # (D_out, D_in) -> (H, K, D_out).
  d_out, d_in = weight_out_in.shape
  return weight_out_in.T.reshape(num_heads, d_in // num_heads, d_out)


def _embedding_and_head(get, params):
  params["cls"] = get("cls")
  params[POSEMB] = get("pos")
  params["embedding/kernel"] = get("patch_w").transpose(2, 3, 1, 0)
  params["embedding/bias"] = get("patch_b")


def from_timm(tensors, num_heads, path) -> Converted:
  """timm's VisionTransformer (class token, fused qkv)."""
  if "fc_norm.weight" in tensors or "reg_token" in tensors or ("cls_token"
                                                               not in tensors):
    raise WeightsError(
        f"{path}: only timm ViTs with a class token and no fc_norm or "
        "register tokens map onto this model.")
  params = _timm_resnet_stem(tensors)
  params.update({
      "cls": tensors["cls_token"],
      POSEMB: tensors["pos_embed"],
      "embedding/kernel": tensors["patch_embed.proj.weight"].transpose(
          2, 3, 1, 0),
      "embedding/bias": tensors["patch_embed.proj.bias"],
      "Transformer/encoder_norm/scale": tensors["norm.weight"],
      "Transformer/encoder_norm/bias": tensors["norm.bias"]
  })
  if "head.weight" in tensors:
    params["head/kernel"] = _dense(tensors["head.weight"])
    params["head/bias"] = tensors["head.bias"]
  num_layers = 1 + max(
      int(m.group(1))
      for n in tensors
      if (m := re.match(r"blocks\.(\d+)\.", n)))
  for i in range(num_layers):
    t = lambda name, i=i: tensors[f"blocks.{i}.{name}"]
    block = _BLOCK.format(i)
    width = t("attn.qkv.weight").shape[1]
    qkv_w = np.split(t("attn.qkv.weight"), 3)
    qkv_b = np.split(t("attn.qkv.bias"), 3)
    for name, w, b in zip(("query", "key", "value"), qkv_w, qkv_b):
      attn = f"{block}/MultiHeadDotProductAttention_1/{name}"
      params[f"{attn}/kernel"] = _heads_in(w, num_heads)
      params[f"{attn}/bias"] = b.reshape(num_heads, width // num_heads)
    out = f"{block}/MultiHeadDotProductAttention_1/out"
    params[f"{out}/kernel"] = _heads_out(t("attn.proj.weight"), num_heads)
    params[f"{out}/bias"] = t("attn.proj.bias")
    for ours, theirs in (("LayerNorm_0", "norm1"), ("LayerNorm_2", "norm2")):
      params[f"{block}/{ours}/scale"] = t(f"{theirs}.weight")
      params[f"{block}/{ours}/bias"] = t(f"{theirs}.bias")
    for ours, theirs in (("Dense_0", "fc1"), ("Dense_1", "fc2")):
      params[f"{block}/MlpBlock_3/{ours}/kernel"] = _dense(
          t(f"mlp.{theirs}.weight"))
      params[f"{block}/MlpBlock_3/{ours}/bias"] = t(f"mlp.{theirs}.bias")
  return Converted(params, 1, "timm")


_TIMM_UNIT = {
    "conv1": "conv1",
    "conv2": "conv2",
    "conv3": "conv3",
    "norm1": "gn1",
    "norm2": "gn2",
    "norm3": "gn3",
    "downsample.conv": "conv_proj",
    "downsample.norm": "gn_proj"
}


def _timm_resnet_stem(tensors) -> dict[str, np.ndarray]:
  """timm's hybrid backbone (ResNetV2, `patch_embed.backbone.*`) -> the
  released names (`conv_root`, `gn_root`, `block{s}/unit{u}/...`)."""
  params = {}
  for name, value in tensors.items():
    if not name.startswith("patch_embed.backbone."):
      continue
    rest = name[len("patch_embed.backbone."):]
    leaf = {
        "weight": "kernel" if value.ndim == 4 else "scale",
        "bias": "bias"
    }[rest.rsplit(".", 1)[1]]
    if value.ndim == 4:
      value = value.transpose(2, 3, 1, 0)
    if rest.startswith("stem."):
      module = {"conv": "conv_root", "norm": "gn_root"}[rest.split(".")[1]]
    else:
      m = re.fullmatch(r"stages\.(\d+)\.blocks\.(\d+)\.(.+)\.\w+", rest)
      if not m or m.group(3) not in _TIMM_UNIT:
        raise WeightsError(f"Unknown timm ResNetV2 parameter {name!r}.")
      module = (f"block{int(m.group(1)) + 1}/unit{int(m.group(2)) + 1}/"
                f"{_TIMM_UNIT[m.group(3)]}")
    params[f"{module}/{leaf}"] = value
  return params


# Hugging Face block names: transformers 4 (the Hub's files) and 5.
_HF_BLOCK = {
    "v4": dict(prefix="encoder.layer.{}.", query="attention.attention.query",
               key="attention.attention.key", value="attention.attention.value",
               out="attention.output.dense", fc1="intermediate.dense",
               fc2="output.dense"),
    "v5": dict(prefix="layers.{}.", query="attention.q_proj",
               key="attention.k_proj", value="attention.v_proj",
               out="attention.o_proj", fc1="mlp.fc1", fc2="mlp.fc2"),
}


def from_hugging_face(tensors, num_heads, path) -> Converted:
  """transformers' ViTModel / ViTForImageClassification (either naming)."""
  tensors = {
      (k[len("vit."):] if k.startswith("vit.") else k): v
      for k, v in tensors.items()
  }
  names = _HF_BLOCK["v4" if any(
      k.startswith("encoder.layer.") for k in tensors) else "v5"]
  params = {
      "cls": tensors["embeddings.cls_token"],
      POSEMB: tensors["embeddings.position_embeddings"],
      "embedding/kernel":
          tensors["embeddings.patch_embeddings.projection.weight"].transpose(
              2, 3, 1, 0),
      "embedding/bias": tensors["embeddings.patch_embeddings.projection.bias"],
      "Transformer/encoder_norm/scale": tensors["layernorm.weight"],
      "Transformer/encoder_norm/bias": tensors["layernorm.bias"]
  }
  if "classifier.weight" in tensors:
    params["head/kernel"] = _dense(tensors["classifier.weight"])
    params["head/bias"] = tensors["classifier.bias"]
  if "pooler.dense.weight" in tensors:  # The tanh pre-logits layer.
    params["pre_logits/kernel"] = _dense(tensors["pooler.dense.weight"])
    params["pre_logits/bias"] = tensors["pooler.dense.bias"]
  block_re = re.escape(names["prefix"]).replace(r"\{\}", r"(\d+)")
  num_layers = 1 + max(
      int(m.group(1)) for n in tensors if (m := re.match(block_re, n)))
  for i in range(num_layers):
    t = lambda name, i=i: tensors[names["prefix"].format(i) + name]
    block = _BLOCK.format(i)
    for ours in ("query", "key", "value"):
      w, b = t(names[ours] + ".weight"), t(names[ours] + ".bias")
      attn = f"{block}/MultiHeadDotProductAttention_1/{ours}"
      params[f"{attn}/kernel"] = _heads_in(w, num_heads)
      params[f"{attn}/bias"] = b.reshape(num_heads, -1)
    out = f"{block}/MultiHeadDotProductAttention_1/out"
    params[f"{out}/kernel"] = _heads_out(t(names["out"] + ".weight"), num_heads)
    params[f"{out}/bias"] = t(names["out"] + ".bias")
    for ours, theirs in (("LayerNorm_0", "layernorm_before"),
                         ("LayerNorm_2", "layernorm_after")):
      params[f"{block}/{ours}/scale"] = t(theirs + ".weight")
      params[f"{block}/{ours}/bias"] = t(theirs + ".bias")
    for ours, theirs in (("Dense_0", "fc1"), ("Dense_1", "fc2")):
      params[f"{block}/MlpBlock_3/{ours}/kernel"] = _dense(
          t(names[theirs] + ".weight"))
      params[f"{block}/MlpBlock_3/{ours}/bias"] = t(names[theirs] + ".bias")
  return Converted(params, 1, "hugging_face")


def to_timm(params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """This project's flat names -> timm's VisionTransformer state dict.

  Every parameter must find its place: a layer timm's model has no room for
  (a pre-logits layer, a hybrid stem, a MAP head) refuses the export rather
  than writing a file that loads into timm and computes other logits.
  """
  if "pre_logits/kernel" in params:
    raise WeightsError(
        "The model has a pre-logits layer (pre_logits/kernel, the tanh layer "
        "of pre-training), which timm's VisionTransformer does not have: the "
        "exported file would give other logits. Export a model without it "
        "(e.g. after fine-tuning with config.model.representation_size=None), "
        "or use --format=npz, which keeps it.")
  if "cls" not in params or any(
      k.startswith(("conv_root", "MAPHead_0")) for k in params):
    raise WeightsError("Only plain ViTs with a class token (no hybrid stem, "
                       "no MAP head) map onto timm's names; use --format=npz.")
  used = set()

  def p(name):
    used.add(name)
    return np.ascontiguousarray(params[name])

  out = {
      "cls_token": p("cls"),
      "pos_embed": p(POSEMB),
      "patch_embed.proj.weight": np.ascontiguousarray(
          p("embedding/kernel").transpose(3, 2, 0, 1)),
      "patch_embed.proj.bias": p("embedding/bias"),
      "norm.weight": p("Transformer/encoder_norm/scale"),
      "norm.bias": p("Transformer/encoder_norm/bias")
  }
  if "head/kernel" in params:
    out["head.weight"] = np.ascontiguousarray(p("head/kernel").T)
    out["head.bias"] = p("head/bias")
  i = 0
  while f"{_BLOCK.format(i)}/LayerNorm_0/scale" in params:
    block, attn = _BLOCK.format(
        i), f"{_BLOCK.format(i)}/MultiHeadDotProductAttention_1"
    width = params[f"{attn}/query/kernel"].shape[0]
    out[f"blocks.{i}.attn.qkv.weight"] = np.concatenate([
        p(f"{attn}/{n}/kernel").reshape(width, -1).T
        for n in ("query", "key", "value")
    ])
    out[f"blocks.{i}.attn.qkv.bias"] = np.concatenate(
        [p(f"{attn}/{n}/bias").reshape(-1) for n in ("query", "key", "value")])
    out[f"blocks.{i}.attn.proj.weight"] = np.ascontiguousarray(
        p(f"{attn}/out/kernel").reshape(-1, width).T)
    out[f"blocks.{i}.attn.proj.bias"] = p(f"{attn}/out/bias")
    for ours, theirs in (("LayerNorm_0", "norm1"), ("LayerNorm_2", "norm2")):
      out[f"blocks.{i}.{theirs}.weight"] = p(f"{block}/{ours}/scale")
      out[f"blocks.{i}.{theirs}.bias"] = p(f"{block}/{ours}/bias")
    for ours, theirs in (("Dense_0", "fc1"), ("Dense_1", "fc2")):
      out[f"blocks.{i}.mlp.{theirs}.weight"] = np.ascontiguousarray(
          p(f"{block}/MlpBlock_3/{ours}/kernel").T)
      out[f"blocks.{i}.mlp.{theirs}.bias"] = p(
          f"{block}/MlpBlock_3/{ours}/bias")
    i += 1
  left = sorted(set(params) - used)
  if left:
    raise WeightsError(f"timm's VisionTransformer has no place for {left}; "
                       "nothing was written. Use --format=npz, which keeps "
                       "every parameter.")
  # safetensors writes the raw buffer: every array must be C-ordered.
  return {k: np.ascontiguousarray(v) for k, v in out.items()}
