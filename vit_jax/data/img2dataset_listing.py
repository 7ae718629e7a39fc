"""The listing of an img2dataset output: which samples it holds, and where.

img2dataset (what LAION, DataComp and CC12M are downloaded with) writes one
of two layouts, told apart by what ROOT holds:

- webdataset (its default): tar shards `ROOT/00000.tar`, `00001.tar`, ...,
  each with members `KEY.jpg`, `KEY.txt` (the caption), `KEY.json`;
- files: numbered folders `ROOT/00000/`, `00001/`, ... of `KEY.jpg` beside
  `KEY.txt` and `KEY.json`.

A sample is its image (`.jpg`, `.jpeg` or `.png`) and its caption; one
without either is left out and counted. The listing of a shard gives each
sample's key, its image member's byte offset and size in the shard (only
the headers and the small `.txt` members are read) and its caption; that of
a folder, its samples' image file names (their captions are read with the
images). Given an index directory (the training workdir), the listing is
written there once as `img2dataset_index_*.json.gz`, as `image_folder.py`
keeps a folder's: in a multi-process run process 0 lists and the others
wait and read it, and a resumed run reads the samples it started with.
"""

from __future__ import annotations

import concurrent.futures
import gzip
import hashlib
import json
import re
import tarfile

import jax
from jax.experimental import multihost_utils

from vit_jax import console
from vit_jax import paths
from vit_jax.data import image_folder
from vit_jax.errors import UserError

WEBDATASET = "webdataset"
FILES = "files"
CAPTION = "txt"
LISTING_THREADS = 16
# WebDataset's rule: a member's key is its path up to the first dot of its
# basename, the rest its extension.
_MEMBER = re.compile(r"^((?:.*/)?[^./]+)\.([^/]*)$")
_IMAGE_EXTENSIONS = tuple(e.lstrip(".") for e in image_folder.IMAGE_EXTENSIONS)


def split_name(name: str) -> tuple[str, str]:
  """(key, lower-case extension) of a member or file name; ext '' if none."""
  match = _MEMBER.match(name)
  return (match[1], match[2].lower()) if match else (name, "")


def layout(root: str) -> tuple[str, list[str]]:
  """(WEBDATASET or FILES, the sorted shard or folder names) of ROOT."""
  if not paths.resolve(root).is_dir():
    raise UserError(f"img2dataset output {root} does not exist. Expected "
                    "ROOT/00000.tar, ... (--output_format webdataset) or "
                    "ROOT/00000/*.jpg, ... (--output_format files).")
  folders, files = paths.list_dir(root)
  shards = sorted(f for f in files if f.endswith(".tar"))
  numbered = sorted(d for d in folders if d.isdigit())
  if shards and numbered:
    raise UserError(f"{root} holds both .tar shards and numbered folders; "
                    "point the dataset at one img2dataset output.")
  if not shards and not numbered:
    raise UserError(f"{root} holds no .tar shards (ROOT/00000.tar) and no "
                    "numbered folders (ROOT/00000/): is it img2dataset's "
                    "output_folder?")
  return (WEBDATASET, shards) if shards else (FILES, numbered)


def _samples(parts: dict[str, dict[str, object]]) -> tuple[list, dict]:
  """The keys (in order) that have an image and a caption, and how many
  lack either."""
  kept, left_out = [], {"no image": 0, "no caption": 0}
  for key, part in parts.items():
    if "image" not in part:
      left_out["no image"] += 1
    elif "caption" not in part:
      left_out["no caption"] += 1
    else:
      kept.append(key)
  return kept, left_out


def list_shard(path: str) -> tuple[dict[str, list], dict]:
  """{"keys", "offsets", "sizes", "captions"} of one tar shard's samples,
  and how many it left out (`_samples`)."""
  parts = {}
  try:
    with paths.resolve(path).open("rb") as f:
      end = f.seek(0, 2)
      f.seek(0)
      with tarfile.open(fileobj=f, mode="r:") as tar:
        for member in tar:
          key, ext = split_name(member.name)
          if not member.isfile() or ext not in _IMAGE_EXTENSIONS + (CAPTION,):
            continue
          sample = parts.setdefault(key, {})
          if ext == CAPTION:
            sample["caption"] = tar.extractfile(member).read().decode(
                "utf-8", errors="replace")
          # An image cut short (a shard still being written) counts as none.
          elif member.offset_data + member.size <= end:
            sample["image"] = (member.offset_data, member.size)
  except (OSError, tarfile.TarError) as e:
    raise UserError(f"{path} cannot be read as a tar file ({e}); download "
                    "it again or delete it.") from None
  keys, left_out = _samples(parts)
  return {
      "keys": keys,
      "offsets": [parts[k]["image"][0] for k in keys],
      "sizes": [parts[k]["image"][1] for k in keys],
      "captions": [parts[k]["caption"] for k in keys]
  }, left_out


def list_folder(path: str) -> tuple[list[str], dict]:
  """The image file names of one numbered folder's samples, and how many
  it left out (`_samples`)."""
  parts = {}
  for name in sorted(paths.list_dir(path)[1]):
    key, ext = split_name(name)
    if ext in _IMAGE_EXTENSIONS:
      parts.setdefault(key, {})["image"] = name
    elif ext == CAPTION:
      parts.setdefault(key, {})["caption"] = True
  keys, left_out = _samples(parts)
  return [parts[k]["image"] for k in keys], left_out


def list_output(root: str) -> dict:
  """The listing of ROOT (see the module doc) as the index holds it."""
  kind, names = layout(root)
  lister = list_shard if kind == WEBDATASET else list_folder
  parts, counts = {}, {"no image": 0, "no caption": 0}
  with concurrent.futures.ThreadPoolExecutor(LISTING_THREADS) as pool:
    listed = pool.map(lambda n: lister(f"{root.rstrip('/')}/{n}"), names)
    for name, (part, left_out) in zip(
        names, console.progress(listed, len(names), f"Listing {root}")):
      parts[name] = part
      counts = {k: counts[k] + left_out[k] for k in counts}
  size = sum(
      len(p["keys"] if kind == WEBDATASET else p) for p in parts.values())
  console.say(
      "Listed img2dataset output %s (%s, %d %s): %d samples; left out %d "
      "without a .jpg/.jpeg/.png image, %d without a caption.", root, kind,
      len(names), "shards" if kind == WEBDATASET else "folders", size,
      counts["no image"], counts["no caption"])
  return {"root": root, "layout": kind, "parts": parts, "left_out": counts}


def index_path(index_dir: str, root: str):
  digest = hashlib.sha1(root.encode()).hexdigest()[:12]
  return paths.resolve(index_dir) / f"img2dataset_index_{digest}.json.gz"


def _write(path, listing: dict):
  paths.write_whole(path, gzip.compress(json.dumps(listing).encode()))


def _read(path, root: str) -> dict:
  listing = json.loads(gzip.decompress(path.read_bytes()))
  if listing["root"] != root:
    raise UserError(f"{path} indexes {listing['root']}, not {root}; delete "
                    "it.")
  return listing


def load_listing(root: str, index_dir=None) -> dict:
  """The listing, from the index in `index_dir` if any (see module doc)."""
  if index_dir is None:
    return list_output(root)
  index = index_path(index_dir, root)
  listing = None
  if jax.process_index() == 0:  # Decides alone: every process syncs once.
    if index.exists():
      listing = _read(index, root)
    else:
      listing = list_output(root)
      _write(index, listing)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(f"img2dataset index of {root}")
  return listing if listing is not None else _read(index, root)
