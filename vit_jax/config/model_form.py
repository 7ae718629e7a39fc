"""A model's form: every `config.model` field but the variant, declared once.

Each field below is one option of the model, with its default and what it
means; `defaults.get_model_config()` is made from them, and the decided
config's `ModelForm.from_config(config.model)` is what the model is built
with, passed whole down `VisionTransformer -> Encoder -> block -> attention
/ MLP` (and to the Mixer): a module reads the fields it uses, and no module
re-declares another's. The variant (`models/variants.py`) gives the sizes.

What the rest of the program must know of a field is its `Facts`, its
metadata, read through the functions at the end: whether weights decide
it, whether a Mixer takes it, whether a checkpoint family computes with a
value no parameter shows, how a file's blocks show it, which exporters
write it, which parts built from the model share it. A new option is a
field here with its facts and the code of the module that uses it
(docs/extending.md has the checklist). `Literal` fields are checked
against their choices when a config is checked (`check`).
"""

import dataclasses
import typing
from typing import Any
from typing import Literal
from typing import Optional

from ml_collections import config_dict

from vit_jax.errors import UserError

Dtype = Literal["float32", "bfloat16", "float16"]

# What writes a model for another code base (`vit-jax export`, weights/):
# timm's VisionTransformer (timm-dir, and the `timm` state dict), its
# NaFlexViT, Eva (RoPE models) and MlpMixer; transformers' ViT and DINOv3,
# and the image tower of its SiglipModel. An `npz` holds the parameters
# whatever the form (the export names the flags that load it where the file
# cannot show them).
EXPORTERS = ("timm-vit", "timm-naflex", "timm-eva", "timm-mixer", "hf-vit",
             "hf-dinov3", "hf-siglip")
# The parts a model builds from its form beside the image encoder.
PARTS = ("map_head", "text", "mae_decoder")
AS_DEFAULT = "(the default)"  # A recorded config without the field.


@dataclasses.dataclass(frozen=True)
class InBlocks:
  """How a file's parameters show a block option (a bool): the first
  block's (`Transformer/encoderblock_0/...`) has `adds` where the option is
  not at its default, or lacks `removes`; where `shown_with` is named, only
  blocks that have it say anything (else: the default)."""
  words: str  # The value other than the default, as a report says it.
  names: str  # A regex of every parameter that value adds or removes.
  adds: str = ""
  removes: str = ""
  shown_with: str = ""


@dataclasses.dataclass(frozen=True)
class Facts:
  """A field's facts (its metadata), each off by default."""
  # Weights decide it (None in `config.model` until `weights.decide`, from
  # the weights a run starts from or resumes; the default without any).
  open: bool = False
  vit_only: bool = False  # A ViT's option: an MLP-Mixer keeps the default.
  # A checkpoint family computes with a value of it that no parameter shows
  # (the file's origin states it); a model must have that value to load it.
  stated: bool = False
  # How the model trains or runs (precision, memory, kernels, dropout,
  # initialisation), not what its trained weights compute: every exporter
  # writes any value, and a file's reader need not be told it.
  runtime: bool = False
  # Read only for images at their own shape (config.sequence_length): a
  # model written for one resolution computes the same whatever its value.
  sequences_only: bool = False
  benchmark: bool = False  # A flag of `vit-jax benchmark`, in its results.
  # The value a recorded config.json that predates the field meant, where
  # that is not the default (`config/recorded.py`).
  absent_means: Any = AS_DEFAULT
  blocks: Optional[InBlocks] = None  # How a file's blocks show it.
  exports: tuple[str, ...] = ()  # The EXPORTERS that write any value of it.
  # The PARTS that compute with the model's value (the others: the default).
  parts: tuple[str, ...] = ()

  def __post_init__(self):
    unknown = set(self.exports) - set(EXPORTERS) | set(self.parts) - set(PARTS)
    if unknown:
      raise ValueError(f"Unknown exporters or parts {sorted(unknown)}.")


def _field(default, **facts):
  return dataclasses.field(default=default, metadata={"facts": Facts(**facts)})


