"""Weights from any supported file: read, convert, load, describe, write.

A core, and a room per origin (what another code base names and lays out).
The rooms import the core; the core imports no room (only `files/`, the
formats every origin's files come in, which imports nothing of the core).
Where the core needs a room's knowledge (which code base wrote a file, its
converter, what its config.json says), the room registers it into a table
of `origins` when imported, here:

  names, origins      this project's parameter names; which code base wrote
                      a file (the rooms' origins, converters and readers of
                      config.json, registered)
  loader, load_steps, loading: each parameter through named steps (resize,
  report, posemb      re-initialise, drop) with a report; position
                      embeddings resized in 2D
  families,           the options a file's parameters show (the family
  unsupported,        table); the families recognised but not computed;
  mixer_layout        an MLP-Mixer's parameters (ours: the released names)
  architecture,       the model a file holds; a config's open choices
  decisions,          decided; the config a checkpoint runs with alone;
  standalone,         `inspect`'s text
  describe
  writers, exports,   export: npz and timm state dicts, what each exporter
  eval_preprocessing  writes; the evaluation preprocessing in other
                      libraries' words
  torch_layout        PyTorch's arrays as ours, by a room's table
  files/              formats (npz, safetensors, pickles read without
                      torch, Orbax), the released names, the download cache,
                      timm's and transformers' directories
  big_vision/         Google's Flax files (released, current Flax,
                      big_vision, NaFlex's layout), two-tower files (an
                      image-text model's start, transformers' SigLIP too)
  timm/               timm's names and families (NaFlexViT, parallel block,
                      attention pool, ResNetV2 stem, MlpMixer, Eva), its
                      directories and state dicts
  transformers/       transformers' names (ViT, DINOv2, DINOv3, SigLIP), its
                      directories
  mae/                facebookresearch/mae's full checkpoints (timm's
                      encoder, its decoder)

Modules outside `weights/` import only this face. Imports no TensorFlow:
converting and loading run on accelerator hosts. `decide(config, ...)`
settles what a config leaves open (the GELU form) before a model is built;
`init_params(config, path, params, shardings)` is what training calls to
start from a checkpoint (`config.init.checkpoint`).
"""

