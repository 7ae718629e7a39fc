"""One path layer for every file the project reads or writes.

Workdirs, checkpoints, config.json, metrics, few-shot tables, exports and
data folders may be local paths or object-storage URLs (`gs://...`, and
`s3://...` where s3fs is installed). All of them go through
`etils.epath.Path`, the layer Orbax itself uses, never through `os.path`
or `open` on a URL.

A GCS emulator is used by setting only `STORAGE_EMULATOR_HOST` (the
convention of Google's storage clients): `configure_storage` passes it on
to tensorstore (which writes Orbax's arrays), keeps epath on gcsfs (which
reads the variable) rather than TensorFlow's GCS filesystem (which does
not), and turns off gcsfs's zonal-bucket probe (an API emulators lack).

TensorFlow's summary writer and profiler cannot write through this layer,
so for a remote workdir they write to a local folder that `LocalMirror`
copies to the workdir (at each evaluation, checkpoint and the end).
"""

import os
import shutil
import tempfile

from etils import epath

from vit_jax.errors import UserError

# What a workdir holds, named once: the trainer writes them; resuming,
# inference, sweeps, VTAB and the commands read them back.
CONFIG_FILE = "config.json"  # The run's whole config, decided.
CHECKPOINTS_DIR = "checkpoints"  # Orbax's steps.
FEWSHOT_TABLE = "fewshot.json"  # A sweep's results,
FEWSHOT_CSV = "fewshot.csv"  # and as a spreadsheet.
VTAB_SUMMARY = "vtab.json"  # The VTAB runner's accuracies and means.
ANALYSIS_DIR = "analysis"  # The analyze command's figures.
UNREADABLE_FILES = "unreadable_files"  # .txt, or .process{i}.txt per process.
VTAB_RESULT = "result.json"  # In each VTAB task's sub-workdir.


def configure_storage():
  """Points every storage library at `STORAGE_EMULATOR_HOST`, if it is set."""
  host = os.environ.get("STORAGE_EMULATOR_HOST")
  if not host:
    return
  url = host if "://" in host else f"http://{host}"
  os.environ.setdefault("TENSORSTORE_GCS_HTTP_URL", url)
  os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
  if os.environ.get("EPATH_USE_TF") != "false":
    os.environ["EPATH_USE_TF"] = "false"
    # epath decides once per process, at its first path, whether gs:// goes
    # through TensorFlow; make it decide again.
    from etils.epath import gpath  # pylint: disable=g-import-not-at-top
    cached = getattr(gpath, "_is_tf_installed", None)
    if hasattr(cached, "cache_clear"):
      cached.cache_clear()


def is_remote(path) -> bool:
  return "://" in str(path)


def resolve(path) -> epath.Path:
  """A local path made absolute (and `~` expanded), or a URL as it is."""
  configure_storage()
  path = str(path)
  if is_remote(path):
    return epath.Path(path)
  return epath.Path(os.path.abspath(os.path.expanduser(path)))


def tensorflow_can_read(path) -> bool:
  """Whether TensorFlow's own file system reads `path` (local, or real GCS;
  not s3 and not a GCS emulator); otherwise read the bytes through epath."""
  path = str(path)
  if not is_remote(path):
    return True
  return path.startswith(
      "gs://") and not os.environ.get("STORAGE_EMULATOR_HOST")


def list_dir(path) -> tuple[list[str], list[str]]:
  """(sub-directory names, file names) of a directory, in one listing.

  One request per directory on object storage (fsspec gives entry types,
  which epath's `iterdir` does not), `os.scandir` on a local disk.
  """
  path = str(resolve(path))
  if not is_remote(path):
    with os.scandir(path) as entries:
      entries = [(e.name, e.is_dir()) for e in entries]
  else:
    import fsspec  # pylint: disable=g-import-not-at-top
    fs, inner = fsspec.core.url_to_fs(path)
    name = lambda e: e["name"].rstrip("/").rsplit("/", 1)[-1]
    entries = [
        (name(e), e["type"] == "directory") for e in fs.ls(inner, detail=True)
    ]
  return ([n for n, is_dir in entries if is_dir], [
      n for n, is_dir in entries if not is_dir
  ])


def write_whole(path, data: bytes):
  """`data` written to `path` whole or not at all: a local file is written
  beside it and renamed (a crash leaves no half file for a later run to
  trust); an object in a bucket is written whole by the store itself."""
  path = resolve(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  if is_remote(path):
    path.write_bytes(data)
    return
  with tempfile.NamedTemporaryFile(dir=str(path.parent), suffix=".tmp",
                                   delete=False) as f:
    f.write(data)
  os.replace(f.name, str(path))


def make_workdir(workdir) -> epath.Path:
  """The workdir, created if needed; a file in its place is an error."""
  path = resolve(workdir)
  if path.exists() and not path.is_dir():
    raise UserError(f"--workdir={workdir} is an existing file, not a "
                    "directory; pass a directory (it is created if missing).")
  path.mkdir(parents=True, exist_ok=True)
  return path


class LocalMirror:
  """A local folder whose files `sync()` copies under a remote directory.

  For writers that only write local files (TensorFlow's event files and
  profiler traces). Files are copied again when their size or time changes;
  each run writes new event files, so a resumed run never overwrites the
  metrics of an earlier one.
  """

  def __init__(self, remote: epath.Path):
    self.remote = remote
    self.local = tempfile.mkdtemp(prefix="vit_jax_metrics_")
    self._copied = {}  # Relative path -> (size, mtime) last copied.

  def sync(self):
    for root, _, files in os.walk(self.local):
      for name in files:
        source = os.path.join(root, name)
        relative = os.path.relpath(source, self.local)
        stat = os.stat(source)
        version = (stat.st_size, stat.st_mtime_ns)
        if self._copied.get(relative) == version:
          continue
        target = self.remote / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(source, "rb") as f:
          target.write_bytes(f.read())
        self._copied[relative] = version

  def close(self):
    self.sync()
    shutil.rmtree(self.local, ignore_errors=True)
