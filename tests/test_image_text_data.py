"""img2dataset's outputs as image-text data: both layouts listed once into
the index dir, read by index into the same examples, resumed exactly."""

import gzip
import io
import json
import shutil
import tarfile

import numpy as np
from PIL import Image
import pytest
import tokenizers

from vit_jax.data import img2dataset_listing
from vit_jax.data import input_pipeline
from vit_jax.data import specs
from vit_jax.data import tokenizer
from vit_jax.errors import UserError

SAMPLES = 12  # In two shards (folders) of 6.
NO_CAPTION = 4  # The sample whose caption is missing.
LENGTH = 8


def _key(i: int) -> str:
  return f"{i // 6:05d}{i % 6:04d}"  # img2dataset's: shard, then sample.


def _image(i: int) -> tuple[str, bytes]:
  """A small random image: PNG for even samples, JPEG for odd ones."""
  pixels = np.random.default_rng(i).integers(0, 256, (10 + i, 12, 3))
  out = io.BytesIO()
  kind = "png" if i % 2 == 0 else "jpg"
  Image.fromarray(pixels.astype(np.uint8)).save(
      out, "PNG" if kind == "png" else "JPEG")
  return kind, out.getvalue()


def _members(i: int) -> dict[str, bytes]:
  """A sample's files as img2dataset writes them (image, caption, meta)."""
  kind, data = _image(i)
  members = {f"{_key(i)}.{kind}": data}
  if i != NO_CAPTION:
    members[f"{_key(i)}.txt"] = f"a photo of {i}".encode()
  members[f"{_key(i)}.json"] = json.dumps({"key": _key(i)}).encode()
  return members


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict:
  """{"webdataset": ROOT, "files": ROOT}: the same samples in each layout,
  with img2dataset's per-shard parquet and stats files beside them."""
  roots = {}
  for layout in ("webdataset", "files"):
    root = tmp_path_factory.mktemp(layout)
    for shard in range(SAMPLES // 6):
      (root / f"{shard:05d}.parquet").write_bytes(b"")
      (root / f"{shard:05d}_stats.json").write_text("{}")
      samples = range(6 * shard, 6 * shard + 6)
      if layout == "files":
        (root / f"{shard:05d}").mkdir()
        for name, data in (m for i in samples for m in _members(i).items()):
          (root / f"{shard:05d}" / name).write_bytes(data)
        continue
      with tarfile.open(root / f"{shard:05d}.tar", "w") as tar:
        for name, data in (m for i in samples for m in _members(i).items()):
          info = tarfile.TarInfo(name)
          info.size = len(data)
          tar.addfile(info, io.BytesIO(data))
    roots[layout] = str(root)
  return roots


@pytest.fixture(scope="module")
def words(tmp_path_factory) -> str:
  """A word-level tokenizer.json of the captions' words."""
  vocab = ["</s>", "<unk>", "a", "photo", "of"] + [str(i) for i in range(12)]
  tok = tokenizers.Tokenizer(
      tokenizers.models.WordLevel({
          w: i for i, w in enumerate(vocab)
      }, unk_token="<unk>"))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
  tok.save(str(path))
  return str(path)


def _spec(root, words, split="train", batch_size=4, key="caption"):
  return specs.DataSpec(
      dataset=f"img2dataset:{root}", split=split, pp="resize|value_range",
      image_size=8, batch_size=batch_size, cache=False,
      data_dir=None, manual_dir=None, seed=3, text=specs.TextSpec(
          key=key, tokenizer=words, length=LENGTH))


def _samples(source, split="train") -> dict[str, tuple[bytes, str]]:
  """{key: (image bytes, caption)} of the split, read by index."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  reader = source.index_reader(split)
  records = tf.data.Dataset.from_tensor_slices(
      reader.read(tf.range(reader.size, dtype=tf.int64))).map(source.fetch)
  return {
      key: (r["image"], r["caption"].decode())
      for key, r in zip(source.keys(split), records.as_numpy_iterator())
  }


def test_listing_is_written_once_and_read_again(outputs, words, tmp_path,
                                                monkeypatch):
  for layout, root in outputs.items():
    index_dir = tmp_path / layout
    source = input_pipeline.make_source(_spec(root, words), str(index_dir))
    written = list(index_dir.glob("img2dataset_index_*.json.gz"))
    assert len(written) == 1
    listing = json.loads(gzip.decompress(written[0].read_bytes()))
    assert listing["layout"] == source.layout == layout
    assert listing["left_out"] == {"no image": 0, "no caption": 1}
    assert list(listing["parts"]) == (["00000.tar", "00001.tar"] if layout
                                      == "webdataset" else ["00000", "00001"])
    assert source.num_examples("train") == SAMPLES - 1
    assert source.num_classes == 0
    held_out = source.keys("train[75%:]")  # Random, disjoint slices.
    assert len(held_out) == source.num_examples("train[75%:]") == 3
    assert set(held_out).isdisjoint(source.keys("train[:75%]"))
    assert sorted(held_out) != sorted(source.keys("train"))[-3:]

    def no_listing(root):
      raise AssertionError(f"{root} listed again")

    with monkeypatch.context() as patched:  # A resumed run reads the index.
      patched.setattr(img2dataset_listing, "list_output", no_listing)
      again = input_pipeline.make_source(_spec(root, words), str(index_dir))
    assert again.keys("train") == source.keys("train")


def test_both_layouts_give_the_same_samples(outputs, words):
  by_layout = {
      layout: input_pipeline.make_source(_spec(root, words))
      for layout, root in outputs.items()
  }
  webdataset, files = (_samples(by_layout[k]) for k in outputs)
  expected = {
      _key(i): (_image(i)[1], f"a photo of {i}")
      for i in range(SAMPLES)
      if i != NO_CAPTION
  }
  assert webdataset == files == expected
  assert by_layout["webdataset"].keys("train") == by_layout["files"].keys(
      "train")


def test_training_batches_resume_exactly_in_either_layout(outputs, words):
  tok = tokenizer.load_tokenizer(words)
  streams = {}
  for layout, root in outputs.items():
    spec = _spec(root, words)
    source = input_pipeline.make_source(spec)
    stream = input_pipeline.make_train_iterator(spec, source, labels=False)
    streams[layout] = [next(stream) for _ in range(4)]
    stream.close()
  batches = streams["webdataset"]
  assert set(batches[0]) == {"image", "text", "mask"}
  assert batches[0]["image"].shape == (4, 8, 8, 3)
  assert batches[0]["text"].shape == (4, LENGTH)
  for batch, same in zip(batches, streams["files"]):  # Same keys, same order.
    for name, value in batch.items():
      np.testing.assert_array_equal(value, same[name])
  captions = {tok.decode(ids) for b in batches for ids in b["text"]}
  assert captions <= {f"a photo of {i}" for i in range(SAMPLES)}
  # The first 11 examples are an epoch: every sample once.
  assert f"a photo of {NO_CAPTION}" not in captions and len(captions) == 11

  # The files layout's (the loop's last) stream, resumed at step 2.
  resumed = input_pipeline.make_train_iterator(spec, source, start_step=2,
                                               labels=False)
  for name, value in next(resumed).items():  # A resume is a seek.
    np.testing.assert_array_equal(value, batches[2][name])
  resumed.close()

  held_out = _spec(outputs["webdataset"], words, "train[75%:]", 2)
  eval_batches = list(
      input_pipeline.numpy_eval_batches(held_out,
                                        input_pipeline.make_source(held_out),
                                        labels=False))
  assert sum(b["mask"].sum() for b in eval_batches) == 3  # Each once.


def test_mistakes_are_one_line_errors(outputs, words, tmp_path):
  missing = tmp_path / "no_such_output"
  with pytest.raises(UserError, match=f"{missing} does not exist") as e:
    input_pipeline.make_source(_spec(missing, words))
  assert "\n" not in str(e.value)
  with pytest.raises(UserError, match="no text feature 'text'.*caption"):
    input_pipeline.make_source(_spec(outputs["files"], words, key="text"))
  source = input_pipeline.make_source(_spec(outputs["files"], words))
  with pytest.raises(UserError, match="no split 'test'.*train\\[:99%\\]"):
    source.num_examples("test")

  # A shard gone since it was listed stops the run, naming it.
  root = tmp_path / "copy"
  shutil.copytree(outputs["webdataset"], root)
  spec = _spec(root, words, batch_size=2)
  source = input_pipeline.make_source(spec)
  (root / "00001.tar").unlink()
  with pytest.raises(UserError, match="00001.tar cannot be read"):
    list(input_pipeline.numpy_eval_batches(spec, source, labels=False))
