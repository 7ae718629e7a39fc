"""Records read by index (vit_jax/data/global_order.py): each epoch a seeded
permutation of the whole split, each process its rows of every global batch,
so a resume is a seek and any process count continues the same sequence;
TFRecord datasets read in sequence still, and `vit-jax convert-data`."""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest
import tensorflow_datasets as tfds

from tests.helpers import processes
from vit_jax.data import global_order
from vit_jax.data import input_pipeline
from vit_jax.data import sources
from vit_jax.data import specs
from vit_jax.data import throughput
from vit_jax.data import to_array_record
from vit_jax.errors import UserError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_each_epoch_is_a_seeded_permutation_of_the_whole_split():
  order = global_order.Order(1000, seed=3)
  epochs = order.records(np.arange(3000)).reshape(3, 1000)
  for epoch in epochs:
    np.testing.assert_array_equal(np.sort(epoch), np.arange(1000))
  assert not np.array_equal(epochs[0], epochs[1])
  # Not a window: the first 100 records come from all over the split.
  assert epochs[0, :100].max() - epochs[0, :100].min() > 900
  again = global_order.Order(1000, seed=3).records(np.arange(1990, 2010))
  np.testing.assert_array_equal(again, epochs.reshape(-1)[1990:2010])
  other = global_order.Order(1000, seed=4).records(np.arange(1000))
  assert not np.array_equal(other, epochs[0])


@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_the_processes_rows_tile_each_global_batch_in_order(count):
  local_batch, steps = 5, 4
  rows = np.stack([
      global_order.position(np.arange(steps * local_batch), local_batch, p,
                            count).reshape(steps, local_batch)
      for p in range(count)
  ], 1).reshape(-1)
  np.testing.assert_array_equal(rows, np.arange(steps * local_batch * count))


