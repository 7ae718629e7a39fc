"""transformers' `SiglipModel` <-> this project's two towers, both ways,
and its `Siglip2Model` (SigLIP 2's NaFlex towers) read.

Its vision tower is our ViT with a MAP head and no class token or image
projection (`post_layernorm` is the encoder's final LayerNorm; the MAP
head's attention packs query, key and value in one `in_proj`); its text
tower is ours (`models/text.py`): `final_layer_norm`, the last token,
`head`. `logit_scale` is our `t` (its log) and `logit_bias` our `b`.
Read as an image checkpoint, a SigLIP directory gives its vision tower.

Siglip2Model's vision tower is the NaFlex form (images at their own shape,
`models/sequences.py`): its patch embedding a Linear of flattened patches
(row, column, channel: a conv kernel reshaped) and its position table
resized bilinearly (antialiased) to each image's grid, big_vision's.
"""

import numpy as np

from vit_jax.errors import WeightsError
from vit_jax.weights import exports
from vit_jax.weights import torch_layout
from vit_jax.weights.names import BLOCK
from vit_jax.weights.names import POSEMB
from vit_jax.weights.names import Converted
from vit_jax.weights.torch_layout import Module

VISION, TEXT = "vision_model.", "text_model."
_MAP = "MAPHead_0/"
_MAP_ATTENTION = _MAP + "MultiHeadDotProductAttention_0/"
_ATTENTION = BLOCK + "MultiHeadDotProductAttention_1/"
_SCALARS = {"t": "logit_scale", "b": "logit_bias"}


def _blocks(layers: str) -> tuple[Module, ...]:
  """One tower's blocks; `layers`: their prefix, `{}` the index."""
  return (
      Module(BLOCK + "LayerNorm_0", "norm", layers + "layer_norm1"),
      *(Module(_ATTENTION + name, "heads_in", layers + f"self_attn.{q}_proj")
        for q, name in zip("qkv", ("query", "key", "value"))),
      Module(_ATTENTION + "out", "heads_out", layers + "self_attn.out_proj"),
      Module(BLOCK + "LayerNorm_2", "norm", layers + "layer_norm2"),
      Module(BLOCK + "MlpBlock_3/Dense_0", "dense", layers + "mlp.fc1"),
      Module(BLOCK + "MlpBlock_3/Dense_1", "dense", layers + "mlp.fc2"),
  )


_VISION_TABLE = (
    Module("embedding", "conv", VISION + "embeddings.patch_embedding"),
    Module("Transformer/encoder_norm", "norm", VISION + "post_layernorm"),
    Module(_MAP + "LayerNorm_0", "norm", VISION + "head.layernorm"),
    Module(_MAP + "MlpBlock_0/Dense_0", "dense", VISION + "head.mlp.fc1"),
    Module(_MAP + "MlpBlock_0/Dense_1", "dense", VISION + "head.mlp.fc2"),
    Module(_MAP_ATTENTION + "out", "heads_out",
           VISION + "head.attention.out_proj"),
    *_blocks(VISION + "encoder.layers.{}."),
)
# The text tower's encoder is `Encoder_0`: named here as the image's
# (`Transformer`), renamed by `as_text`.
_TEXT_TABLE = (
    Module("Transformer/encoder_norm", "norm", TEXT + "final_layer_norm"),
    Module("head", "dense", TEXT + "head"),
    *_blocks(TEXT + "encoder.layers.{}."),
)


def is_siglip(names) -> bool:
  return any(n.startswith(VISION + "embeddings.") for n in names) and any(
      n.startswith(TEXT + "embeddings.") for n in names)


def vision_tower(tensors: dict, num_heads: int, path: str) -> Converted:
  """The vision tower in our ViT's names (Siglip2's: NaFlex's)."""
  patches = VISION + "embeddings.patch_embedding.weight"
  naflex = tensors[patches].ndim == 2  # Siglip2: a Linear, D x (P*P*C).
  if naflex:
    tensors = dict(tensors)
    width, inputs = tensors[patches].shape
    patch = int(round((inputs / 3)**0.5))
    # As the conv PyTorch stores (D, C, P, P), which the table reads.
    tensors[patches] = tensors[patches].reshape(width, patch, patch,
                                                3).transpose(0, 3, 1, 2)
  params = torch_layout.from_torch(tensors, _VISION_TABLE, num_heads, path)
  table = tensors[VISION + "embeddings.position_embedding.weight"]
  params[POSEMB] = table[None]
  params[_MAP + "probe"] = tensors[VISION + "head.probe"]
  packed_w = tensors[VISION + "head.attention.in_proj_weight"]
  packed_b = tensors[VISION + "head.attention.in_proj_bias"]
  width = packed_w.shape[1]
  for i, name in enumerate(("query", "key", "value")):
    rows = slice(i * width, (i + 1) * width)
    params[f"{_MAP_ATTENTION}{name}/kernel"] = packed_w[rows].T.reshape(
        width, num_heads, -1)
    params[f"{_MAP_ATTENTION}{name}/bias"] = packed_b[rows].reshape(
        num_heads, -1)
  left = [n for n in tensors if not n.startswith(VISION)]
  notes = [
      f"read the vision tower of a SiglipModel; left out {len(left)} "
      "text tower and logit arrays"
  ] if left else []
  if naflex:
    notes.append("Siglip2Model's NaFlex layout: its Linear patch embedding "
                 "read as the conv kernel, its position table resized per "
                 "image")
  return Converted(params, 0, "hugging_face", notes, sequences=naflex)