def _vit(default, **facts):
  """An option of the ViT alone."""
  return _field(default, vit_only=True, **facts)


def _runtime(default, **facts):
  """How the model trains or runs (`Facts.runtime`)."""
  return _field(default, runtime=True, **facts)


def _block(default, words: str, names: str, exports=(), benchmark=False,
           **sign):
  """A block option of the ViT that a file's parameters show (`InBlocks`)."""
  return _vit(default, blocks=InBlocks(words, names, **sign), exports=exports,
              benchmark=benchmark)


# Writers of timm's models that take the option as one of their arguments.
_TIMM_VITS = ("timm-vit", "timm-naflex", "timm-eva")
_ATTENTION = "MultiHeadDotProductAttention_1/"


@dataclasses.dataclass(frozen=True)
class ModelForm:
  """What the model computes besides its sizes (see the module doc)."""
  # How the head pools: the class token, the mean of the patch tokens, or a
  # MAP head (multihead attention pooling: a learned probe attends).
  classifier: Literal["token", "gap", "map"] = _field(
      "token", exports=_TIMM_VITS + ("timm-mixer", "hf-siglip"))
  # A class token before the patches; None: exactly when classifier=token
  # (gap and map then pool the patch tokens only).
  class_token: Optional[bool] = _field(None, exports=EXPORTERS)
  # Position embeddings: learn (the paper's) | sincos2d (fixed 2D sin-cos,
  # big_vision's plain ViTs; nothing stored or loaded) | factorized (NaViT's:
  # a learned table of rows and one of columns, summed) | none (a model
  # whose attention knows positions by `rope` alone, DINOv3's).
  posemb: Literal["learn", "sincos2d", "factorized", "none"] = _field(
      "learn", stated=True,
      exports=_TIMM_VITS + ("hf-vit", "hf-dinov3", "hf-siglip"))
  # A learned table's first values: normal (stddev 0.02, the paper's) |
  # sincos (MAE's fixed 2D sin-cos values, the prefix tokens' zero: MAE
  # pre-trains with the table frozen, config.frozen, and fine-tunes it).
  posemb_init: Literal["normal", "sincos"] = _vit("normal", runtime=True)
  # Rotary position embeddings on each head's queries and keys of the
  # patches, from each patch's (row, column) in its grid (models/rope.py):
  # none | dinov3 (DINOv3's: positions centred and scaled into [-1, 1] per
  # axis) | axial (timm's RotaryEmbeddingCat: patch indices; EVA-02, PE,
  # RoPE-ViT) | mixed (RoPE-ViT's: frequencies learned per block and head).
  rope: Literal["none", "dinov3", "axial", "mixed"] = _vit(
      "none", stated=True, exports=("timm-eva", "hf-dinov3"))
  rope_temperature: float = _vit(  # The base of RoPE's periods.
      100.0, stated=True, exports=("timm-eva", "hf-dinov3"))
  # Which channels an angle turns together: j and j + K/2 (half; DINOv3's)
  # or 2j and 2j + 1 (interleaved; EVA-02's, PE's, RoPE-ViT's).
  rope_layout: Literal["half", "interleaved"] = _vit("half", stated=True,
                                                     exports=("timm-eva",))
  # The axis whose angles come first (timm's grid_indexing ij | xy).
  rope_axes: Literal["row_column", "column_row"] = _vit(
      "row_column", stated=True, exports=("timm-eva",))
  rope_grid_offset: float = _vit(  # Added to the indices (axial, mixed).
      0.0, stated=True, exports=("timm-eva",))
  # Axial and mixed: positions rescaled as if the grid were this many
  # patches a side (EVA's ref_feat_shape: the pre-training grid); 0: none.
  rope_reference_grid: int = _vit(0, stated=True, exports=("timm-eva",))
  # In training only, RoPE's positions moved (DINOv3's
  # augmentations, in the form's units): shifted by up to +-rope_shift on
  # each axis, scaled by a factor in [1/J, J] per axis (rope_jitter) and one
  # in [1/R, R] for both (rope_rescale; DINOv3 pre-trains with 2),
  # log-uniform; 0, 1, 1: none.
  rope_shift: float = _vit(0.0, runtime=True)  # Up to +- this (0: none).
  rope_jitter: float = _vit(1.0, runtime=True)  # A factor per axis (1: none).
  rope_rescale: float = _vit(1.0, runtime=True)  # One for both (1: none).
  # Who shares a draw of them: the whole batch, drawn anew in every block
  # (block: DINOv3's own code) or once for all blocks (batch: timm's and
  # transformers' ports), or each image in all blocks (image). An older
  # run's config.json without it drew per image (`recorded.upgrade`).
  rope_augment_per: Literal["block", "batch", "image"] = _vit(
      "block", runtime=True)
  # How images at their own shape (config.sequence_length) resize learned
  # position embeddings to each image's grid, antialiased: bilinear
  # (big_vision's NaFlex) | bicubic (timm's NaFlexViT). Open: as the weights'
  # origin learned them (bilinear at random init).
  posemb_interpolation: Literal["bilinear", "bicubic"] = _field(
      "bilinear", open=True, absent_means="bilinear", sequences_only=True,
      exports=EXPORTERS)
  # Resize it to a square of the longer side of each image's grid and read
  # the image's own rows and columns (timm's pos_embed_ar_preserving).
  posemb_keep_aspect: bool = _vit(False, sequences_only=True, exports=EXPORTERS)
  # The patch size the model runs at; None: its variant's. Another (FlexiViT,
  # plain ViTs only): the parameters keep the variant's shapes, and the patch
  # embedding is PI-resized and learned position embeddings resized to the
  # grid in every step (config.flexi trains at many).
  patch_size: Optional[int] = _field(None, exports=EXPORTERS)
  # An MLP-Mixer fine-tuned at K times its checkpoint's resolution (the Mixer
  # paper's Supplementary C): its token-mixing MLP is K^2 times as wide and
  # starts as K^2 copies of the checkpoint's, one per K x K tile of the image.
  mixer_tiles: int = _field(1, exports=("timm-mixer",))
  # PyTorch's ViT families (DINOv2, DeiT III, CLIP), each off by default:
  # register tokens after the class token (DINOv2).
  num_registers: int = _vit(0, exports=_TIMM_VITS + ("hf-dinov3",))
  # Learned position embeddings for the class token and registers too (the
  # paper's, timm's default); False: the patches only (timm's no_embed_class).
  posemb_covers_prefix: bool = _vit(True, exports=_TIMM_VITS + ("hf-vit",))
  layer_scale: Optional[float] = _vit(  # LayerScale's init; None: none.
      None, exports=_TIMM_VITS + ("hf-dinov3",))
  pre_norm: bool = _vit(  # A LayerNorm before the blocks (CLIP's).
      False, exports=("timm-vit", "timm-eva"))
  quick_gelu: bool = _vit(  # x sigmoid(1.702 x) in the MLPs (OpenAI's).
      False, exports=("timm-vit", "timm-naflex", "hf-vit"))
  # The final LayerNorm on the pooled features, not every token (fc_norm).
  pooled_norm: bool = _vit(False, exports=_TIMM_VITS)
  # SwiGLU MLPs: SiLU(x W_gate) * (x W) -> W_out (EVA-02's, DINOv3's larger
  # models), the hidden width the variant's mlp_dim.
  swiglu: bool = _block(False, "SwiGLU MLPs", "/Gate/",
                        adds="MlpBlock_3/Gate/kernel",
                        exports=("timm-eva", "hf-dinov3"))
  # A LayerNorm inside the MLP before its output projection (EVA-02's
  # "sub-LN", timm's scale_mlp), and one over the attention's heads before
  # its output projection (timm's scale_attn_inner; EVA-02's CLIP towers).
  mlp_norm: bool = _block(
      False, "a LayerNorm inside the MLP", "MlpBlock_3/LayerNorm_0/",
      adds="MlpBlock_3/LayerNorm_0/scale", exports=("timm-eva",))
  attention_norm: bool = _block(  # The heads' LayerNorm (see above).
      False, "a LayerNorm over the attention's heads", "/heads_ln/",
      adds=_ATTENTION + "heads_ln/scale", exports=("timm-eva",))
  # Heads of the MAP head's attention; None: the encoder's (PE's: 8).
  map_heads: Optional[int] = _vit(None, stated=True, exports=("timm-eva",))
  layer_norm_eps: float = _vit(  # Every LayerNorm's (timm's CLIP: 1e-5).
      1e-6, stated=True,
      exports=_TIMM_VITS + ("hf-vit", "hf-dinov3", "hf-siglip"), parts=PARTS)
  # FP8 training: the encoder blocks' matmuls (attention projections, MLP)
  # in e4m3 forward and e5m2 gradients, with delayed scaling whose state the
  # train state keeps and checkpoints; the embedding, head, LayerNorms,
  # softmax and loss stay in `dtype`, and so does evaluation (ViTs only).
  fp8: bool = _vit(False, runtime=True, benchmark=True)
  # ViT-22B's block, for training from scratch (each off by default): the
  # attention and the MLP read one LayerNorm and are added to the residual
  # together (about 15% faster in ViT-22B).
  parallel_block: bool = _block(False, "ViT-22B's parallel block",
                                "/LayerNorm_2/", removes="LayerNorm_2/scale",
                                benchmark=True)
  # No biases in the attention's projections and the encoder's LayerNorms
  # (the MLP keeps its).
  use_bias: bool = _block(
      True, "no attention or encoder LayerNorm biases",
      r"LayerNorm_\d/bias$|encoder_norm/bias$|pre_norm/bias$|"
      r"/(query|key|value|out)/bias$", removes="LayerNorm_0/bias",
      benchmark=True)
  qkv_bias: bool = _block(  # False: none in query/key/value (timm's).
      True, "no query/key/value biases", r"/(query|key|value)/bias$",
      removes=_ATTENTION + "query/bias", shown_with="LayerNorm_0/bias",
      exports=_TIMM_VITS + ("hf-vit", "hf-dinov3"), benchmark=True)
  # False: biases in the query and value projections only (EVA's and
  # DINOv3's; with RoPE a key bias would change the attention).
  key_bias: bool = _block(True, "query and value biases only", "/key/bias$",
                          removes=_ATTENTION + "key/bias",
                          shown_with=_ATTENTION + "query/bias",
                          exports=("timm-eva", "hf-dinov3"))
  qk_norm: bool = _block(  # A LayerNorm on each head's queries and keys.
      False, "query/key LayerNorms", "/(query|key)_ln/",
      adds=_ATTENTION + "query_ln/scale", exports=_TIMM_VITS, benchmark=True)
  # Width of the tanh pre-logits layer that the paper uses at pre-training
  # only; None: no such layer.
  representation_size: Optional[int] = _field(None, exports=("hf-vit",))
  head_bias_init: float = _runtime(0.0)  # The head bias's init (kernel: 0).
  # After position embeddings, attention and MLP.
  dropout_rate: float = _runtime(0.0, parts=("text",))
  attention_dropout_rate: float = _runtime(0.0)  # On the attention weights.
  # Stochastic depth (Huang et al. 2016): in training, each block's attention
  # and MLP branch is dropped for a whole example with this probability (the
  # same at every depth, as big_vision's `stoch_depth`); 0: off.
  drop_path_rate: float = _runtime(0.0)
  dtype: Dtype = _runtime(  # Compute dtype.
      "float32", benchmark=True, parts=PARTS)
  param_dtype: Dtype = _runtime(  # Storage dtype of the parameters.
      "float32", parts=PARTS)
  # Rematerialise blocks. Under FSDP the blocks gather their weights again
  # and "none" acts as "dots".
  remat: Literal["none", "full", "dots"] = _runtime(
      "none", benchmark=True, parts=("text", "mae_decoder"))
  scan_layers: bool = _runtime(  # One scanned block (compiles deep models
      False, benchmark=True, parts=("text",))  # faster).
  # Attention where its weights are not needed: auto (cuDNN's fused kernel
  # on GPUs in bf16/fp16, else explicit) | explicit (einsums, softmax) |
  # xla | cudnn (jax.nn.dot_product_attention with that implementation).
  attention: Literal["auto", "explicit", "xla", "cudnn"] = _runtime(
      "auto", benchmark=True, parts=("text", "mae_decoder"))
  # GELU: the tanh approximation the released weights were trained with, or
  # the exact erf of timm / Hugging Face (False). Open: as the resumed run
  # or config.init.checkpoint's origin computes it (tanh at random init).
  gelu_approximate: bool = _field(True, open=True, absent_means=False,
                                  exports=EXPORTERS, parts=PARTS,
                                  benchmark=True)

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
      if value is None and facts(field.name).open and decided:
        raise ValueError(
            f"config.model.{field.name} is still undecided (None): pass the "
            "config through vit_jax.weights.decide before building a model.")
      values[field.name] = value
    return cls(**values)

  def for_part(self, part: str, **fixed) -> "ModelForm":
    """The form a part built from this model's computes with (one of
    PARTS): the model's values of the fields it shares (`Facts.parts`),
    `fixed`, the defaults of the rest."""
    unshared = {
        f.name: f.default
        for f in dataclasses.fields(self)
        if part not in facts(f.name).parts
    }
    return dataclasses.replace(self, **{**unshared, **fixed})

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


