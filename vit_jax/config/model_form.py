"""A model's form: every `config.model` field but the variant, declared once.

Each field below is one option of the model, with its default and what it
means; `defaults.get_model_config()` is made from them, and the decided
config's `ModelForm.from_config(config.model)` is what the model is built
with, passed whole down `VisionTransformer -> Encoder -> block -> attention
/ MLP` (and to the Mixer): a module reads the fields it uses, and no module
re-declares another's. The variant (`models/variants.py`) gives the sizes.

A new option is a field here, the code of the module that uses it, and,
where checkpoints show it, a row of `weights/families.py`
(docs/extending.md has the checklist). `Literal` fields are checked
against their choices when a config is checked (`check`).
"""

import dataclasses
import typing
from typing import Literal
from typing import Optional

from ml_collections import config_dict

from vit_jax.errors import UserError

Dtype = Literal["float32", "bfloat16", "float16"]


def _open(default):
  """A field the defaults leave open (None in `config.model`):
  `weights.decide` settles it from the weights a run starts from or
  resumes, before any model is built; `default` where there are none."""
  return dataclasses.field(default=default, metadata={"open": True})


def _vit(default):
  """An option of the ViT alone: an MLP-Mixer keeps its default."""
  return dataclasses.field(default=default, metadata={"vit_only": True})