def as_text(params: dict) -> dict:
  """Names of the image tower's layout as the text tower's (Encoder_0)."""
  encoder = "Transformer/"
  return {
      ("Encoder_0/" + k[len(encoder):] if k.startswith(encoder) else k): v
      for k, v in params.items()
  }


def as_image(params: dict) -> dict:
  """The inverse of `as_text`."""
  encoder = "Encoder_0/"
  return {
      ("Transformer/" + k[len(encoder):] if k.startswith(encoder) else k): v
      for k, v in params.items()
  }


def two_towers(tensors: dict, vision_heads: int, text_heads: int,
               path: str) -> dict:
  """The whole model in our two-tower names (`img/`, `txt/`, `t`, `b`)."""
  image = vision_tower(tensors, vision_heads, path).params
  text = torch_layout.from_torch(tensors, _TEXT_TABLE, text_heads, path)
  text["Embed_0/embedding"] = tensors[TEXT +
                                      "embeddings.token_embedding.weight"]
  text["pos_embedding"] = tensors[TEXT +
                                  "embeddings.position_embedding.weight"][None]
  out = {f"img/{k}": v for k, v in image.items()}
  out.update({f"txt/{k}": v for k, v in as_text(text).items()})
  out.update({
      ours: np.reshape(tensors[theirs], (1,))
      for ours, theirs in _SCALARS.items()
      if theirs in tensors
  })
  return out


MODEL_TYPES = ("siglip", "siglip2")


def heads(config: dict) -> tuple[int, int]:
  """(vision, text) attention heads of a SiglipModel's config.json."""
  return (config["vision_config"]["num_attention_heads"],
          config["text_config"]["num_attention_heads"])


def stated_options(config: dict) -> dict:
  """The config.model fields its vision_config states."""
  vision = config.get("vision_config", {})
  options = dict(
      torch_layout.ACTIVATIONS.get(
          vision.get("hidden_act", "gelu_pytorch_tanh"), {}))
  options["layer_norm_eps"] = float(vision.get("layer_norm_eps", 1e-6))
  return options


def to_siglip(params: dict, model_config, text_config, image_size: int,
              naflex: bool = False):
  """(state dict, config.json) of transformers' SiglipModel for a two-tower
  model's flat params (ours), or with `naflex` (images at their own shape)
  its Siglip2Model: SigLIP's form only (below), else a WeightsError that
  says what it lacks."""
  _check(params, model_config, text_config, naflex)
  from vit_jax.weights import writers  # pylint: disable=g-import-not-at-top
  image = writers.with_posemb_table(
      {
          k[4:]: v for k, v in params.items() if k.startswith("img/")
      }, image_size, model_config.posemb)
  text = as_image({k[4:]: v for k, v in params.items() if k.startswith("txt/")})
  state, used = {}, set()
  state[VISION + "embeddings.position_embedding.weight"] = image[POSEMB][0]
  state[VISION + "head.probe"] = image[_MAP + "probe"]
  attention = [_MAP_ATTENTION + q for q in ("query", "key", "value")]
  state[VISION + "head.attention.in_proj_weight"] = np.concatenate([
      image[a + "/kernel"].reshape(image[a + "/kernel"].shape[0], -1).T
      for a in attention
  ])
  state[VISION + "head.attention.in_proj_bias"] = np.concatenate(
      [image[a + "/bias"].reshape(-1) for a in attention])
  used |= {POSEMB, _MAP + "probe"
          } | {a + leaf for a in attention for leaf in ("/kernel", "/bias")}
  state = torch_layout.to_torch(image, _VISION_TABLE, "SiglipModel vision",
                                state, used)
  text_state = {
      TEXT + "embeddings.token_embedding.weight": text["Embed_0/embedding"],
      TEXT + "embeddings.position_embedding.weight": text["pos_embedding"][0],
  }
  text_state = torch_layout.to_torch(text, _TEXT_TABLE, "SiglipModel text",
                                     text_state,
                                     {"Embed_0/embedding", "pos_embedding"})
  state.update(text_state)
  state["logit_scale"] = np.asarray(params["t"], np.float32).reshape(1)
  state["logit_bias"] = np.asarray(params["b"], np.float32).reshape(1)
  config = _config(image, text, model_config, text_config, image_size)
  if naflex:  # Siglip2Model: a Linear of flattened (row, column, channel).
    conv = state[VISION + "embeddings.patch_embedding.weight"]
    state[VISION + "embeddings.patch_embedding.weight"] = np.ascontiguousarray(
        conv.transpose(0, 2, 3, 1).reshape(conv.shape[0], -1))
    config.update(architectures=["Siglip2Model"], model_type="siglip2")
    vision = config["vision_config"]
    del vision["image_size"]
    vision.update(model_type="siglip2_vision_model", num_patches=int(
        image[POSEMB].shape[1]))
    config["text_config"]["model_type"] = "siglip2_text_model"
  return state, config


