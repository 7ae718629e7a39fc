"""timm's VisionTransformer state dict <-> this project's names.

One table of modules (`MODULES`, read both ways through `torch_layout`),
and the families of timm's ViTs (`FAMILIES`): each a layout read in a
standard VisionTransformer's names by a module of this room (NaFlexViT's
embeddings, ViT-22B's parallel block, timm's Eva: DINOv3, EVA-02,
RoPE-ViT, PE), or refused in one line where it computes something this
project does not (`unsupported.py`): such a file is never loaded without
it. A new family is a module here and a row of `FAMILIES`. The origin
`timm` of `origins.ORIGINS` is registered here.
"""

from typing import Callable
from typing import NamedTuple

import numpy as np

from vit_jax.errors import WeightsError
from vit_jax.weights import families
from vit_jax.weights import mixer_layout
from vit_jax.weights import origins
from vit_jax.weights import torch_layout
from vit_jax.weights import unsupported
from vit_jax.weights.names import BLOCK
from vit_jax.weights.names import POSEMB
from vit_jax.weights.names import Converted
from vit_jax.weights.names import posemb_prefix
from vit_jax.weights.timm import attention_pool
from vit_jax.weights.timm import dinov3
from vit_jax.weights.timm import eva
from vit_jax.weights.timm import naflexvit
from vit_jax.weights.timm import parallel_scaling
from vit_jax.weights.timm import resnetv2
from vit_jax.weights.timm import timm_mixer
from vit_jax.weights.torch_layout import Module

_ATTENTION = BLOCK + "MultiHeadDotProductAttention_1/"
_QKV = ("q", "k", "v")  # timm's split of attn.qkv, in its order.
# timm fuses query, key and value into `attn.qkv`, read as three modules
# (`split_qkv`).
MODULES = (
    Module("cls", "tensor", "cls_token"),
    Module(POSEMB, "tensor", "pos_embed"),
    Module("embedding", "conv", "patch_embed.proj"),
    Module("Transformer/encoder_norm", "norm", "norm"),
    Module("head", "dense", "head"),
    *(Module(_ATTENTION + name, "heads_in", f"blocks.{{}}.attn.{short}")
      for short, name in zip(_QKV, ("query", "key", "value"))),
    Module(_ATTENTION + "out", "heads_out", "blocks.{}.attn.proj"),
    Module(BLOCK + "LayerNorm_0", "norm", "blocks.{}.norm1"),
    Module(BLOCK + "LayerNorm_2", "norm", "blocks.{}.norm2"),
    Module(BLOCK + "MlpBlock_3/Dense_0", "dense", "blocks.{}.mlp.fc1"),
    Module(BLOCK + "MlpBlock_3/Dense_1", "dense", "blocks.{}.mlp.fc2"),
    # The options of timm's families (families.py says which needs which).
    Module("registers", "tensor", "reg_token"),
    Module("Transformer/pre_norm", "norm", "norm_pre"),
    Module("pooled_norm", "norm", "fc_norm"),
    Module(BLOCK + "LayerScale_attention/scale", "tensor",
           "blocks.{}.ls1.gamma"),
    Module(BLOCK + "LayerScale_mlp/scale", "tensor", "blocks.{}.ls2.gamma"),
    # timm's qk_norm=True: LayerNorms over each head's queries and keys.
    *(Module(_ATTENTION + f"{name}_ln", "norm",
             f"blocks.{{}}.attn.{short}_norm")
      for short, name in (("q", "query"), ("k", "key"))),
    # Eva's (eva.py): SwiGLU's gate, the LayerNorms inside the MLP and over
    # the attention's heads, RoPE-Mixed's learned frequencies.
    Module(BLOCK + "MlpBlock_3/Gate", "dense", "blocks.{}.mlp.fc1_g"),
    Module(BLOCK + "MlpBlock_3/LayerNorm_0", "norm", "blocks.{}.mlp.norm"),
    Module(_ATTENTION + "heads_ln", "heads_norm", "blocks.{}.attn.norm"),
    Module(_ATTENTION + "rope_frequencies", "tensor",
           "blocks.{}.attn.rope_frequencies"),
)


class Family(NamedTuple):
  """A layout of timm's ViT state dicts: `found(tensors)` says a file has
  it, `standard(tensors, path)` renames it into a standard
  VisionTransformer's, which lacks our modules `lacks`; `options(tensors)`:
  the config.model fields it computes with that no parameter shows."""
  name: str
  found: Callable[[dict], bool]
  standard: Callable[[dict, str], dict]
  lacks: tuple[str, ...] = ()
  options: Callable[[dict], dict] = lambda tensors: {}


FAMILIES = (
    Family("ViT-22B's parallel block (ParallelScalingBlock)",
           parallel_scaling.is_parallel, parallel_scaling.as_standard_blocks,
           (BLOCK + "LayerNorm_2",)),
    Family("DINOv3 (timm's Eva, RoPE)", dinov3.is_dinov3, eva.as_vit_names,
           (POSEMB,), lambda tensors: dict(dinov3.OPTIONS)),
    *(Family(name, found, eva.as_vit_names, (), options)
      for name, found, options in eva.FAMILIES),
)


