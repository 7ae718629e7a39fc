"""What a person reads on the console.

`say` prints one short line, `HH:MM:SS message`, on stderr from process 0:
one per log step, evaluation, saved checkpoint and resume. Details go to
absl logging at INFO; they show with `--log_level=info`, as does the INFO of
TFDS, Orbax and clu. `progress` wraps long work in a bar on a terminal (and
prints nothing elsewhere, so logs stay line by line).
"""

import sys
import time
from typing import Iterable
from typing import Optional

import jax


def say(message: str, *args) -> None:
  if jax.process_index() == 0:
    text = message % args if args else message
    # One write, newline included: a line another thread prints at the same
    # time (the liveness watch's) never lands in the middle of this one.
    sys.stderr.write(f"{time.strftime('%H:%M:%S')} {text}\n")
    sys.stderr.flush()


def progress(iterable: Iterable, total: Optional[int], what: str) -> Iterable:
  """`iterable`, with a progress bar on process 0's terminal."""
  import tqdm  # Here: accelerator hosts without TensorFlow may lack it.
  return tqdm.tqdm(iterable, total=total, desc=what, leave=False,
                   file=sys.stderr, dynamic_ncols=True,
                   disable=None if jax.process_index() == 0 else True)