def _config(image, text, model_config, text_config, image_size) -> dict:
  from vit_jax.weights import architecture  # pylint: disable=g-import-not-at-top
  vision = architecture.variant_of(image, "the image tower")
  act = "gelu_pytorch_tanh" if model_config.gelu_approximate else "gelu"
  common = dict(hidden_act=act, layer_norm_eps=model_config.layer_norm_eps,
                attention_dropout=0.0)
  vocab, width = text["Embed_0/embedding"].shape
  blocks = torch_layout.num_blocks(text, _TEXT_TABLE, ours=True)
  return {
      "architectures": ["SiglipModel"],
      "model_type": "siglip",
      "dtype": "float32",
      "vision_config":
          dict(model_type="siglip_vision_model", hidden_size=vision.hidden_size,
               intermediate_size=vision.mlp_dim,
               num_attention_heads=vision.num_heads,
               num_hidden_layers=vision.num_layers, image_size=image_size,
               patch_size=vision.patch_size, num_channels=3,
               vision_use_head=True, **common),
      "text_config": dict(
          model_type="siglip_text_model", hidden_size=int(width),
          intermediate_size=int(
              text["Transformer/encoderblock_0/MlpBlock_3/"
                   "Dense_0/kernel"].shape[-1]), num_attention_heads=int(
                       text["Transformer/encoderblock_0/"
                            "MultiHeadDotProductAttention_1/query/"
                            "kernel"].shape[1]), num_hidden_layers=blocks,
          vocab_size=int(vocab), max_position_embeddings=int(
              text["pos_embedding"].shape[1]), projection_size=int(
                  text["head/kernel"].shape[-1]), pad_token_id=1,
          eos_token_id=1, bos_token_id=None, **common),
  }


def _check(params, model_config, text_config, naflex: bool):
  """What SiglipModel computes: an image tower MAP-pooled without a class
  token or a projection, a learned position table (or one stored from
  sin-cos), plain blocks; the text tower's last token and projection; a
  bias b (SigLIP's loss). A field of the image tower's form it does not
  write (`exports`: hf-siglip) is refused first."""
  exports.refuse_unwritten(model_config, "hf-siglip", towers=True)
  why = []
  if model_config.classifier != "map" or "img/cls" in params:
    why.append("its image tower pools by MAP without a class token")
  if "img/head/kernel" in params:
    why.append("its image embedding is the MAP head's output (set "
               "config.text.image_head=False)")
  if text_config.pool != "last" or "txt/head/kernel" not in params:
    why.append("its text embedding is the last token's, projected")
  if "b" not in params:
    why.append("it has SigLIP's bias b (the siglip objective)")
  if naflex and (model_config.posemb_interpolation != "bilinear" or
                 model_config.posemb_keep_aspect):
    why.append("Siglip2 resizes its position table bilinearly to each "
               "image's own grid")
  extra = [
      k for k in params if any(s in k
                               for s in ("LayerScale", "query_ln", "key_ln",
                                         "Gate", "heads_ln", "registers",
                                         "pre_norm", "pooled_norm"))
  ]
  if extra or model_config.rope != "none":
    why.append("its blocks are plain (no LayerScale, QK norm, SwiGLU, RoPE, "
               "registers)")
  if why:
    raise WeightsError("transformers' SiglipModel cannot hold this model: "
                       f"{'; '.join(why)}. Use --format=npz (big_vision's "
                       "two-tower layout).")
