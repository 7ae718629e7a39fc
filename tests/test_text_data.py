"""Text in the data pipeline: tokenizers in SigLIP's sticky-EOS form, the
built-in `digits_captions` and its captions as token ids in training and
evaluation batches."""

import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
import tokenizers

from vit_jax import objectives
from vit_jax import weights
from vit_jax.config import defaults
from vit_jax.data import digits_captions
from vit_jax.data import input_pipeline
from vit_jax.data import sources
from vit_jax.data import specs
from vit_jax.data import tokenizer
from vit_jax.errors import UserError

LENGTH = 8


def _hf_tokenizer(path, eos="</s>") -> str:
  """A word-level tokenizer.json over a few words (and `eos`)."""
  words = [eos, "<unk>", "a", "photo", "of", "three"]
  vocab = {word: i for i, word in enumerate(words)}
  tok = tokenizers.Tokenizer(
      tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  tok.save(str(path))
  return str(path)


@pytest.fixture(autouse=True)
def tokenizer_cache(tmp_path_factory, monkeypatch):
  """The digits tokenizer is trained into a folder of the test run's."""
  monkeypatch.setenv("VIT_JAX_CACHE_DIR",
                     str(tmp_path_factory.getbasetemp() / "text_cache"))


def test_tokenizers_end_every_text_with_eos(tmp_path, monkeypatch):
  monkeypatch.setenv("VIT_JAX_CACHE_DIR", str(tmp_path / "cache"))
  tok = tokenizer.load_tokenizer("digits")
  models = os.listdir(tmp_path / "cache" / "tokenizers")
  assert len(models) == 1 and models[0].endswith(".model")  # No temp file.
  model = tmp_path / "cache" / "tokenizers" / models[0]
  written = os.stat(model).st_mtime_ns
  assert tokenizer.load_tokenizer("digits") is tok  # Cached, not retrained.
  assert os.stat(model).st_mtime_ns == written
  assert tok.eos_id == 1 and tok.vocab_size == 128
  # The same texts train the same model.
  prefix = str(tmp_path / "again")
  again = tokenizer.train_sentencepiece(digits_captions.all_captions(),
                                        model_prefix=prefix,
                                        **tokenizer.DIGITS_MODEL)
  assert again == str(tmp_path / "again.model")
  assert (tmp_path / "again.model").read_bytes() == model.read_bytes()

  texts = digits_captions.all_captions()
  ids = tok.encode(texts, LENGTH)
  assert ids.dtype == np.int32 and ids.shape == (len(texts), LENGTH)
  assert (ids[:, -1] == tok.eos_id).all()
  assert [tok.decode(row) for row in ids] == texts  # Round trip.
  for text, row in zip(texts, ids):  # EOS after the pieces, to the end.
    pieces = tok.pieces([text])[0]
    assert list(row[:len(pieces)]) == pieces
    assert (row[len(pieces):] == tok.eos_id).all()
  lower = tokenizer.load_tokenizer("digits", lowercase=True)  # SigLIP 2's.
  np.testing.assert_array_equal(lower.encode(["The Number 3"], LENGTH),
                                tok.encode(["the number 3"], LENGTH))
  assert (lower.vocab_size, lower.eos_id) == (tok.vocab_size, tok.eos_id)
  cut = tok.encode(["a handwritten digit seven"], 3)[0]
  assert list(cut) == tok.pieces(["a handwritten digit seven"])[0][:2] + [1]

  hf = tokenizer.load_tokenizer(_hf_tokenizer(tmp_path / "tokenizer.json"))
  ids = hf.encode(["a photo of three", "three"], 6)  # </s> is 0 here.
  np.testing.assert_array_equal(ids, [[2, 3, 4, 5, 0, 0], [5, 0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(hf.encode(["a photo of three"], 3), [[2, 3, 0]])
  assert hf.decode([2, 3, 0, 0]) == "a photo"

  encode = tokenizer.tokenize_fn(tok, LENGTH)
  assert encode(tf.constant("the number 3")).shape == (LENGTH,)
  both = encode(tf.constant(["the number 3", "three"]))
  np.testing.assert_array_equal(both,
                                tok.encode(["the number 3", "three"], LENGTH))

  no_eos = _hf_tokenizer(tmp_path / "no_eos.json", eos="<pad>")
  with pytest.raises(UserError, match="no_eos.json.*</s>"):
    tokenizer.load_tokenizer(no_eos)
  with pytest.raises(UserError, match="missing.model.*SentencePiece"):
    tokenizer.load_tokenizer(str(tmp_path / "missing.model"))
  (tmp_path / "bad.model").write_bytes(b"not a model")
  with pytest.raises(UserError, match="bad.model is not a SentencePiece"):
    tokenizer.load_tokenizer(str(tmp_path / "bad.model"))

  # A run keeps its tokenizer's file in its workdir, once; resuming it reads
  # that file whatever its config names.
  workdir = tmp_path / "run"
  assert tokenizer.kept(workdir) is None
  tokenizer.keep("digits", workdir)
  assert (workdir / "tokenizer.model").read_bytes() == model.read_bytes()
  tokenizer.keep(_hf_tokenizer(tmp_path / "other.json"), workdir)  # Kept.
  assert tokenizer.kept(workdir) == str(workdir / "tokenizer.model")
  assert os.listdir(workdir) == ["tokenizer.model"]
  config = defaults.get_config()
  config.objective, config.text.tokenizer = "siglip", "digits"
  resumed = objectives.decide(config, resumed_workdir=str(workdir))
  assert resumed.text.tokenizer == str(workdir / "tokenizer.model")
  assert resumed.text.vocab_size == 128
  assert weights.decide(config).text.tokenizer == "digits"


@pytest.fixture(scope="module")
def captions_dir(tmp_path_factory) -> str:
  """A TFDS data_dir with digits_captions prepared (ArrayRecord)."""
  data_dir = str(tmp_path_factory.mktemp("tfds_captions"))
  tfds.builder(digits_captions.NAME, data_dir=data_dir,
               file_format="array_record").download_and_prepare()
  return data_dir


def _spec(data_dir, split, batch_size, **text) -> specs.DataSpec:
  text = dict(key="captions", tokenizer="digits", length=LENGTH) | text
  return specs.DataSpec(dataset=digits_captions.NAME, split=split,
                        pp="resize|value_range", image_size=8,
                        batch_size=batch_size, cache=False, data_dir=data_dir,
                        manual_dir=None, seed=3, text=specs.TextSpec(**text))


def _label_of(caption: str) -> int:
  return next(k for k in range(10) if caption in digits_captions.captions(k))


def test_training_draws_one_caption_per_example_by_its_seed(captions_dir):
  config = defaults.get_config()
  config.objective = "siglip"
  assert objectives.training_data(config).text == specs.TextSpec(
      "captions", "digits", 16)
  assert not objectives.of(config).carries(config).labels
  config.objective = "supervised"
  assert objectives.training_data(config).text is None

  # 16 images in batches of 8: each image once in every 2 steps.
  spec = _spec(captions_dir, "train[:16]", 8)
  source = input_pipeline.make_source(spec)
  tok = tokenizer.load_tokenizer("digits")
  stream = input_pipeline.make_train_iterator(spec, source, labels=False)
  batches = [next(stream) for _ in range(8)]
  stream.close()
  assert set(batches[0]) == {"image", "text", "mask"}  # No labels.
  text = batches[0]["text"]
  assert text.dtype == np.int32 and text.shape == (8, LENGTH)
  resumed = input_pipeline.make_train_iterator(spec, source, start_step=5,
                                               labels=False)
  for name, value in next(resumed).items():  # A resume is exact.
    np.testing.assert_array_equal(value, batches[5][name])
  resumed.close()

  drawn = {}  # Each image's captions, over its 4 epochs.
  for batch in batches:
    assert (batch["text"][:, -1] == tok.eos_id).all()
    for image, ids in zip(batch["image"], batch["text"]):
      drawn.setdefault(image.tobytes(), []).append(tok.decode(ids))
  assert len(drawn) == 16
  for captions in drawn.values():  # All of one digit.
    assert len({_label_of(c) for c in captions}) == 1
  assert max(len(set(c)) for c in drawn.values()) > 1  # Drawn anew.


def test_evaluation_reads_every_caption_and_pads(captions_dir):
  # 20 images in batches of 8: the last batch has 4 padding rows; 6
  # captions a row: the 6th is padding.
  spec = _spec(captions_dir, "test[:20]", 8, all_captions=True, max_captions=6)
  source = input_pipeline.make_source(spec)
  tok = tokenizer.load_tokenizer("digits")
  batches = list(input_pipeline.make_eval_batches(spec, source)())
  assert len(batches) == 3
  assert set(batches[0]) == {"image", "labels", "texts", "texts_mask", "mask"}
  texts = np.concatenate([b["texts"] for b in batches])
  masks = np.concatenate([b["texts_mask"] for b in batches])
  real = np.concatenate([b["mask"] for b in batches]) == 1
  labels = np.concatenate([b["labels"] for b in batches]).argmax(-1)
  assert texts.dtype == np.int32 and texts.shape == (24, 6, LENGTH)
  assert masks.dtype == np.float32 and masks.shape == (24, 6)
  assert real.sum() == 20 and not real[20:].any()
  np.testing.assert_array_equal(masks[real], [[1] * 5 + [0]] * 20)
  assert (masks[~real] == 0).all()
  for row, label in zip(texts[real], labels[real]):
    decoded = [tok.decode(ids) for ids in row[:5]]
    assert decoded == digits_captions.captions(label)
    assert (row[5] == tok.eos_id).all()  # An empty caption.

  no_such_key = _spec(captions_dir, "test", 8, key="caption")
  said = "'digits_captions' has no text feature 'caption'.*label, captions"
  with pytest.raises(UserError, match=said):
    input_pipeline.make_source(no_such_key)


def test_a_text_inside_a_nested_feature_is_named_by_its_path():
  """coco_captions' captions are `captions/text`: a Text in a sequence of
  feature dicts; the path finds it, and a dict is not a text."""
  features = tfds.features.FeaturesDict({
      "image": tfds.features.Image(),
      "captions": tfds.features.Sequence({
          "id": np.int64,
          "text": tfds.features.Text()
      })
  })
  found = sources._text_feature(features, "captions/text")  # pylint: disable=protected-access
  assert isinstance(found, tfds.features.Text)
  assert not isinstance(
      sources._text_feature(features, "captions"),  # pylint: disable=protected-access
      tfds.features.Text)
  assert sources._text_feature(features, "caption") is None  # pylint: disable=protected-access
  assert sources.text_of({"captions": {
      "text": "a cat"
  }}, "captions/text") == ("a cat")
