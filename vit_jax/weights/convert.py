"""Renaming foreign ViT weights into this project's parameter names, and back.

Every converter returns a `Converted`: flat '/'-joined names of this
project's tree (the released vision_transformer names) and the number of
prefix tokens its position embeddings carry (1 when they include the class
token's, 0 when not), which the loader needs to resize them. The names of
timm and Hugging Face are one table, `_MODULES`, read both ways.
"""

import dataclasses
import re
from typing import NamedTuple
from typing import Optional

import numpy as np

from vit_jax.errors import WeightsError
from vit_jax.models import scan
from vit_jax.weights import families
from vit_jax.weights import hf_dinov2
from vit_jax.weights import mixer_layout
from vit_jax.weights import timm_attention_pool
from vit_jax.weights import timm_naflex
from vit_jax.weights import timm_parallel
from vit_jax.weights import timm_resnet
from vit_jax.weights import towers

POSEMB = "Transformer/posembed_input/pos_embedding"


def is_masked_patch_part(name: str) -> bool:
  """The [mask] token and prediction head of masked patch prediction: used
  in self-supervised pre-training only (models/masked_patch.py)."""
  return name == "mask_token" or name.startswith("masked_patch_head/")


@dataclasses.dataclass
class Converted:
  params: dict[str, np.ndarray]
  posemb_prefix_tokens: int  # Prefix tokens in the stored position embeddings.
  origin: str  # The code base that wrote it (`detect_origin`).
  notes: list[str] = dataclasses.field(default_factory=list)  # For the report.
  # Trained on images at their own shape (NaFlex's layout): run so by
  # default (config.sequence_length).
  sequences: bool = False
  # config.model options the file's layout says (timm's NaFlexViT).
  options: dict = dataclasses.field(default_factory=dict)


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
# How reports name each origin.
ORIGIN_WORDS = {
    "orbax": "this project (Orbax)",
    "released": "google-research/vision_transformer",
    "released_current_flax": ("google-research/vision_transformer, current "
                              "Flax names"),
    "hugging_face": "Hugging Face transformers",
}


def origin_words(origin: str) -> str:
  return ORIGIN_WORDS.get(origin, origin)


def detect_origin(fmt: str, names, path: str) -> str:
  """Which code base wrote the file, decided by the whole set of names.

  released               google-research/vision_transformer (older Flax
                         names: MultiHeadDotProductAttention_1, LayerNorm_2,
                         MlpBlock_3), and this project's .npz exports; also
                         MLP-Mixers (MixerBlock_i), released or big_vision's;
  released_current_flax  the same code run with a current Flax
                         (MultiHeadDotProductAttention_0, LayerNorm_1,
                         MlpBlock_0) and Transformer/posembed_input;
  big_vision             current-Flax block names and a top-level
                         pos_embedding (no class-token entry), or none
                         (fixed sincos2d position embeddings);
  timm, hugging_face     PyTorch names; orbax: this project's workdirs.
  """
  if fmt == "orbax":
    return "orbax"
  if mixer_layout.is_mixer(names):  # big_vision's names are the released.
    return "timm" if fmt in ("safetensors", "torch") else "released"
  if fmt in ("safetensors", "torch"):
    if any(n.startswith(("blocks.", "patch_embed.")) for n in names):
      return "timm"
    if any(
        re.match(r"(vit\.)?(embeddings|encoder|layers)\.", n) for n in names):
      return "hugging_face"
    raise WeightsError(f"{path} holds PyTorch weights but neither timm's nor "
                       "Hugging Face's ViT names (e.g. 'blocks.0.attn.qkv."
                       "weight' or 'vit.embeddings.cls_token').")
  names = list(_flax_names(dict.fromkeys(names), path)[0])
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


