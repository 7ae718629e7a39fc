"""The PyTorch environment (.venv-torch, `tests/references/torch_env.sh`)
that the comparisons with timm run in.

Where it is missing, those tests are skipped, with `MISSING` as the reason;
under CI=true they fail instead: a comparison that CI skips proves nothing.
`require` says so in a test; tests that skip with `MISSING` themselves are
failed by `fail_skip_in_ci` (tests/conftest.py calls it on every report).
"""

import os

import pytest

REPO = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TORCH_PYTHON = os.path.join(REPO, ".venv-torch", "bin", "python")
MISSING = "no .venv-torch: `tests/references/torch_env.sh` says why"
_IN_CI = ("CI=true: a comparison with timm that CI skips proves nothing; "
          "build the environment (tests/references/torch_env.sh).")


def in_ci() -> bool:
  return os.environ.get("CI", "").lower() == "true"


def require(python: str = TORCH_PYTHON) -> str:
  """`python`, timm's environment; where it is missing the test is skipped,
  or fails under CI=true."""
  if not os.path.exists(python):
    if in_ci():
      pytest.fail(f"{MISSING}. {_IN_CI}", pytrace=False)
    pytest.skip(MISSING)
  return python


def fail_skip_in_ci(report) -> None:
  """A test report skipped for want of the environment, failed under
  CI=true."""
  if report.skipped and in_ci() and MISSING in str(report.longrepr):
    report.outcome = "failed"
    report.longrepr = f"Skipped: {MISSING}. {_IN_CI}"
