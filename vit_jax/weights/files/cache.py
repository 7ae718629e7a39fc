"""Weights at a URL or by released name, as a file in a local cache.

    path = locate("ViT-B/16@i21k")  # ~/.cache/vit_jax/gs/vit_models/...

`locate` is what every reader of a weights file calls first
(`formats.read`): a local path that exists is returned as it is; a released
name (`released.py`) becomes its URL; a file at a URL (gs://, or any
protocol fsspec reads) is downloaded once into the cache and its local copy
returned; an Orbax directory at a URL is returned as it is (Orbax reads it
in place).

The cache (config.init.cache_dir; unset: $VIT_JAX_CACHE_DIR, else
~/.cache/vit_jax) mirrors the URL: gs://BUCKET/PATH lies at
CACHE/gs/BUCKET/PATH, with PATH.source.json saying which version of the
object it is. A copy is used while the object's size and generation (or
ETag) are unchanged; when the object cannot be reached, the copy is used
as it is. The processes of one host share the cache: the first takes a
file lock and downloads (to a temporary file, renamed when complete), the
others wait and use its copy.

Offline mode (--offline or VIT_JAX_OFFLINE=1) uses cached copies without
asking the storage anything, and refuses to download; an Orbax directory
at a URL, never cached, cannot be read in it.
"""

import contextlib
import fcntl
import glob
import hashlib
import json
import os
import tempfile
import urllib.parse

from absl import logging

from vit_jax import console
from vit_jax import paths
from vit_jax.errors import DownloadError
from vit_jax.errors import UserError
from vit_jax.weights.files import released

OFFLINE_VARIABLE = "VIT_JAX_OFFLINE"
CACHE_VARIABLE = "VIT_JAX_CACHE_DIR"
DEFAULT_CACHE = "~/.cache/vit_jax"
# What identifies one version of an object, by storage: GCS, S3 and HTTP.
_VERSION_FIELDS = ("size", "generation", "etag", "ETag", "md5Hash",
                   "LastModified")
_BLOCK = 16 << 20  # Bytes per read while downloading.

# URLs already announced by this process: one line each, not one per read.
_announced = set()


def is_offline() -> bool:
  return os.environ.get(OFFLINE_VARIABLE, "").lower() not in ("", "0", "false")


def cache_root(cache_dir=None) -> str:
  """The cache directory: `cache_dir`, else $VIT_JAX_CACHE_DIR, else
  ~/.cache/vit_jax."""
  root = cache_dir or os.environ.get(CACHE_VARIABLE) or DEFAULT_CACHE
  if paths.is_remote(root):
    raise UserError(f"The checkpoint cache must be a local directory, not "
                    f"{root}; set config.init.cache_dir (or "
                    f"{CACHE_VARIABLE}) to a local path.")
  return os.path.abspath(os.path.expanduser(root))


def cache_path(url: str, cache_dir=None) -> str:
  """Where the copy of `url` lies: CACHE/SCHEME/HOST/PATH."""
  parts = urllib.parse.urlsplit(url)
  names = [
      n if n not in (".", "..") else "_" for n in parts.path.split("/") if n
  ] or ["_"]
  if parts.query:  # Keep URLs that differ only by their query apart.
    digest = hashlib.sha256(parts.query.encode()).hexdigest()[:12]
    names[-1] = f"{names[-1]}.{digest}"
  return os.path.join(cache_root(cache_dir), parts.scheme, parts.netloc or "_",
                      *names)


def locate(path, cache_dir=None) -> str:
  """A path the readers can open for `path` (see the module doc)."""
  path = str(path)
  name = None
  if not paths.is_remote(path):
    if os.path.exists(os.path.expanduser(path)):
      return path
    entry = released.lookup(path)
    if entry is None:
      return path  # The reader reports the missing path.
    name, path = path, entry.url
  return _local_copy(path, name, cache_dir)


def forget_announced():
  """Say again where each file comes from, as a new process would."""
  _announced.clear()


def _announce(url: str, message: str, *args):
  if url not in _announced:
    _announced.add(url)
    console.say(message, *args)


def _describe(url: str, name) -> str:
  return f"{name} ({url})" if name else url


def _local_copy(url: str, name, cache_dir) -> str:
  if is_offline():
    return _offline_copy(url, name, cache_dir)
  paths.configure_storage()
  import fsspec  # pylint: disable=g-import-not-at-top
  # The released bucket is public: no credentials needed (nor warned about).
  options = {"token": "anon"} if url.startswith(released.BUCKET + "/") else {}
  fs, inner = fsspec.core.url_to_fs(url, **options)
  info = _remote_info(fs, inner, url, name, cache_dir)
  if info is None:  # Unreachable, but a copy is cached.
    return cache_path(url, cache_dir)
  if info.get("type") == "directory":
    # An Orbax checkpoint: read in place, so the cache is not needed (nor
    # `cache_root`'s checks).
    return url
  target = cache_path(url, cache_dir)
  version = {k: str(info[k]) for k in _VERSION_FIELDS if info.get(k)}
  if not _is_current(target, version):
    with _locked(target):
      # Another process may have downloaded it while this one waited.
      if not _is_current(target, version):
        _download(fs, inner, url, name, target, version)
        return target
  _announce(url, "Using cached %s.", _describe(url, name))
  return target