def convert(fmt: str, tensors: dict[str, np.ndarray], num_heads: int,
            path: str) -> Converted:
  """Picks the converter from the names in the file."""
  origin = detect_origin(fmt, list(tensors), path)
  if origin == "timm" and mixer_layout.is_mixer(tensors):
    return Converted(mixer_layout.from_timm_mixer(tensors), 0, "timm")
  if origin == "timm":
    return from_timm(tensors, num_heads, path)
  if origin == "hugging_face":
    return from_hugging_face(tensors, num_heads, path)
  tensors, note = _flax_names(tensors, path)
  if origin == "big_vision":
    converted = from_big_vision(tensors, path)
  else:
    if origin == "released_current_flax":
      tensors = {_rename_block(k): v for k, v in tensors.items()}
    converted = from_released(tensors, fmt)
    converted.origin = origin
  converted.notes += [note] if note else []
  return converted


def _flax_names(tensors, path) -> tuple[dict, Optional[str]]:
  """A Flax file's entries without wrappers, of one tower (`towers.py`),
  and what the report should say about the tower."""
  return towers.select(_strip_prefixes(tensors), path)


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
  return Converted(params, posemb_prefix(params),
                   "orbax" if fmt == "orbax" else "released")


def _rename_block(name: str) -> str:
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


class _Module(NamedTuple):
  """A module of parameters: our name, its kind (`_ARRAYS`), and its name
  in each PyTorch naming (None: none there). `{}` stands for a block's
  index."""
  ours: str
  kind: str
  timm: Optional[str]
  transformers_4: Optional[str]
  transformers_5: Optional[str]


_OURS_BLOCK = "Transformer/encoderblock_{}/"
_QKV = ("q", "k", "v")  # timm's split of attn.qkv, in its order.
# The one name correspondence with the PyTorch code bases, read both ways
# (`from_timm`, `from_hugging_face`, `to_timm`). Transformers 4 wrote the
# Hub's files. timm fuses query, key and value into `attn.qkv`, read as
# three modules (`_split_qkv`).
_MODULES = (
    _Module("cls", "tensor", "cls_token", "embeddings.cls_token",
            "embeddings.cls_token"),
    _Module(POSEMB, "tensor", "pos_embed", "embeddings.position_embeddings",
            "embeddings.position_embeddings"),
    _Module("embedding", "conv", "patch_embed.proj",
            "embeddings.patch_embeddings.projection",
            "embeddings.patch_embeddings.projection"),
    _Module("Transformer/encoder_norm", "norm", "norm", "layernorm",
            "layernorm"),
    _Module("head", "dense", "head", "classifier", "classifier"),
    _Module("pre_logits", "dense", None, "pooler.dense", "pooler.dense"),
    *(_Module(_OURS_BLOCK + f"MultiHeadDotProductAttention_1/{name}",
              "heads_in", f"blocks.{{}}.attn.{short}",
              f"encoder.layer.{{}}.attention.attention.{name}",
              f"layers.{{}}.attention.{short}_proj")
      for short, name in zip(_QKV, ("query", "key", "value"))),
    _Module(_OURS_BLOCK + "MultiHeadDotProductAttention_1/out", "heads_out",
            "blocks.{}.attn.proj", "encoder.layer.{}.attention.output.dense",
            "layers.{}.attention.o_proj"),
    _Module(_OURS_BLOCK + "LayerNorm_0", "norm", "blocks.{}.norm1",
            "encoder.layer.{}.layernorm_before", "layers.{}.layernorm_before"),
    _Module(_OURS_BLOCK + "LayerNorm_2", "norm", "blocks.{}.norm2",
            "encoder.layer.{}.layernorm_after", "layers.{}.layernorm_after"),
    _Module(_OURS_BLOCK + "MlpBlock_3/Dense_0", "dense", "blocks.{}.mlp.fc1",
            "encoder.layer.{}.intermediate.dense", "layers.{}.mlp.fc1"),
    _Module(_OURS_BLOCK + "MlpBlock_3/Dense_1", "dense", "blocks.{}.mlp.fc2",
            "encoder.layer.{}.output.dense", "layers.{}.mlp.fc2"),
    # The options of timm's families (families.py says which needs which).
    _Module("registers", "tensor", "reg_token", None, None),
    _Module("Transformer/pre_norm", "norm", "norm_pre", None, None),
    _Module("pooled_norm", "norm", "fc_norm", None, None),
    _Module(_OURS_BLOCK + "LayerScale_attention/scale", "tensor",
            "blocks.{}.ls1.gamma", None, None),
    _Module(_OURS_BLOCK + "LayerScale_mlp/scale", "tensor",
            "blocks.{}.ls2.gamma", None, None),
    # timm's qk_norm=True: LayerNorms over each head's queries and keys.
    *(_Module(_OURS_BLOCK + f"MultiHeadDotProductAttention_1/{name}_ln", "norm",
              f"blocks.{{}}.attn.{short}_norm", None, None)
      for short, name in (("q", "query"), ("k", "key"))),
)
# Modules a model may lack.
_OPTIONAL = ("cls", "head", "pre_logits", "Transformer/encoder_norm",
             "registers", "Transformer/pre_norm", "pooled_norm") + tuple(
                 _OURS_BLOCK + m
                 for m in ("LayerScale_attention/scale", "LayerScale_mlp/scale",
                           "MultiHeadDotProductAttention_1/query_ln",
                           "MultiHeadDotProductAttention_1/key_ln"))