def from_timm(tensors, num_heads, path, overrides=None) -> Converted:
  """timm's VisionTransformer (fused qkv), with the options of its DINOv2,
  DeiT III, CLIP and fc_norm models (`families.py`), its families of
  `FAMILIES`, NaFlexViT (`naflexvit.py`) and MlpMixer (`timm_mixer.py`).
  `overrides`: options another code base's port of a family computes
  otherwise (transformers' DINOv3 pools its class token)."""
  if timm_mixer.is_timm_mixer(tensors):
    return Converted(timm_mixer.from_timm_mixer(tensors), 0, "timm")
  found_families = [family for family in FAMILIES if family.found(tensors)]
  refused = unsupported.find(unsupported.TIMM, tensors)
  if refused and not found_families:
    raise WeightsError(unsupported.refusal(refused, path))
  lacks, family_options, named = (), {}, None
  for family in found_families:
    stated = family.options(tensors)
    named = named or (family.name if stated else None)
    family_options.update(stated)
    tensors, lacks = family.standard(tensors, path), lacks + family.lacks
  if family_options.get("posemb") == "none":
    lacks += (POSEMB,)
  if found_families:
    family_options.update(overrides or {})
  unsupported.refuse_eva_left(tensors, path)
  naflex, factorized, naflex_options = naflexvit.is_naflex(tensors), {}, {}
  if naflex:  # Its embeddings under `embeds.`: renamed to a ViT's.
    naflex_options = naflexvit.options(tensors)
    tensors, factorized = naflexvit.to_timm_vit(tensors)
  pool, pool_names = attention_pool.from_timm(
      tensors,
      family_options.get("map_heads") or num_heads)
  tensors = {k: v for k, v in tensors.items() if k not in pool_names}
  if ("patch_embed.proj.weight" in tensors and
      "patch_embed.proj.bias" not in tensors):  # CLIP's: no bias, zero here.
    width = tensors["patch_embed.proj.weight"].shape[0]
    tensors["patch_embed.proj.bias"] = np.zeros((width,), np.float32)
  lacks += (POSEMB,) if factorized else ()
  params = resnetv2.stem_params(tensors)
  params.update(
      torch_layout.from_torch(split_qkv(tensors), MODULES, num_heads, path,
                              lacks))
  params.update(pool)
  params.update(factorized)
  prefix = posemb_prefix(params)
  found = {**families.options(params, prefix), **family_options}
  note = (f"family: {named or families.name(found)}" +
          (f"; it needs {families.config_fix(found)}" if found else ""))
  if naflex:
    note = f"timm's NaFlexViT ({note})"
  return Converted(params, prefix, "timm", [note], sequences=naflex, options={
      **naflex_options,
      **family_options
  })


def to_timm_split(params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Our params of a model without a position table (RoPE) in timm's
  names, the query, key and value apart (`attn.q`, `attn.k`, `attn.v`)."""
  modules = tuple(m for m in MODULES if m.ours != POSEMB)
  return torch_layout.to_torch(params, modules, "timm", {}, set())


def split_qkv(tensors) -> dict:
  """timm's fused `attn.qkv` as three modules, `attn.q`, `attn.k`, `attn.v`."""
  out = dict(tensors)
  for name in [n for n in tensors if ".attn.qkv." in n]:
    for part, value in zip(_QKV, np.split(out.pop(name), 3)):
      out[name.replace(".qkv.", f".{part}.")] = value
  return out


def fuse_qkv(tensors) -> dict:
  """The inverse of `split_qkv`."""
  out = dict(tensors)
  for name in [n for n in tensors if ".attn.q." in n]:
    parts = [out.pop(name.replace(".q.", f".{part}.")) for part in _QKV]
    out[name.replace(".q.", ".qkv.")] = np.concatenate(parts)
  return out


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
        "The model stores no position table (fixed sincos2d ones, RoPE or "
        "none), and timm's VisionTransformer file has no place to say so. "
        "Use --format=timm-dir (its config.json says so) or --format=npz.")
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
  out, used = attention_pool.to_timm(params)
  return fuse_qkv(torch_layout.to_torch(params, MODULES, "timm", out, used))


def _is_timms(names) -> bool:
  """timm's names: blocks and a patch embedding (an MlpMixer's too)."""
  return mixer_layout.is_mixer(names) or any(
      n.startswith(("blocks.", "patch_embed.")) for n in names)


def _name_options(names: dict) -> dict:
  """What a NaFlexViT's names say that its weights cannot show."""
  return naflexvit.options(names) if naflexvit.is_naflex(names) else {}


def _convert(fmt: str, tensors, num_heads: int, path: str) -> Converted:
  del fmt  # A safetensors file or a pickle: the same names.
  return from_timm(tensors, num_heads, path)


origins.register(
    "timm",
    origins.Origin("timm", gelu_approximate=False, convert=_convert,
                   claims=_is_timms, rank=20, name_options=_name_options))
