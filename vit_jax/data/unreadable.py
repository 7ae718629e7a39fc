"""Training and evaluation images that cannot be read are left out, counted
and named, and the stream stays the same on every run.

A file that is empty, not an image, truncated or otherwise fails to decode
does not end a run at the hour it is first read. `map_skipping_unreadable`
maps records to examples like `Dataset.map`, but an example whose function
fails is replaced, at its own position, by a placeholder: a blank image with
mask 0, which weighs nothing in the training loss and is not counted by
evaluation. Positions do not move, so every run (and a resumed one, which
skips records by count) sees exactly the same batches.

Each stream's `Unreadable` log holds the distinct files it met. Past its
allowance (config.max_unreadable_share of the files the stream reads per
pass, 1% by default, but at least `MIN_ALLOWED` files, fewer than half of
them, so the odd broken file of a small folder is only left out) the run
stops with one line: a dataset with that many broken files is broken as a
whole (a failed copy, the wrong folder, HTML error pages saved as .jpg),
and training on what is left would waste the run. A `Collector` (the
trainer's, passed to the streams it makes) gathers their logs and writes
the files' paths into the workdir.
"""

from __future__ import annotations

import math
import re
import threading
from typing import Callable
from typing import Optional

import jax

from vit_jax import paths
from vit_jax.config import imports
from vit_jax.data import image_folder
from vit_jax.errors import UserError

tf = imports.lazy("tensorflow")  # Loaded where data is first read.

# Functions traced as written, AutoGraph off (input_pipeline.py says why).
_as_written = lambda fn: tf.autograph.experimental.do_not_convert(fn)

DEFAULT_MAX_SHARE = 0.01
# Files a stream always tolerates where the share is above 0 (but fewer than
# half of its files): 1% of a small fine-tuning folder rounds down to none.
MIN_ALLOWED = 2