@dataclasses.dataclass(frozen=True)
class ModelForm:
  """What the model computes besides its sizes (see the module doc)."""
  # How the head pools: the class token, the mean of the patch tokens, or a
  # MAP head (multihead attention pooling: a learned probe attends).
  classifier: Literal["token", "gap", "map"] = "token"
  # A class token before the patches; None: exactly when classifier=token
  # (gap and map then pool the patch tokens only).
  class_token: Optional[bool] = None
  # Position embeddings: learn (the paper's) | sincos2d (fixed 2D sin-cos,
  # big_vision's plain ViTs; nothing stored or loaded) | factorized (NaViT's:
  # a learned table of rows and one of columns, summed) | none (a model
  # whose attention knows positions by `rope` alone, DINOv3's).
  posemb: Literal["learn", "sincos2d", "factorized", "none"] = "learn"
  # A learned table's first values: normal (stddev 0.02, the paper's) |
  # sincos (MAE's fixed 2D sin-cos values, the prefix tokens' zero: MAE
  # pre-trains with the table frozen, config.frozen, and fine-tunes it).
  posemb_init: Literal["normal", "sincos"] = _vit("normal")
  # Rotary position embeddings on each head's queries and keys of the
  # patches, from each patch's (row, column) in its grid (models/rope.py):
  # none | dinov3 (DINOv3's: positions centred and scaled into [-1, 1] per
  # axis) | axial (timm's RotaryEmbeddingCat: patch indices; EVA-02, PE,
  # RoPE-ViT) | mixed (RoPE-ViT's: frequencies learned per block and head).
  rope: Literal["none", "dinov3", "axial", "mixed"] = _vit("none")
  rope_temperature: float = _vit(100.0)  # The base of RoPE's periods.
  # Which channels an angle turns together: j and j + K/2 (half; DINOv3's)
  # or 2j and 2j + 1 (interleaved; EVA-02's, PE's, RoPE-ViT's).
  rope_layout: Literal["half", "interleaved"] = _vit("half")
  # The axis whose angles come first (timm's grid_indexing ij | xy).
  rope_axes: Literal["row_column", "column_row"] = _vit("row_column")
  rope_grid_offset: float = _vit(0.0)  # Added to the indices (axial, mixed).
  # Axial and mixed: positions rescaled as if the grid were this many
  # patches a side (EVA's ref_feat_shape: the pre-training grid); 0: none.
  rope_reference_grid: int = _vit(0)
  # In training only, RoPE's positions moved (DINOv3's
  # augmentations, in the form's units): shifted by up to +-rope_shift on
  # each axis, scaled by a factor in [1/J, J] per axis (rope_jitter) and one
  # in [1/R, R] for both (rope_rescale; DINOv3 pre-trains with 2),
  # log-uniform; 0, 1, 1: none.
  rope_shift: float = _vit(0.0)  # Up to +- this (0: none).
  rope_jitter: float = _vit(1.0)  # A factor per axis (1: none).
  rope_rescale: float = _vit(1.0)  # One factor for both (1: none).
  # Who shares a draw of them: the whole batch, drawn anew in every block
  # (block: DINOv3's own code) or once for all blocks (batch: timm's and
  # transformers' ports), or each image in all blocks (image).
  rope_augment_per: Literal["block", "batch", "image"] = _vit("block")
  # How images at their own shape (config.sequence_length) resize learned
  # position embeddings to each image's grid, antialiased: bilinear
  # (big_vision's NaFlex) | bicubic (timm's NaFlexViT). Open: as the weights'
  # origin learned them (bilinear at random init).
  posemb_interpolation: Literal["bilinear", "bicubic"] = _open("bilinear")
  # Resize it to a square of the longer side of each image's grid and read
  # the image's own rows and columns (timm's pos_embed_ar_preserving).
  posemb_keep_aspect: bool = _vit(False)
  # The patch size the model runs at; None: its variant's. Another (FlexiViT,
  # plain ViTs only): the parameters keep the variant's shapes, and the patch
  # embedding is PI-resized and learned position embeddings resized to the
  # grid in every step (config.flexi trains at many).
  patch_size: Optional[int] = None
  # An MLP-Mixer fine-tuned at K times its checkpoint's resolution (the Mixer
  # paper's Supplementary C): its token-mixing MLP is K^2 times as wide and
  # starts as K^2 copies of the checkpoint's, one per K x K tile of the image.
  mixer_tiles: int = 1
  # PyTorch's ViT families (DINOv2, DeiT III, CLIP), each off by default:
  # register tokens after the class token (DINOv2).
  num_registers: int = _vit(0)
  # Learned position embeddings for the class token and registers too (the
  # paper's, timm's default); False: the patches only (timm's no_embed_class).
  posemb_covers_prefix: bool = _vit(True)
  layer_scale: Optional[float] = _vit(None)  # LayerScale's init; None: none.
  pre_norm: bool = _vit(False)  # A LayerNorm before the blocks (CLIP's).
  quick_gelu: bool = _vit(False)  # x sigmoid(1.702 x) in the MLPs (OpenAI's).
  # The final LayerNorm on the pooled features, not every token (fc_norm).
  pooled_norm: bool = _vit(False)
  # SwiGLU MLPs: SiLU(x W_gate) * (x W) -> W_out (EVA-02's, DINOv3's larger
  # models), the hidden width the variant's mlp_dim.
  swiglu: bool = _vit(False)
  # A LayerNorm inside the MLP before its output projection (EVA-02's
  # "sub-LN", timm's scale_mlp), and one over the attention's heads before
  # its output projection (timm's scale_attn_inner; EVA-02's CLIP towers).
  mlp_norm: bool = _vit(False)
  attention_norm: bool = _vit(False)  # The heads' LayerNorm (see above).
  # Heads of the MAP head's attention; None: the encoder's (PE's: 8).
  map_heads: Optional[int] = _vit(None)
  layer_norm_eps: float = _vit(1e-6)  # Every LayerNorm's (timm's CLIP: 1e-5).
  # FP8 training: the encoder blocks' matmuls (attention projections, MLP)
  # in e4m3 forward and e5m2 gradients, with delayed scaling whose state the
  # train state keeps and checkpoints; the embedding, head, LayerNorms,
  # softmax and loss stay in `dtype`, and so does evaluation (ViTs only).
  fp8: bool = _vit(False)
  # ViT-22B's block, for training from scratch (each off by default): the
  # attention and the MLP read one LayerNorm and are added to the residual
  # together (about 15% faster in ViT-22B).
  parallel_block: bool = _vit(False)
  # No biases in the attention's projections and the encoder's LayerNorms
  # (the MLP keeps its).
  use_bias: bool = _vit(True)
  qkv_bias: bool = _vit(True)  # False: none in query/key/value (timm's).
  # False: biases in the query and value projections only (EVA's and
  # DINOv3's; with RoPE a key bias would change the attention).
  key_bias: bool = _vit(True)
  qk_norm: bool = _vit(False)  # A LayerNorm on each head's queries and keys.
  # Width of the tanh pre-logits layer that the paper uses at pre-training
  # only; None: no such layer.
  representation_size: Optional[int] = None
  head_bias_init: float = 0.0  # Constant init of the head bias (kernel: 0).
  dropout_rate: float = 0.0  # After position embeddings, attention and MLP.
  attention_dropout_rate: float = 0.0  # On the attention weights.
  # Stochastic depth (Huang et al. 2016): in training, each block's attention
  # and MLP branch is dropped for a whole example with this probability (the
  # same at every depth, as big_vision's `stoch_depth`); 0: off.
  drop_path_rate: float = 0.0
  dtype: Dtype = "float32"  # Compute dtype.
  param_dtype: Dtype = "float32"  # Storage dtype of the parameters.
  # Rematerialise blocks. Under FSDP the blocks gather their weights again
  # and "none" acts as "dots".
  remat: Literal["none", "full", "dots"] = "none"
  scan_layers: bool = False  # One scanned block (compiles deep models faster).
  # Attention where its weights are not needed: auto (cuDNN's fused kernel
  # on GPUs in bf16/fp16, else explicit) | explicit (einsums, softmax) |
  # xla | cudnn (jax.nn.dot_product_attention with that implementation).
  attention: Literal["auto", "explicit", "xla", "cudnn"] = "auto"
  # GELU: the tanh approximation the released weights were trained with, or
  # the exact erf of timm / Hugging Face (False). Open: as the resumed run
  # or config.init.checkpoint's origin computes it (tanh at random init).
  gelu_approximate: bool = _open(True)

  @classmethod
  def from_config(cls, model_config, decided: bool = True) -> "ModelForm":
    """The form of `config.model`: decided (`weights.decide` has settled
    the open fields), as a model is built, or with `decided=False` as it
    stands (an open field None), to read the others. An older recorded
    config is upgraded where it is read (`config.recorded`), so every field
    is there."""
    values = {}
    for field in dataclasses.fields(cls):
      value = model_config[field.name]
      if value is None and field.metadata.get("open") and decided:
        raise ValueError(
            f"config.model.{field.name} is still undecided (None): pass the "
            "config through vit_jax.weights.decide before building a model.")
      values[field.name] = value
    return cls(**values)

  @property
  def has_class_token(self) -> bool:
    """A class token is there where set, else with token pooling."""
    if self.class_token is None:
      return self.classifier == "token"
    return bool(self.class_token)

  @property
  def num_prefix_tokens(self) -> int:
    """Tokens before the patch grid: the class token (if any), registers."""
    return int(self.has_class_token) + self.num_registers

  @property
  def posemb_prefix_tokens(self) -> int:
    """Prefix tokens the learned position embeddings have entries for."""
    return self.num_prefix_tokens if self.posemb_covers_prefix else 0


