"""What every reader of data takes: one split of one dataset, preprocessed and
batched, as one value (`DataSpec`).

Training reads `training(config)`: the config's dataset, `train_split`,
`pp_train` and `batch_size` (and for image-text training the text of
`config.text`: `text_spec`). An evaluator reads `evaluation(config, data)`:
the config's evaluation data (`eval_split`, `pp_eval`, `eval_batch_size`),
with the fields its entry's `data` sets instead (`config.evals.NAME.data`:
any of DATA_FIELDS; None keeps the config's). Both build the spec in one
place and check it (the pipeline parses, a batch is positive), so no code
copies the training config to read another dataset, and nothing forgotten in
a copy falls back to the training data's settings.
"""

import dataclasses
from typing import Optional

import ml_collections

from vit_jax import models
from vit_jax.data import handover
from vit_jax.data import preprocess
from vit_jax.errors import UserError

# The fields an evaluator's `data` may set (config/defaults.py declares them).
DATA_FIELDS = ("dataset", "split", "pp", "batch_size", "cache", "data_dir",
               "manual_dir", "label_key", "sequence_length")


@dataclasses.dataclass(frozen=True)
class TextSpec:
  """The text read with each image (image-text training, its evaluators):
  one caption drawn per example with the example's seed ("text"), or all
  of them ("texts", "texts_mask"; see `tokenizer.text_fn`)."""
  key: str  # The dataset's text feature: a Text, or a Sequence of Text.
  tokenizer: str  # A SentencePiece .model, a tokenizer.json or 'digits'.
  length: int  # Tokens per text, the last one EOS.
  all_captions: bool = False  # Every caption (retrieval), not one drawn.
  lowercase: bool = False  # Texts lower-cased before they are tokenised.
  max_captions: int = 5  # all_captions: texts per image, padded or cut.


@dataclasses.dataclass(frozen=True)
class DataSpec:
  """One split of one dataset, preprocessed and batched."""
  dataset: str  # A TFDS name, folder:/path, img2dataset:/path, vtab:TASK.
  split: str  # A TFDS split string, e.g. 'train[:98%]'.
  pp: str  # The preprocessing pipeline (vit_jax/data/preprocess.py).
  image_size: int  # The pipeline's output resolution.
  batch_size: int  # Global: split over the processes.
  cache: bool  # Keep it in host memory after the first pass.
  data_dir: Optional[str]  # TFDS data_dir; None: TFDS's default.
  manual_dir: Optional[str]  # TFDS manual downloads.
  label_key: Optional[str] = None  # The label feature; None: the dataset's.
  seed: int = 0  # The data order and the augmentation's seeds.
  shuffle_buffer: int = 0  # Examples in the training shuffle buffer.
  crop_on_decode: bool = True  # See preprocess (config.pp_crop_on_decode).
  crop_antialias: bool = False  # config.pp_crop_antialias.
  uint8: bool = False  # Training hands images over as uint8 (handover).
  # Unreadable files tolerated, a share of those read, and at least a few
  # (data/unreadable.py).
  max_unreadable_share: float = 0.01
  # Images at their own shape (a pipeline ending with patchify): the model's
  # patch size and the patches per image (`sequence_ops`).
  patch_size: int = 0
  sequence_length: Optional[int] = None
  # Training at several lengths, one per step, batches from a token budget
  # (`length_schedule.py`); () and 0: one length, batch_size images.
  sequence_lengths: tuple = ()
  token_budget: int = 0
  text: Optional[TextSpec] = None  # Captions as token ids; None: no text.


def _checked(spec: DataSpec, where: str) -> DataSpec:
  if not spec.dataset:
    raise UserError(f"{where}: no dataset named; give a TFDS name, "
                    "folder:/path or digits.")
  if spec.batch_size < 1:
    raise UserError(f"{where}: batch size {spec.batch_size} must be "
                    "positive.")
  if not 0 <= spec.max_unreadable_share <= 1:
    raise UserError(f"config.max_unreadable_share="
                    f"{spec.max_unreadable_share} must be a share between 0 "
                    "and 1 (0: any unreadable image stops the run).")
  if spec.text is not None:
    _check_text(spec.text)
  preprocess.parse(spec.pp, spec.image_size, spec.crop_antialias,
                   spec.patch_size, spec.sequence_length)
  return spec


def _check_text(text: TextSpec):
  if not text.key or not text.tokenizer:
    raise UserError("config.text.key and config.text.tokenizer name the "
                    "dataset's text feature and its tokenizer; give both.")
  if text.length < 1 or text.max_captions < 1:
    raise UserError(f"config.text.length={text.length} (tokens, EOS "
                    f"included) and max_captions={text.max_captions} must "
                    "be at least 1.")


def text_spec(config: ml_collections.ConfigDict,
              all_captions: bool = False) -> TextSpec:
  """The text an image-text objective reads (config.text)."""
  return TextSpec(key=config.text.key, tokenizer=config.text.tokenizer,
                  length=config.text.length, all_captions=all_captions,
                  lowercase=config.text.lowercase)


def _common(config: ml_collections.ConfigDict) -> dict:
  return dict(image_size=config.image_size, cache=config.cache,
              data_dir=config.data_dir, manual_dir=config.manual_dir,
              seed=config.seed, crop_on_decode=config.pp_crop_on_decode,
              crop_antialias=config.pp_crop_antialias,
              max_unreadable_share=config.max_unreadable_share,
              patch_size=models.stride(
                  config.model), sequence_length=config.get("sequence_length"))


def training(config: ml_collections.ConfigDict, text: bool = False) -> DataSpec:
  """The training data of a config; `text`: with its texts (config.text),
  where its objective reads them (`objectives.training_data`)."""
  lengths = tuple(config.get("sequence_lengths", ()))
  spec = DataSpec(
      dataset=config.dataset, split=config.train_split, pp=config.pp_train,
      batch_size=config.batch_size, shuffle_buffer=config.shuffle_buffer,
      sequence_lengths=lengths, token_budget=config.get("token_budget") or 0,
      uint8=handover.hands_over_uint8(config),
      text=text_spec(config) if text else None, **_common(config))
  return _checked(spec,
                  "The training data (config.dataset, train_split, pp_train)")


def evaluation(config: ml_collections.ConfigDict, data=None,
               where: str = "config",
               text: Optional[TextSpec] = None) -> DataSpec:
  """The config's evaluation data, with the non-None fields of `data` (an
  evaluator entry's `data`, or a dict of DATA_FIELDS) instead; `text`: the
  captions read with it (e.g. `text_spec(config, all_captions=True)`)."""
  fields = dict(dataset=config.dataset, split=config.eval_split,
                pp=config.pp_eval, batch_size=config.eval_batch_size, text=text,
                **_common(config))
  data = dict(data or {})
  unknown = sorted(set(data) - set(DATA_FIELDS))
  if unknown:
    raise UserError(f"{where}.data has no field {', '.join(unknown)}; its "
                    f"fields: {', '.join(DATA_FIELDS)}.")
  fields.update({k: v for k, v in data.items() if v is not None})
  return _checked(DataSpec(**fields), f"{where}.data")
