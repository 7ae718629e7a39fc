"""A TFDS dataset's TFRecord files rewritten as ArrayRecord, in place
(`vit-jax convert-data`), so that training reads its records by index.

Each TFRecord shard is copied record by record (the serialized examples
unchanged) to the ArrayRecord shard of the same name and split, written
as TFDS writes them (group size 1: one record per chunk, read alone), under
a temporary name and renamed when complete. Only then does the dataset's
`dataset_info.json` name ArrayRecord its format (TFRecord stays listed as
an alternative, and its files are kept), written whole and renamed: a
conversion that is stopped leaves the dataset as it was, and running it
again starts over. On a converted dataset it writes again the ArrayRecord
files deleted since (a damaged one). Convert a dataset while no run reads
it.

TFDS's own converter (`tfds convert_format`, 4.9.10) needs Apache Beam and
mlcroissant to start, and on this dataset layout stops at its metadata
step ("Found 0 shards for split train, but expected 1"), so the project
does the copy itself with TFDS's metadata and ArrayRecord's writer.
"""

from __future__ import annotations

import concurrent.futures

from vit_jax import console
from vit_jax import paths
from vit_jax.config import imports
from vit_jax.errors import UserError

tf = imports.lazy("tensorflow")
tfds = imports.lazy("tensorflow_datasets")

WRITER_OPTIONS = "group_size:1"  # As TFDS's ArrayRecord adapter writes.
THREADS = 4


def _copy_shard(source: str, target: str) -> int:
  """Copies one TFRecord shard's records to `target`; returns the count."""
  from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top
  partial = target + ".incomplete"
  writer = array_record_module.ArrayRecordWriter(partial, WRITER_OPTIONS)
  count = 0
  for record in tf.data.TFRecordDataset(source).as_numpy_iterator():
    writer.write(record)
    count += 1
  writer.close()
  paths.resolve(partial).replace(target)
  return count


def shards(builder) -> list[tuple[str, str, int]]:
  """(TFRecord file, ArrayRecord file, records) of every split's shards."""
  out = []
  for split in builder.info.splits.values():
    for path, length in zip(split.filepaths, split.shard_lengths):
      path = str(path).replace(".array_record-", ".tfrecord-")  # Converted.
      if ".tfrecord-" not in path:
        raise UserError(f"{path} is not a TFRecord shard of "
                        f"{builder.info.full_name}.")
      out.append((path, path.replace(".tfrecord-", ".array_record-"), length))
  return out


def _copy_shards(builder, todo) -> list[int]:
  with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
    counts = list(
        console.progress(pool.map(lambda s: _copy_shard(s[0], s[1]), todo),
                         len(todo), f"Converting {builder.info.full_name}"))
  for (source, _, expected), count in zip(todo, counts):
    if count != expected:
      raise UserError(f"{source} holds {count} records; its dataset_info "
                      f"says {expected}. The dataset is damaged: prepare "
                      "it again.")
  return counts


def _rewrite_deleted(builder) -> dict:
  """A converted dataset's ArrayRecord files that were deleted (a damaged
  one: `sources.repair`) written again from the TFRecord files kept."""
  kept = (tfds.core.FileFormat.TFRECORD.value
          in builder.info.as_proto.alternative_file_formats)
  todo = [s for s in shards(builder) if not paths.resolve(s[1]).exists()]
  gone = [s[1] for s in todo if not kept or not paths.resolve(s[0]).exists()]
  if gone:
    raise UserError(f"{gone[0]} is missing, and no TFRecord file is kept to "
                    f"write it from: delete {builder.data_dir} and run again "
                    "(the dataset is prepared anew).")
  counts = _copy_shards(builder, todo) if todo else []
  return {
      "dataset": builder.info.full_name,
      "converted": len(todo),
      "records": sum(counts)
  }


def convert(builder) -> dict:
  """Rewrites the prepared `builder`'s TFRecord files as ArrayRecord (of a
  converted dataset, those deleted since)."""
  formats = tfds.core.FileFormat
  if builder.info.file_format == formats.ARRAY_RECORD:
    return _rewrite_deleted(builder)
  if builder.info.file_format != formats.TFRECORD:
    raise UserError(f"{builder.info.full_name} is stored as "
                    f"{builder.info.file_format.value}; only TFRecord files "
                    "are converted.")
  if paths.is_remote(builder.data_dir):
    raise UserError(
        f"{builder.data_dir} is on object storage; ArrayRecord files are "
        "written and read on local paths only. Copy the dataset to a local "
        "disk (or a gcsfuse mount, docs/training.md) and convert it there.")
  todo = shards(builder)
  counts = _copy_shards(builder, todo)
  info = builder.info.as_proto
  info.file_format = formats.ARRAY_RECORD.value
  if formats.TFRECORD.value not in info.alternative_file_formats:
    info.alternative_file_formats.append(formats.TFRECORD.value)
  # Written whole, then renamed over the old: a stop leaves one or the other.
  info_path = paths.resolve(builder.data_dir) / "dataset_info.json"
  partial = info_path.with_name(info_path.name + ".incomplete")
  partial.write_text(tfds.core.dataset_info.get_dataset_info_json(info))
  partial.replace(info_path)
  return {
      "dataset": builder.info.full_name,
      "converted": len(todo),
      "records": sum(counts)
  }