def _floor(files_per_pass: int) -> int:
  return min(MIN_ALLOWED, (files_per_pass - 1) // 2)


def allowed(files_per_pass: int, max_share: float) -> int:
  """How many unreadable files a stream of `files_per_pass` tolerates."""
  if max_share <= 0:
    return 0
  # The share's own floor (1e-9: 0.29 * 100 is 28.999... in floats).
  return max(math.floor(max_share * files_per_pass + 1e-9),
             _floor(files_per_pass))


class Unreadable:
  """The distinct files of one stream that could not be read.

  `add` only notes a file: it runs in tf.data's threads. Whether the stream
  went past its allowance is asked by its consumer (`numpy_batches`), whose
  thread raises the error."""

  def __init__(self, stream: str, files_per_pass: int,
               max_share: float = DEFAULT_MAX_SHARE):
    self.stream = stream
    self.files_per_pass = files_per_pass
    self.max_share = max_share
    self.allowed = allowed(files_per_pass, max_share)
    self.names: list[str] = []  # In the order met.
    # name -> why it is unreadable, found again (see `why_unreadable`).
    self.explain: Optional[Callable[[str], str]] = None
    self._reader = ("" if jax.process_count() == 1 else
                    f" that process {jax.process_index()} reads")
    self._seen = set()
    self._lock = threading.Lock()  # Met from tf.data's threads.

  @property
  def count(self) -> int:
    return len(self.names)

  @property
  def exceeded(self) -> bool:
    return self.count > self.allowed

  def add(self, name: str) -> None:
    with self._lock:
      if name not in self._seen:
        self._seen.add(name)
        self.names.append(name)

  def error_message(self) -> str:
    # How many are met before the consumer looks, and which first, vary
    # with tf.data's threads: "at least", and the allowance it passed.
    rule = f"config.max_unreadable_share={self.max_share:g}"
    if self.max_share > 0:
      floor = _floor(self.files_per_pass)
      rule += f", and at least {floor} file{'s' * (floor != 1)}"
    return (f"At least {self.count} of the {self.files_per_pass} images"
            f"{self._reader or ' read'} from {self.stream} are unreadable, "
            f"more than the {self.allowed} allowed ({rule}), e.g. "
            f"{self.names[0]}{self._why(self.names[0])}. Fix or remove them, "
            "or raise config.max_unreadable_share.")

  def _why(self, name: str) -> str:
    """' (the reason)', when it can be found again (an image file's)."""
    if self.explain is None:
      return ""
    try:
      return f" ({self.explain(name)})"
    except Exception:  # noqa: BLE001 A name that is no file: no reason.
      return ""


def map_skipping_unreadable(records: tf.data.Dataset, example_fn: Callable,
                            name_fn: Callable, log: Unreadable,
                            chunk: int = 32) -> tf.data.Dataset:
  """`records.map(example_fn)` (elements unpacked into its arguments), where
  an example that fails becomes a placeholder with mask 0, and `log` gets
  its name (see the module doc).

  Records go in chunks (ragged batches: a record's fields may vary in
  length): each chunk's examples are made by a dataset of its own whose
  `ignore_errors` drops the failures, and the survivors go back into their
  places among placeholders. A dataset per chunk rather than per record
  keeps the cost small. `name_fn` takes a chunk of elements (batched) and
  returns their names.
  """
  example_fn = _as_written(example_fn)
  examples = records.map(example_fn)
  for name, spec in examples.element_spec.items():
    for part in tf.nest.flatten(spec):  # A patch sequence is a dict.
      if not part.shape.is_fully_defined():
        raise ValueError(f"Example field {name!r} has no fixed shape "
                         f"({part.shape}); a placeholder needs one.")
  placeholder = tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype),
                                      examples.element_spec)

  def one_chunk(*elements):
    size = tf.shape(tf.nest.flatten(elements)[0])[0]
    made = tf.data.Dataset.from_tensor_slices((tf.range(
        size, dtype=tf.int64), elements)).map(
            _as_written(lambda place, element: (place, example_fn(*element))))
    empty = tf.nest.map_structure(lambda v: tf.zeros((0,) + v.shape, v.dtype),
                                  placeholder)
    made = made.ignore_errors().batch(chunk).concatenate(
        tf.data.Dataset.from_tensors((tf.zeros([0], tf.int64), empty))).take(
            1)  # All failed: the empty batch.
    return made.map(
        _as_written(lambda places, good: ((places, good), name_fn(*elements))))

  def note(names):  # In a tf.data thread: only notes them.
    for name in names.numpy():
      log.add(name.decode())
    return True

  def into_places(made, names):
    places, good = made
    size = tf.size(names)

    def scattered():  # Only for a chunk with a failure.
      return tf.nest.map_structure(
          lambda v, g: tf.tensor_scatter_nd_update(
              tf.tile(v[None], [size] + [1] * v.shape.rank), places[:, None], g
          ), placeholder, good)

    full = tf.cond(tf.size(places) == size, lambda: good, scattered)
    failed = tf.scatter_nd(places[:, None], tf.ones_like(places),
                           tf.cast([size], tf.int64)) == 0
    failed_names = tf.boolean_mask(names, failed)
    noted = tf.cond(
        tf.size(failed_names) > 0,
        lambda: tf.py_function(note, [failed_names], tf.bool),
        lambda: tf.constant(True))
    with tf.control_dependencies([noted]):
      full["mask"] = tf.identity(full["mask"])
    return full

  return records.ragged_batch(chunk).interleave(
      _as_written(one_chunk), block_length=1,
      num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).map(
          _as_written(into_places), num_parallel_calls=tf.data.AUTOTUNE,
          deterministic=True).unbatch()


def why_unreadable(path: str, image_fn) -> str:
  """What is wrong with the image file at `path`, found by reading,
  decoding and preprocessing it (`image_fn`) again on its own."""
  try:
    data = paths.resolve(path).read_bytes()
  except OSError as e:
    return f"cannot be read ({e})"
  if not any(data.startswith(m) for m in image_folder.MAGIC):
    return "not a JPEG or PNG file"
  try:
    image = tf.io.decode_image(data, channels=3, expand_animations=False)
    tf.nest.map_structure(lambda t: t.numpy(),
                          image_fn(image, tf.constant([0, 0], tf.int64)))
  except (tf.errors.OpError, ValueError) as e:
    # TensorFlow wraps the reason: "{{function_node ...}} WHY [Op:...]".
    why = re.sub(r"\{\{.*?\}\}|\[Op:\w+\]", "", getattr(
        e, "message", str(e))).strip().splitlines()
    return f"a broken image ({why[0][:200] if why else 'no details'})"
  return "readable now"