_FIELDS = {f.name: f for f in dataclasses.fields(ModelForm)}


def choices(name: str) -> tuple:
  """The values field `name` may take (a `Literal` field's), () if any."""
  hint = typing.get_type_hints(ModelForm)[name]
  return typing.get_args(hint) if typing.get_origin(hint) is Literal else ()


def defaults() -> dict:
  """{field: default} of every field."""
  return {f.name: f.default for f in dataclasses.fields(ModelForm)}


def facts(name: str) -> Facts:
  """Field `name`'s facts."""
  return _FIELDS[name].metadata["facts"]


def _having(fact: str) -> tuple[str, ...]:
  return tuple(name for name in _FIELDS if getattr(facts(name), fact))


def open_fields() -> tuple[str, ...]:
  """The fields `weights.decide` settles."""
  return _having("open")


def vit_only_fields() -> tuple[str, ...]:
  """The fields a Mixer leaves at their defaults."""
  return _having("vit_only")


def stated_fields() -> tuple[str, ...]:
  """The fields a checkpoint family's file states, which a model must
  match to compute its outputs (RoPE's form, the LayerNorms, PE's pool)."""
  return _having("stated")


def runtime_fields() -> tuple[str, ...]:
  """The fields that change how a model trains or runs, not what its
  trained weights compute."""
  return _having("runtime")


