"""Text as token ids: SentencePiece and Hugging Face tokenizers, the built-in
captions' own, and the pipeline's text outputs.

    tok = load_tokenizer("digits")  # Or a .model file, or a tokenizer.json.
    tok.encode(["the number 3"], 8)  # int32[1, 8]: pieces, then EOS.

Texts are encoded as SigLIP's are (big_vision's `eos="sticky"`): the
pieces without BOS, cut to `length - 1`, then EOS, then EOS again up to
`length`, so the last token is always EOS (the text tower pools it). The
`digits` tokenizer is a small BPE model trained from every caption of
`digits_captions` the first time it is asked for, and kept in the cache
($VIT_JAX_CACHE_DIR, else ~/.cache/vit_jax: the weights' cache too). A
training run keeps a copy of its tokenizer's file in its workdir (`keep`),
which resuming it and reading its checkpoint prefer (`kept`).
"""

import abc
import functools
import hashlib
import io
import json
import os
from typing import Sequence

import numpy as np

from vit_jax import paths
from vit_jax.config import imports
from vit_jax.data import specs
from vit_jax.errors import UserError

tf = imports.lazy("tensorflow")  # Loaded where the pipeline is built.

DIGITS = "digits"  # The spec of the built-in captions' tokenizer.
# A model loaded to be exported or to embed images: it reads no texts.
NO_TEXTS = "none"
# Its training: BPE reaches the captions' whole words by 128 pieces (a
# unigram model of so few texts keeps single letters).
DIGITS_MODEL = dict(vocab_size=128, model_type="bpe")
# SigLIP's SentencePiece model (T5's c4_en) has these ids; ours too.
_SPECIAL_IDS = dict(pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
# A Hugging Face tokenizer's EOS: the first of these it has.
HF_EOS_TOKENS = ("</s>", "<eos>", "<|endoftext|>")
_FORMS = ("a SentencePiece .model file, a Hugging Face tokenizer.json or "
          f"{DIGITS!r} (the built-in captions' own)")
# Folded into an example's seed to draw its caption: far from the indices
# the image ops fold in (preprocess.py).
_CAPTION_STREAM = 1 << 30


class Tokenizer(abc.ABC):
  """Token ids of texts; `vocab_size` ids, of which `eos_id` ends a text."""
  vocab_size: int
  eos_id: int

  @abc.abstractmethod
  def pieces(self, texts: Sequence[str]) -> list[list[int]]:
    """Each text's ids, with no BOS and no EOS."""

  @abc.abstractmethod
  def decode(self, ids: Sequence[int]) -> str:
    """The text of `ids` up to its first EOS."""

  def encode(self, texts: Sequence[str], length: int) -> np.ndarray:
    """int32[len(texts), length]: each text's pieces (at most length - 1),
    then EOS up to the end."""
    if length < 1:
      raise UserError(f"config.text.length={length} must be at least 1 "
                      "(the EOS token).")
    out = np.full((len(texts), length), self.eos_id, np.int32)
    for row, ids in zip(out, self.pieces(list(texts))):
      ids = ids[:length - 1]
      row[:len(ids)] = ids
    return out

  def _before_eos(self, ids: Sequence[int]) -> list[int]:
    ids = [int(i) for i in ids]
    return ids[:ids.index(self.eos_id)] if self.eos_id in ids else ids


class SentencePieceTokenizer(Tokenizer):
  """A SentencePiece model (`.model` file's bytes)."""

  def __init__(self, model: bytes, where: str):
    import sentencepiece  # pylint: disable=g-import-not-at-top
    self._sp = sentencepiece.SentencePieceProcessor()
    try:
      self._sp.LoadFromSerializedProto(model)
    except (RuntimeError, OSError):  # Its C++ parser's words say no more.
      raise UserError(f"Tokenizer {where} is not a SentencePiece model; "
                      f"config.text.tokenizer takes {_FORMS}.") from None
    self.vocab_size = self._sp.get_piece_size()
    self.eos_id = self._sp.eos_id()
    if self.eos_id < 0:
      raise UserError(f"The SentencePiece model {where} has no EOS piece, "
                      "which ends every text; train it with an eos_id.")

  def pieces(self, texts):
    return self._sp.encode(texts, out_type=int)

  def decode(self, ids):
    return self._sp.decode(self._before_eos(ids))


class HuggingFaceTokenizer(Tokenizer):
  """A Hugging Face `tokenizer.json` (its text); EOS is the first of
  HF_EOS_TOKENS it has."""

  def __init__(self, data: str, where: str):
    import tokenizers  # pylint: disable=g-import-not-at-top
    try:
      self._tok = tokenizers.Tokenizer.from_str(data)
    except Exception as e:  # pylint: disable=broad-except  # Rust's errors.
      raise UserError(f"Tokenizer {where} is not a Hugging Face tokenizer "
                      f"({e}); config.text.tokenizer takes {_FORMS}.") from None
    self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
    found = [self._tok.token_to_id(t) for t in HF_EOS_TOKENS]
    found = [i for i in found if i is not None]
    if not found:
      raise UserError(f"The Hugging Face tokenizer {where} has none of the "
                      f"tokens {', '.join(HF_EOS_TOKENS)} to end a text "
                      "with; add one (EOS) to its vocabulary.")
    self.eos_id = found[0]

  def pieces(self, texts):
    encoded = self._tok.encode_batch(texts, add_special_tokens=False)
    return [e.ids for e in encoded]

  def decode(self, ids):
    return self._tok.decode(self._before_eos(ids))


# A run's own copy of the tokenizer file it reads, in its workdir (`keep`).
KEPT_NAMES = ("tokenizer.model", "tokenizer.json")


def keep(spec: str, workdir):
  """Copies the tokenizer file `spec` reads into `workdir`, once (process
  0's job), so that the run's checkpoint is read, and the run resumed,
  with the pieces it was trained with wherever the workdir moves: a
  relative path, or a `digits` model trained again by another
  SentencePiece version, might not give them."""
  if spec == NO_TEXTS or kept(workdir):
    return
  source = _digits_model() if spec == DIGITS else str(paths.resolve(spec))
  name = KEPT_NAMES[1] if source.endswith(".json") else KEPT_NAMES[0]
  paths.write_whole(
      paths.resolve(workdir) / name,
      paths.resolve(source).read_bytes())


def kept(workdir) -> str | None:
  """The tokenizer file a run's workdir keeps (`keep`); None: none."""
  for name in KEPT_NAMES:
    path = paths.resolve(workdir) / name
    if path.is_file():
      return str(path)
  return None


class Lowercased(Tokenizer):
  """Another tokenizer's pieces of the texts lower-cased (SigLIP 2's)."""

  def __init__(self, tokenizer: Tokenizer):
    self._tokenizer = tokenizer
    self.vocab_size, self.eos_id = tokenizer.vocab_size, tokenizer.eos_id

  def pieces(self, texts):
    return self._tokenizer.pieces([text.lower() for text in texts])

  def decode(self, ids):
    return self._tokenizer.decode(ids)


def load_tokenizer(spec: str, lowercase: bool = False) -> Tokenizer:
  """The tokenizer of config.text.tokenizer: a SentencePiece `.model`
  file, a Hugging Face `tokenizer.json` (local or at a URL) or 'digits';
  with `lowercase` (config.text.lowercase), of the texts lower-cased."""
  if lowercase:
    return Lowercased(load_tokenizer(spec))
  if spec == DIGITS:
    return _load(_digits_model())
  if spec == NO_TEXTS:
    raise UserError("This image-text model was loaded without a tokenizer "
                    "(a two-tower file ships none): give --tokenizer.")
  path = paths.resolve(spec)
  if not spec or not path.is_file():
    raise UserError(f"Tokenizer {spec!r}: no such file. "
                    f"config.text.tokenizer takes {_FORMS}.")
  return _load(str(path))


def for_text(text) -> Tokenizer:
  """The tokenizer `config.text` (or a `specs.TextSpec`) names, of its texts
  lower-cased where it says so."""
  return load_tokenizer(text.tokenizer, text.lowercase)


@functools.lru_cache(maxsize=None)
def _load(path: str) -> Tokenizer:
  """One tokenizer per file and process (files are not changed in place)."""
  if path.endswith(".json"):
    return HuggingFaceTokenizer(paths.resolve(path).read_text(), path)
  return SentencePieceTokenizer(paths.resolve(path).read_bytes(), path)


def train_sentencepiece(texts: Sequence[str], vocab_size: int,
                        model_prefix: str, model_type: str = "bpe") -> str:
  """Trains a SentencePiece model (BPE or unigram) of at most `vocab_size`
  pieces on `texts`, with SigLIP's special ids (EOS 1, pad 0, no BOS);
  writes `{model_prefix}.model` (whole or not at all) and returns its path.
  The same texts give the same file: one thread, in their order."""
  import sentencepiece  # pylint: disable=g-import-not-at-top
  model = io.BytesIO()
  # hard_vocab_limit off: few texts make fewer pieces than asked, no error.
  sentencepiece.SentencePieceTrainer.train(
      sentence_iterator=iter(list(texts)), model_writer=model,
      vocab_size=vocab_size, model_type=model_type, character_coverage=1.0,
      hard_vocab_limit=False, num_threads=1, minloglevel=2, **_SPECIAL_IDS)
  path = f"{model_prefix}.model"
  # Whole or not at all: processes training it at once never read half.
  paths.write_whole(path, model.getvalue())
  return path


def _digits_model() -> str:
  """The `digits` tokenizer's file, trained into the cache on first use.
  Its name carries a digest of the captions and settings, so a change of
  either trains a new one."""
  from vit_jax.data import digits_captions  # pylint: disable=g-import-not-at-top
  texts = digits_captions.all_captions()
  settings = [texts, DIGITS_MODEL, _SPECIAL_IDS]
  digest = hashlib.sha256(json.dumps(settings).encode()).hexdigest()[:12]
  root = os.environ.get("VIT_JAX_CACHE_DIR") or "~/.cache/vit_jax"
  if paths.is_remote(root):
    raise UserError(f"VIT_JAX_CACHE_DIR={root} must be a local directory "
                    "(the digits tokenizer is kept there).")
  prefix = os.path.join(os.path.expanduser(root), "tokenizers",
                        f"{DIGITS}-{digest}")
  if os.path.isfile(f"{prefix}.model"):
    return os.path.abspath(f"{prefix}.model")
  return os.path.abspath(
      train_sentencepiece(texts, model_prefix=prefix, **DIGITS_MODEL))


def tokenize_fn(tokenizer: Tokenizer, length: int):
  """A tf function: tf.string[...] -> tf.int32[..., length] (`encode`)."""

  def encode(values):
    values = np.asarray(values)
    texts = [v.decode("utf-8") for v in values.reshape(-1)]
    ids = tokenizer.encode(texts, length)
    return ids.reshape(values.shape + (length,))

  def fn(strings):
    ids = tf.numpy_function(encode, [strings], tf.int32, stateful=False)
    return tf.ensure_shape(ids, strings.shape.concatenate([length]))

  return fn


def text_fn(text: specs.TextSpec):
  """(an example's text feature: one string or a list, its seed) -> its
  outputs: "text" int32[L], one caption drawn with the seed; with
  `all_captions`, "texts" int32[C, L] and "texts_mask" f32[C] (1: a
  caption, 0: padding), its first C = `max_captions` captions."""
  tokenize = tokenize_fn(for_text(text), text.length)
  count = text.max_captions

  def one(strings, seed):
    strings = tf.concat([tf.reshape(strings, [-1]), [""]], 0)  # "": none.
    seed = tf.random.experimental.stateless_fold_in(seed, _CAPTION_STREAM)
    drawn = tf.random.stateless_uniform([], seed, maxval=tf.maximum(
        tf.size(strings) - 1, 1), dtype=tf.int32)
    return {"text": tokenize(strings[drawn])}

  def every(strings, seed):
    del seed  # Every caption, in order.
    strings = tf.reshape(strings, [-1])[:count]
    real = tf.size(strings)
    padded = tf.concat([strings, tf.fill([count - real], "")], 0)
    return {
        "texts": tokenize(tf.ensure_shape(padded, [count])),
        "texts_mask": tf.cast(tf.range(count) < real, tf.float32)
    }

  return every if text.all_captions else one