class PipelineError(RuntimeError):
  """A user's mistake met in tf.data's Python functions (a data file that
  cannot be read: `sources.TfdsIndexReader`). TensorFlow passes on only an
  error's text; `numpy_batches` finds the message in it and raises it as a
  `UserError`."""

  _MARK = "<vit_jax user error>"

  def __init__(self, message: str):
    super().__init__(f"{self._MARK}{message}{self._MARK}")

  @classmethod
  def message_in(cls, text: str) -> Optional[str]:
    found = re.search(f"{cls._MARK}(.*?){cls._MARK}", text, re.DOTALL)
    return found[1] if found else None


def numpy_batches(dataset: tf.data.Dataset, log: Unreadable):
  """The dataset's numpy batches; past the log's allowance, a one-line error,
  as for a file listed but gone, or a `PipelineError`.

  The pipeline stops when this generator ends, however it ends (exhausted,
  closed, failed or collected): left running, its threads would still call
  Python (`note`) while the interpreter exits, which ends them mid-call, and
  the pipeline's teardown then waits for them forever."""
  batches = dataset.as_numpy_iterator()
  failed = None  # (TensorFlow's error type, its message)
  try:
    for batch in batches:
      if log.exceeded:
        break
      yield batch
  except tf.errors.OpError as e:
    failed = (type(e), e.message)
  finally:
    del batches  # Its threads stop here.
  # Raised here, not in the except clause: TensorFlow's error would hold
  # the iterator's frames, and with them the pipeline (whose teardown at
  # interpreter exit then hangs or aborts).
  if log.exceeded:
    raise UserError(log.error_message())
  if failed is None:
    return
  kind, message = failed
  said = PipelineError.message_in(message)
  if said is not None:
    raise UserError(said)
  if issubclass(kind, tf.errors.NotFoundError):  # A file listed but gone.
    raise FileNotFoundError(message.strip().splitlines()[0])
  raise kind(None, None, message)  # A bug: TensorFlow's own error.


def left_out(batches, images: float) -> dict[str, float]:
  """{'num_unreadable': the split's images an evaluation did not score},
  where `batches` (an `input_pipeline.EvalBatches`) knows how many the
  split has and some were left out; else {}."""
  total = getattr(batches, "num_examples", None)
  if total is None or total <= images:
    return {}
  return {"num_unreadable": float(total - images)}


def summary(metrics) -> str:
  """What an evaluator's summary adds for `left_out`'s count."""
  if "num_unreadable" not in metrics:
    return ""
  return f" ({metrics['num_unreadable']:.0f} unreadable images left out)"


class Collector:
  """The logs of the streams it is passed to (`log`); `write()` puts their
  files' paths (one per line) in WORKDIR/unreadable_files.txt (one file per
  process when there are several: unreadable_files.process{i}.txt)."""

  def __init__(self, workdir):
    self.logs: list[Unreadable] = []
    name = (f"{paths.UNREADABLE_FILES}.txt" if jax.process_count() == 1 else
            f"{paths.UNREADABLE_FILES}.process{jax.process_index()}.txt")
    self.path = paths.resolve(workdir) / name
    self._written = 0

  def log(self, stream: str, files_per_pass: int,
          max_share: float = DEFAULT_MAX_SHARE) -> Unreadable:
    """A new stream's log, gathered here."""
    made = Unreadable(stream, files_per_pass, max_share)
    self.logs.append(made)
    return made

  @property
  def count(self) -> int:
    return sum(log.count for log in self.logs)

  def write(self) -> bool:
    """Writes the file if files were met since the last write; whether it
    did."""
    if self.count == self._written:
      return False
    names = sorted({n for log in self.logs for n in log.names})
    self.path.write_text("".join(f"{n}\n" for n in names))
    self._written = self.count
    return True