def sequences_only_fields() -> tuple[str, ...]:
  """The fields only images at their own shape read."""
  return _having("sequences_only")


def benchmark_fields() -> tuple[str, ...]:
  """The fields `vit-jax benchmark` sets by its flags and reports."""
  return _having("benchmark")


def absent_values() -> dict:
  """{field: what a recorded config without it meant}, where that is not
  its default."""
  return {
      name: facts(name).absent_means
      for name in _FIELDS
      if facts(name).absent_means != AS_DEFAULT
  }


def block_fields() -> dict[str, InBlocks]:
  """{field: how a file's blocks show it} of the block options."""
  return {name: facts(name).blocks for name in _having("blocks")}


def written_by(exporter: str) -> tuple[str, ...]:
  """The fields `exporter` (one of EXPORTERS) writes, whatever their
  values: those it names (`Facts.exports`) and the runtime ones."""
  if exporter not in EXPORTERS:
    raise ValueError(f"Unknown exporter {exporter!r}.")
  return tuple(name for name in _FIELDS
               if exporter in facts(name).exports or facts(name).runtime)


def config_fields() -> dict:
  """The fields as `config.model` holds them: each default, an open one or
  one that defaults to None as a typed placeholder (None until set)."""
  hints = typing.get_type_hints(ModelForm)
  out = {}
  for field in dataclasses.fields(ModelForm):
    if field.default is None or facts(field.name).open:
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
                                                 facts(field.name).open):
      raise UserError(f"config.model.{field.name}={value!r} is not one of "
                      f"{', '.join(allowed)}.")