# Arrays a model may lack, by how they convert: the query/key/value
# biases (timm's and transformers' qkv_bias=False; config.model.qkv_bias).
_OPTIONAL_ARRAYS = ("bias_in",)
_PRE_NORM_LACKS = "embedding/bias"  # timm's CLIP: patch_embed has no bias.
# A module's arrays by kind: (PyTorch's suffix, our leaf, how it converts).
_ARRAYS = {
    "tensor": (("", "", "same"),),
    "norm": ((".weight", "/scale", "same"), (".bias", "/bias", "same")),
    "conv": ((".weight", "/kernel", "conv"), (".bias", "/bias", "same")),
    "dense": ((".weight", "/kernel", "dense"), (".bias", "/bias", "same")),
    "heads_in": (
        (".weight", "/kernel", "heads_in"), (".bias", "/bias", "bias_in")),
    "heads_out": (
        (".weight", "/kernel", "heads_out"), (".bias", "/bias", "same")),
}


def _to_ours(how: str, value, num_heads: int):
  """A PyTorch array as ours: Linear (out, in) -> Dense (in, out), split
  into heads where attention's input or output is; Conv OIHW -> HWIO."""
  if how == "conv":
    return value.transpose(2, 3, 1, 0)
  if how == "dense":
    return value.T
  if how == "heads_in":  # (D_out, D_in) -> (D_in, H, K).
    return value.T.reshape(value.shape[1], num_heads, -1)
  if how == "bias_in":  # (D_out,) -> (H, K).
    return value.reshape(num_heads, -1)
  if how == "heads_out":  # (D_out, D_in) -> (H, K, D_out).
    return value.T.reshape(num_heads, -1, value.shape[0])
  return value


def _to_torch(how: str, value):
  """The inverse of `_to_ours`."""
  if how == "conv":
    return value.transpose(3, 2, 0, 1)
  if how == "dense":
    return value.T
  if how == "heads_in":
    return value.reshape(value.shape[0], -1).T
  if how == "bias_in":
    return value.reshape(-1)
  if how == "heads_out":
    return value.reshape(-1, value.shape[-1]).T
  return value


def _num_blocks(names, naming: str) -> int:
  """1 + the largest block index among `names` (ours, or `naming`'s)."""
  block = next(  # A block's module that every ViT in `naming` has.
      getattr(m, naming)
      for m in _MODULES
      if m.ours.startswith(_OURS_BLOCK + "MlpBlock_3"))
  pattern = re.compile(re.escape(block[:block.index("{}")]) + r"(\d+)")
  return 1 + max(
      (int(m.group(1)) for n in names if (m := pattern.match(n))), default=-1)


def _arrays(naming: str, num_blocks: int):
  """(module, our name, PyTorch's name, how it converts) of every array."""
  for module in _MODULES:
    theirs = getattr(module, naming)
    if theirs is None:
      continue
    for i in range(num_blocks) if "{}" in module.ours else [0]:
      for suffix, leaf, how in _ARRAYS[module.kind]:
        ours = module.ours.format(i) + leaf
        yield module, ours, theirs.format(i) + suffix, how