def _offline_copy(url: str, name, cache_dir) -> str:
  """The cached copy of `url`, without asking the storage anything; so
  whether `url` is a file or an Orbax directory is unknown here."""
  target = cache_path(url, cache_dir)
  if os.path.isfile(target):
    _announce(
        url, "Using cached %s (offline mode: not checked for a "
        "newer version).", _describe(url, name))
    return target
  raise DownloadError(
      f"Offline mode is on (--offline or {OFFLINE_VARIABLE}=1), so "
      f"{_describe(url, name)} is not read: there is no cached copy at "
      f"{target}, and offline mode does not ask the storage what is at the "
      "URL. If it is a weights file, put it at that path (it is then "
      "used); if it is an Orbax checkpoint directory, it is always read in "
      "place from the storage, never cached, so it cannot be read offline. "
      "To download the file or read the directory, turn offline mode off "
      f"(drop --offline, unset {OFFLINE_VARIABLE}).")


def _remote_info(fs, inner, url, name, cache_dir):
  """The object's metadata; None when it cannot be asked but a copy is
  cached; raises when neither."""
  try:
    fs.invalidate_cache(inner)  # fsspec keeps listings; ask again.
    return fs.info(inner)
  except FileNotFoundError:
    problem = "the object does not exist"
    if name:
      problem += (" (released names come from google-research/"
                  "vision_transformer's README, gs://vit_models/augreg/"
                  "index.csv, big_vision and timm's Hub repositories; "
                  "check the name there)")
  except Exception as e:  # pylint: disable=broad-except
    # Storage clients raise many types for a network or credentials error.
    problem = f"the storage could not be asked ({type(e).__name__}: {e})"
  target = cache_path(url, cache_dir)
  if os.path.isfile(target):
    _announce(
        url, "Could not check %s for a newer version: %s. Using the "
        "cached copy %s.", _describe(url, name), problem, target)
    return None
  raise DownloadError(
      f"No weights at {_describe(url, name)}: {problem}. Check the URL and "
      "your access to it (credentials, network), or download the file "
      f"yourself to {target}.")


def _is_current(target: str, version: dict) -> bool:
  """Whether the cached copy is the remote `version`: a copy without a
  record was put there by hand, and is used as it is."""
  if not os.path.isfile(target):
    return False
  try:
    with open(target + ".source.json") as f:
      recorded = json.load(f).get("version")
  except FileNotFoundError:
    return True
  except (OSError, ValueError):
    return False
  return recorded == version


@contextlib.contextmanager
def _locked(target: str):
  """An exclusive lock on `target`'s download, across processes."""
  os.makedirs(os.path.dirname(target), exist_ok=True)
  with open(target + ".lock", "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)


def _download(fs, inner, url, name, target, version):
  """Downloads to a temporary file, then renames: a reader never sees a
  partial copy. Called with the lock held."""
  for stale in glob.glob(glob.escape(target) + ".*.part"):
    os.remove(stale)  # Left by a download that was killed.
  size = int(version.get("size", 0))
  console.say("Downloading %s to %s (%s MB).", _describe(url, name), target,
              f"{size / 1e6:.{1 if size >= 1e5 else 3}f}")
  _announced.add(url)
  directory, base = os.path.split(target)
  fd, partial = tempfile.mkstemp(dir=directory, prefix=base + ".",
                                 suffix=".part")
  try:
    with os.fdopen(fd, "wb") as out, fs.open(inner, "rb") as source:
      blocks = iter(lambda: source.read(_BLOCK), b"")
      for block in console.progress(blocks, -(-size // _BLOCK),
                                    f"Downloading {base}"):
        out.write(block)
    received = os.path.getsize(partial)
    if size and received != size:
      raise DownloadError(
          f"The download of {url} stopped at {received} of {size} bytes; "
          "run again to retry.")
    # The copy first: a crash before its record leaves a copy taken for
    # one put there by hand (it is complete) or one of another version
    # (downloaded again), never a stale copy recorded as current.
    os.replace(partial, target)
    _write_record(target, url, version)
  except BaseException:
    with contextlib.suppress(FileNotFoundError):
      os.remove(partial)
    raise
  logging.info("Downloaded %s to %s.", url, target)


def _write_record(target: str, url: str, version: dict):
  """PATH.source.json: which object, and which version of it, PATH is."""
  directory, base = os.path.split(target)
  fd, partial = tempfile.mkstemp(dir=directory, prefix=base + ".",
                                 suffix=".json.part")
  with os.fdopen(fd, "w") as f:
    json.dump({"url": url, "version": version}, f, indent=2)
  os.replace(partial, target + ".source.json")