from vit_jax.errors import WeightsError
from vit_jax.weights.architecture import Architecture
from vit_jax.weights.architecture import read as read_architecture
from vit_jax.weights.big_vision import flax_names
from vit_jax.weights.big_vision.two_tower_files import as_big_vision_file
from vit_jax.weights.big_vision.two_tower_files import init_two_towers
from vit_jax.weights.big_vision.two_tower_files import is_two_towers_file
from vit_jax.weights.big_vision.two_tower_files import looped_two_towers
from vit_jax.weights.big_vision.two_tower_files import text_fields
from vit_jax.weights.decisions import decide
from vit_jax.weights.decisions import decide_text
from vit_jax.weights.describe import SEQUENCE_PP_EVAL
from vit_jax.weights.describe import compare_with_config
from vit_jax.weights.describe import describe_model
from vit_jax.weights.describe import report as describe_weights
from vit_jax.weights.eval_preprocessing import EvalPreprocessing
from vit_jax.weights.eval_preprocessing import describe as eval_preprocessing_of
from vit_jax.weights.exports import refuse_unwritten
from vit_jax.weights.exports import unsaid
from vit_jax.weights.exports import writer as exporter_of
from vit_jax.weights.families import config_fix
from vit_jax.weights.families import name as family_name
from vit_jax.weights.families import options as family_options
from vit_jax.weights.files.cache import CACHE_VARIABLE
from vit_jax.weights.files.cache import OFFLINE_VARIABLE
from vit_jax.weights.files.cache import cache_path
from vit_jax.weights.files.cache import forget_announced
from vit_jax.weights.files.cache import locate
from vit_jax.weights.files.directories import class_names
from vit_jax.weights.files.directories import weights_file
from vit_jax.weights.files.formats import read as read_file
from vit_jax.weights.files.formats import split_tower
from vit_jax.weights.files.released import CHECKPOINTS as RELEASED
from vit_jax.weights.files.released import Released
from vit_jax.weights.files.released import describe_table as released_table
from vit_jax.weights.files.released import lookup as lookup_released
from vit_jax.weights.loader import check_released_variant
from vit_jax.weights.loader import file_origin
from vit_jax.weights.loader import init_params
from vit_jax.weights.loader import load
from vit_jax.weights.loader import load_for_config
from vit_jax.weights.loader import origin_gelu
from vit_jax.weights.loader import read_converted
from vit_jax.weights.loader import recorded_config
from vit_jax.weights.loader import target_grid
from vit_jax.weights.loader import training_workdir
from vit_jax.weights.mae import mae_names
from vit_jax.weights.mae.mae_names import DECODER_HEADS as MAE_DECODER_HEADS
from vit_jax.weights.mixer_layout import MixerArchitecture
from vit_jax.weights.mixer_layout import is_mixer
from vit_jax.weights.mixer_layout import mixer_architecture
from vit_jax.weights.names import POSEMB
from vit_jax.weights.names import Converted
from vit_jax.weights.origins import convert as convert_tensors
from vit_jax.weights.origins import stated_options
from vit_jax.weights.origins import words as origin_words
from vit_jax.weights.posemb import check_config
from vit_jax.weights.posemb import resize_grid
from vit_jax.weights.posemb import resize_posemb
from vit_jax.weights.report import Report
from vit_jax.weights.standalone import config_for
from vit_jax.weights.standalone import form_alone
from vit_jax.weights.standalone import merge_recorded
from vit_jax.weights.timm import timm_config
from vit_jax.weights.timm import timm_names
from vit_jax.weights.timm.timm_dir import save_timm
from vit_jax.weights.timm.timm_dir import write as write_timm_dir
from vit_jax.weights.timm.timm_mixer import from_timm_mixer
from vit_jax.weights.timm.timm_mixer import to_timm_mixer
from vit_jax.weights.transformers import hf_names
from vit_jax.weights.transformers.hf_dir import write as write_hf_dir
from vit_jax.weights.transformers.hf_dir import write_files as write_hf_files
from vit_jax.weights.transformers.hf_siglip import to_siglip
from vit_jax.weights.writers import EXPORT_FORMATS
from vit_jax.weights.writers import at_patch_size
from vit_jax.weights.writers import released_params
from vit_jax.weights.writers import save_npz
from vit_jax.weights.writers import with_class_token_entry
from vit_jax.weights.writers import with_posemb_table

# The rooms' origins and readers of config.json, registered now.
del flax_names, mae_names, timm_config, timm_names, hf_names
__all__ = [
    "forget_announced", "split_tower", "Released", "MixerArchitecture",
    "init_two_towers", "write_hf_files", "looped_two_towers",
    "as_big_vision_file", "to_siglip", "is_two_towers_file", "text_fields",
    "merge_recorded", "training_workdir", "convert_tensors", "WeightsError",
    "Architecture", "read_architecture", "mixer_architecture", "is_mixer",
    "decide", "decide_text", "SEQUENCE_PP_EVAL", "compare_with_config",
    "describe_model", "describe_weights", "EvalPreprocessing",
    "eval_preprocessing_of", "config_fix", "family_name", "family_options",
    "CACHE_VARIABLE", "OFFLINE_VARIABLE", "cache_path", "locate", "class_names",
    "weights_file", "read_file", "RELEASED", "released_table",
    "lookup_released", "check_released_variant", "file_origin", "init_params",
    "load", "load_for_config", "origin_gelu", "read_converted",
    "recorded_config", "target_grid", "POSEMB", "Converted", "stated_options",
    "origin_words", "check_config", "resize_grid", "resize_posemb", "Report",
    "config_for", "write_timm_dir", "from_timm_mixer", "to_timm_mixer",
    "write_hf_dir", "EXPORT_FORMATS", "at_patch_size", "released_params",
    "save_npz", "save_timm", "with_class_token_entry", "with_posemb_table",
    "MAE_DECODER_HEADS", "refuse_unwritten", "unsaid", "exporter_of",
    "form_alone"
]
