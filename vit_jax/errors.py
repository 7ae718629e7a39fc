"""The one exception type for mistakes in what the user gave us.

A `UserError` names the problem and the fix (a bad config value, a missing
file, a checkpoint that does not fit). Commands print it as one line,
`error: ...`, and exit with status 2; any other exception is a bug and keeps
its traceback (see `vit_jax/cli.py`). It is a `ValueError`, so callers that
catch those keep working.
"""


class UserError(ValueError):
  """A mistake in the input (config, flags, files), with what to do about it."""


class NonFiniteLossError(UserError, FloatingPointError):
  """Training diverged (NaN or inf loss); nothing of that state is saved."""


class CheckpointError(OSError):
  """A checkpoint that could not be saved (after the storage libraries'
  retries) or read; an OSError that may pass, so commands exit with 75
  (EX_TEMPFAIL), a retry."""