def _from_torch(tensors, naming: str, num_heads: int, path: str,
                optional=()) -> dict:
  """Our params from a PyTorch state dict in `naming` (a `_Module` field);
  `optional`: modules it may lack beside _OPTIONAL."""
  params, num_blocks = {}, _num_blocks(tensors, naming)
  for module, ours, theirs, how in _arrays(naming, num_blocks):
    if theirs in tensors:
      params[ours] = _to_ours(how, tensors[theirs], num_heads)
    elif module.ours not in _OPTIONAL + tuple(
        optional) and how not in _OPTIONAL_ARRAYS:
      raise WeightsError(f"{path} has no {theirs!r}, which every ViT in its "
                         "naming has; is it a whole state dict?")
  return params


def from_timm(tensors, num_heads, path) -> Converted:
  """timm's VisionTransformer (fused qkv), with the options of its DINOv2,
  DeiT III, CLIP and fc_norm models (`families.py`) and its
  ParallelScalingBlock (`timm_parallel.py`)."""
  swiglu = [n for n in tensors if ".mlp.fc1_g." in n or ".mlp.w12." in n]
  if swiglu:
    raise WeightsError(
        f"{path} has a SwiGLU MLP ({swiglu[0]}, DINOv2's ViT-g/14), which "
        "this project's ViT does not have; its ViT-S/B/L/14 load.")
  parallel = any(".in_proj." in n for n in tensors)
  if parallel:  # Read as timm's standard block, without norm2.
    tensors = timm_parallel.as_standard_blocks(tensors, path)
  naflex, factorized, naflex_options = timm_naflex.is_naflex(tensors), {}, {}
  if naflex:  # Its embeddings under `embeds.`: renamed to a ViT's.
    naflex_options = timm_naflex.options(tensors)
    tensors, factorized = timm_naflex.to_timm_vit(tensors)
  pool, pool_names = timm_attention_pool.from_timm(tensors, num_heads)
  tensors = {k: v for k, v in tensors.items() if k not in pool_names}
  if ("patch_embed.proj.weight" in tensors and
      "patch_embed.proj.bias" not in tensors):  # CLIP's: no bias, zero here.
    width = tensors["patch_embed.proj.weight"].shape[0]
    tensors["patch_embed.proj.bias"] = np.zeros((width,), np.float32)
  lacks = (POSEMB,) if factorized else ()
  lacks += (_OURS_BLOCK + "LayerNorm_2",) if parallel else ()
  params = timm_resnet.stem_params(tensors)
  params.update(_from_torch(_split_qkv(tensors), "timm", num_heads, path,
                            lacks))
  params.update(pool)
  params.update(factorized)
  prefix = posemb_prefix(params)
  found = families.options(params, prefix)
  note = (f"family: {families.name(found)}" +
          (f"; it needs {families.config_fix(found)}" if found else ""))
  if naflex:
    note = f"timm's NaFlexViT ({note})"
  return Converted(params, prefix, "timm", [note], sequences=naflex,
                   options=naflex_options)


def _is_square(count: int) -> bool:
  return count > 0 and round(count**0.5)**2 == count


def posemb_prefix(params) -> int:
  """The prefix tokens (class token, registers) the stored position
  embeddings have entries for: all of them, or none where the rest is a
  square grid and the whole is not (timm's `no_embed_class`)."""
  prefix = int("cls" in params) + (params["registers"].shape[1]
                                   if "registers" in params else 0)
  table = params.get(POSEMB)
  if (table is not None and table.ndim == 3 and
      not _is_square(table.shape[1] - prefix) and _is_square(table.shape[1])):
    return 0
  return prefix


def _split_qkv(tensors) -> dict:
  """timm's fused `attn.qkv` as three modules, `attn.q`, `attn.k`, `attn.v`."""
  out = dict(tensors)
  for name in [n for n in tensors if ".attn.qkv." in n]:
    for part, value in zip(_QKV, np.split(out.pop(name), 3)):
      out[name.replace(".qkv.", f".{part}.")] = value
  return out


def _fuse_qkv(tensors) -> dict:
  """The inverse of `_split_qkv`."""
  out = dict(tensors)
  for name in [n for n in tensors if ".attn.q." in n]:
    parts = [out.pop(name.replace(".q.", f".{part}.")) for part in _QKV]
    out[name.replace(".q.", ".qkv.")] = np.concatenate(parts)
  return out