def choices(name: str) -> tuple:
  """The values field `name` may take (a `Literal` field's), () if any."""
  hint = typing.get_type_hints(ModelForm)[name]
  return typing.get_args(hint) if typing.get_origin(hint) is Literal else ()


def defaults() -> dict:
  """{field: default} of every field."""
  return {f.name: f.default for f in dataclasses.fields(ModelForm)}


def open_fields() -> tuple[str, ...]:
  """The fields `weights.decide` settles."""
  return tuple(
      f.name for f in dataclasses.fields(ModelForm) if f.metadata.get("open"))


def vit_only_fields() -> tuple[str, ...]:
  """The fields a Mixer leaves at their defaults."""
  return tuple(f.name
               for f in dataclasses.fields(ModelForm)
               if f.metadata.get("vit_only"))


def config_fields() -> dict:
  """The fields as `config.model` holds them: each default, an open one or
  one that defaults to None as a typed placeholder (None until set)."""
  hints = typing.get_type_hints(ModelForm)
  out = {}
  for field in dataclasses.fields(ModelForm):
    if field.default is None or field.metadata.get("open"):
      out[field.name] = config_dict.placeholder(_value_type(hints[field.name]))
    else:
      out[field.name] = field.default
  return out


def _value_type(hint) -> type:
  """bool for Optional[bool], str for a Literal of strings, ..."""
  args = [a for a in typing.get_args(hint) if a is not type(None)]
  if typing.get_origin(hint) is Literal:
    return type(args[0])
  return args[0] if args else hint


def check(model_config):
  """Refuses a value of a `Literal` field outside its choices, in one line."""
  for field in dataclasses.fields(ModelForm):
    allowed = choices(field.name)
    value = model_config[field.name]
    if allowed and value not in allowed and not (value is None and
                                                 field.metadata.get("open")):
      raise UserError(f"config.model.{field.name}={value!r} is not one of "
                      f"{', '.join(allowed)}.")