def test_shares_cover_the_split_once():
  for size, count in ((360, 7), (5, 8), (1437, 4)):
    shares = [global_order.share(size, i, count) for i in range(count)]
    assert shares[0][0] == 0 and shares[-1][1] == size
    assert all(a[1] == b[0] for a, b in zip(shares, shares[1:]))
    assert global_order.largest_share(size, count) == -(-size // count)


def _augmenting(config, batch_size=256):
  config.pp_train = "inception_crop|flip_lr|value_range"
  config.batch_size = batch_size
  return specs.training(config)


def _batches(spec, source, start_step, steps, index=0, count=1):
  ds = input_pipeline.make_train_dataset(spec, source, process_index=index,
                                         process_count=count,
                                         start_step=start_step)
  return [b["image"] for b in ds.take(steps).as_numpy_iterator()]


def test_a_resumed_stream_is_the_uninterrupted_one_bit_for_bit(digits_config):
  spec = _augmenting(digits_config)  # 1,437 records: 5.6 batches an epoch.
  source = input_pipeline.make_source(spec)
  assert source.reads_by_index
  whole = _batches(spec, source, 0, 8)
  resumed = _batches(spec, source, 5, 3)  # Across the epoch's end.
  for a, b in zip(whole[5:], resumed):
    np.testing.assert_array_equal(a, b)
  assert not np.array_equal(whole[5], whole[6])


def test_any_process_count_continues_the_same_global_sequence(digits_config):
  spec = _augmenting(digits_config)
  source = input_pipeline.make_source(spec)
  one = _batches(spec, source, 3, 2)  # Stopped on 2 processes, or on 1 ...
  for count in (2, 4):  # ... resumed on 1, or on 4: the same batches.
    shares = [_batches(spec, source, 3, 2, p, count) for p in range(count)]
    for step in range(2):
      np.testing.assert_array_equal(
          np.concatenate([share[step] for share in shares]), one[step])


def test_a_late_start_reads_only_the_records_it_needs(digits_config,
                                                      monkeypatch):
  read = []
  real = sources.TfdsIndexReader._read  # pylint: disable=protected-access

  def counted(self, indices):
    read.append(len(indices))
    return real(self, indices)

  monkeypatch.setattr(sources.TfdsIndexReader, "_read", counted)
  spec = _augmenting(digits_config, batch_size=32)
  source = input_pipeline.make_source(spec)
  late = input_pipeline.make_train_iterator(spec, source, start_step=10**9)
  assert next(late)["image"].shape[0] == 32  # Epoch 22 million.
  late.close()
  # A seek: a few chunks in flight, not 32e9 records skipped.
  assert sum(read) < 50 * 64


@pytest.fixture(scope="module")
def tfrecord_digits(tmp_path_factory):
  """digits in TFRecord files, as TFDS prepares datasets by default."""
  data_dir = str(tmp_path_factory.mktemp("tfrecord"))
  sources._builder(
      "digits",
      data_dir,  # pylint: disable=protected-access
      file_format="tfrecord").download_and_prepare()
  return data_dir


def test_tfrecord_files_train_in_sequence_and_name_the_conversion(
    digits_config, tfrecord_digits, capsys):
  digits_config.data_dir = tfrecord_digits
  spec = specs.training(digits_config)
  source = input_pipeline.make_source(spec)
  assert not source.reads_by_index
  batches = input_pipeline.make_train_iterator(spec, source, start_step=3)
  assert next(batches)["image"].shape[0] == digits_config.batch_size
  batches.close()
  told = capsys.readouterr().err
  assert "a resumed run skips through up to an epoch" in told
  command = ("vit-jax convert-data --dataset=digits "
             f"--data_dir={tfrecord_digits}")
  assert command in told


def _run(*args):
  return subprocess.run([sys.executable, "-m", "vit_jax", *args], cwd=REPO,
                        capture_output=True, text=True, timeout=300)


def test_convert_data_rewrites_tfrecord_files_as_array_record(
    digits_config, tfrecord_digits, tmp_path):
  digits_config.data_dir = tfrecord_digits
  spec = specs.evaluation(digits_config)
  before = list(
      input_pipeline.numpy_eval_batches(spec, input_pipeline.make_source(spec)))
  done = _run("convert-data", "--dataset=digits",
              f"--data_dir={tfrecord_digits}")
  assert done.returncode == 0, done.stderr
  assert json.loads(done.stdout.splitlines()[-1])["records"] == 1797
  source = input_pipeline.make_source(spec)
  assert source.reads_by_index
  after = list(input_pipeline.numpy_eval_batches(spec, source))
  for a, b in zip(before, after, strict=True):  # The same split, in order.
    for key in a:
      np.testing.assert_array_equal(a[key], b[key])
  builder = tfds.builder("digits", data_dir=tfrecord_digits)
  assert builder.info.file_format.value == "array_record"
  assert list(builder.info.as_proto.alternative_file_formats) == ["tfrecord"]
  # A shard damaged since: named, with the fix, which writes it again.
  shard = next(pathlib.Path(builder.data_dir).glob("*-test.array_record-*"))
  os.truncate(shard, shard.stat().st_size // 2)
  fix = ("Its TFRecord files are kept beside it: delete the file and run "
         "`vit-jax convert-data --dataset=digits "
         f"--data_dir={tfrecord_digits}`, which writes it again.")
  source = input_pipeline.make_source(spec)
  with pytest.raises(UserError) as raised:
    list(input_pipeline.numpy_eval_batches(spec, source))
  said = str(raised.value)
  assert said.startswith(f"{shard} cannot be read") and said.endswith(fix)
  shard.unlink()
  assert to_array_record.convert(builder) == {
      "dataset": "digits/1.0.0",
      "converted": 1,
      "records": 360
  }
  again = list(
      input_pipeline.numpy_eval_batches(spec, input_pipeline.make_source(spec)))
  np.testing.assert_array_equal(again[0]["image"], after[0]["image"])
  unprepared = _run("convert-data", "--dataset=digits",
                    f"--data_dir={tmp_path}")
  assert unprepared.returncode != 0
  assert unprepared.stderr.strip().splitlines()[-1] == (
      f"error: digits is not prepared in {tmp_path}; nothing to convert "
      "(vit-jax train prepares new datasets as ArrayRecord already).")


def test_the_benchmark_times_the_first_batch_of_a_late_start(digits_config):
  result = throughput.measure(digits_config, num_batches=2, start_step=10**6)
  assert result["read_by_index"] and result["start_step"] == 10**6
  assert 0 < result["first_batch_s"] and result["images_per_sec"] > 0
  # Its positions are int64: a start past the last step is refused at once
  # (the stream would end before its batches).
  refused = (
      r"^start_step=200000000000000000 with the 4 batches read from it "
      r"goes past the stream's last step, 144115188075855871 \(batches "
      r"of 32 images; .*give a start step from 0 to 144115188075855868.$")
  with pytest.raises(UserError, match=refused):
    throughput.measure(digits_config, num_batches=2, start_step=2 * 10**17)


def test_a_damaged_shard_ends_the_command_with_one_line(tfds_data_dir,
                                                        tmp_path):
  """ArrayRecord's reader fails in tf.data's threads, on a shard with bytes
  overwritten (one cut short fails alike, as it is opened): `vit-jax train`
  names the shard and the fix in one line and exits with status 2 at once
  (its input pipeline stopped, not left to hang the exit), its new workdir
  unmade."""
  data_dir = tmp_path / "tfds"
  shutil.copytree(tfds_data_dir, data_dir)
  shard = next(data_dir.glob("digits/*/digits-train.array_record-*"))
  size = shard.stat().st_size
  with open(shard, "r+b") as f:  # Most records' chunks: the first read.
    f.seek(size // 8)
    f.write(b"\xff" * (size * 3 // 4))
  done = subprocess.run([
      sys.executable, "-m", "vit_jax", "train",
      "--config=configs/digits.py:runlocal", f"--config.data_dir={data_dir}",
      f"--workdir={tmp_path / 'run'}"
  ], cwd=REPO, env=processes.command_env(), capture_output=True, text=True,
                        timeout=120)
  assert done.returncode == 2, done.stderr[-3000:]
  error, = done.stderr.strip().splitlines()
  assert error.startswith(f"error: {shard} cannot be read (Corrupted "
                          "Riegeli/records file"), error
  assert error.endswith(
      f"the file is damaged or gone. Delete the dataset's folder "
      f"{shard.parent} and run again: the dataset is prepared anew."), error
  assert not (tmp_path / "run").exists()


def test_array_record_files_on_object_storage_ask_for_a_mount():
  builder = types.SimpleNamespace(data_dir="gs://bucket/tfds/digits/1.0.0")
  with pytest.raises(UserError, match="mount the bucket .gcsfuse"):
    sources.TfdsIndexReader(builder, "train")