def from_hugging_face(tensors, num_heads, path) -> Converted:
  """transformers' ViTModel / ViTForImageClassification (either naming), or
  its DINOv2 (`hf_dinov2.py`)."""
  if hf_dinov2.is_dinov2(tensors):
    renamed, left_out = hf_dinov2.to_timm(tensors, path)
    converted = from_timm(renamed, num_heads, path)
    converted.origin = "hugging_face"
    converted.notes += [f"left out {', '.join(left_out)}"] if left_out else []
    return converted
  tensors = {
      (k[len("vit."):] if k.startswith("vit.") else k): v
      for k, v in tensors.items()
  }
  naming = ("transformers_4" if any(
      k.startswith("encoder.layer.") for k in tensors) else "transformers_5")
  return Converted(_from_torch(tensors, naming, num_heads, path), 1,
                   "hugging_face")


def to_timm(params: dict[str, np.ndarray],
            with_config: bool = False) -> dict[str, np.ndarray]:
  """This project's flat names -> timm's VisionTransformer state dict.

  Every parameter must find its place: a layer timm's model has no room for
  (a pre-logits layer, a hybrid stem) refuses the export rather than
  writing a file that loads into timm and computes other logits. Without a
  class token or with a MAP head, the state dict needs the timm config
  that says so: `with_config` (timm_dir.py writes it).
  """
  if "pre_logits/kernel" in params:
    raise WeightsError(
        "The model has a pre-logits layer (pre_logits/kernel, the tanh layer "
        "of pre-training), which timm's VisionTransformer does not have: the "
        "exported file would give other logits. Export a model without it "
        "(e.g. after fine-tuning with config.model.representation_size=None), "
        "or use --format=npz, which keeps it.")
  if POSEMB not in params:
    raise WeightsError(
        "The model's position embeddings are fixed (sincos2d) and stored "
        "nowhere; timm's VisionTransformer file has no place to say so. Use "
        "--format=npz.")
  if any(k.startswith("conv_root") for k in params):
    raise WeightsError("A hybrid's ResNet stem is not written in timm's "
                       "names here; use --format=npz.")
  block = families.block_options(params)
  if block.get("parallel_block") or block.get("use_bias") is False:
    raise WeightsError(
        "The model has ViT-22B's parallel block or no encoder LayerNorm "
        "biases (config.model.parallel_block, use_bias), which timm's "
        "VisionTransformer block does not have; use --format=npz.")
  if not with_config and ("cls" not in params or "MAPHead_0/probe" in params):
    raise WeightsError(
        "Without a class token or with a MAP head, timm's VisionTransformer "
        "must be told so (class_token, global_pool): use --format=timm-dir, "
        "which writes that config beside the weights.")
  out, used = timm_attention_pool.to_timm(params)
  return _fuse_qkv(_to_torch_state(params, "timm", out, used))


def to_hugging_face(params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """This project's flat names -> transformers' ViTModel state dict in the
  Hub's names (hf_dir.py checks first that the model is one)."""
  return _to_torch_state(params, "transformers_4", {}, set())


def _to_torch_state(params, naming: str, out: dict, used: set) -> dict:
  """`out` plus every parameter of ours in `naming`; one without a place
  there refuses the whole export."""
  for module, ours, theirs, how in _arrays(naming, _num_blocks(params, "ours")):
    if ours in params:
      used.add(ours)
      out[theirs] = _to_torch(how, params[ours])
    elif (module.ours not in _OPTIONAL and ours != _PRE_NORM_LACKS and
          how not in _OPTIONAL_ARRAYS):
      raise WeightsError(f"The model has no {ours}, which the {naming} "
                         "model needs; nothing was written.")
  left = sorted(set(params) - used)
  if left:
    raise WeightsError(f"The {naming} model has no place for {left}; "
                       "nothing was written. Use --format=npz, which keeps "
                       "every parameter.")
  # safetensors writes the raw buffer: every array must be C-ordered.
  return {k: np.ascontiguousarray(v) for k, v in out.items()}
