"""The package's exception types, all here:

  UserError           a mistake in what the user gave us (a bad config
                      value or flag, a missing file, a checkpoint that does
                      not fit), with the fix; a `ValueError`, so callers
                      that catch those keep working;
  WeightsError        a weights file that cannot be used (a UserError);
  DownloadError       a checkpoint that could not be fetched (a UserError);
  NonFiniteLossError  training diverged (a UserError and a
                      FloatingPointError);
  CheckpointError     a checkpoint that could not be saved or read after the
                      storage libraries' retries: an `OSError` that may pass.

Commands print a UserError as one line, `error: ...`, and exit with status
2, and a CheckpointError likewise with 75 (EX_TEMPFAIL, worth a retry); any
other exception is a bug and keeps its traceback (see `vit_jax/cli.py`).
"""


class UserError(ValueError):
  """A mistake in the input (config, flags, files), with what to do about it."""


class WeightsError(UserError):
  """A weights file that cannot be used, with what to do about it."""


class DownloadError(UserError):
  """A checkpoint that could not be fetched, with what to do about it."""


class NonFiniteLossError(UserError, FloatingPointError):
  """Training diverged (NaN or inf loss); nothing of that state is saved."""


class CheckpointError(OSError):
  """A checkpoint that could not be saved (after the storage libraries'
  retries) or read; an OSError that may pass, so commands exit with 75
  (EX_TEMPFAIL), a retry."""
