"""Docs that cannot rot: every `vit-jax` command in the shell blocks of
README.md and docs/*.md names a command that exists and passes only flags
it defines; its `--config=FILE[:ARG]` file exists and `get_config(ARG)`
builds; every `--config.a.b=...` field it overrides exists. The launchers'
command lines (`tpu_pod.sh train`, `local.sh`, `slurm.sbatch`, `gke.py`)
are `vit-jax train` commands too. Nothing is run: commands are parsed (long
lines joined, `for` loops expanded)."""

import functools
import glob
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md"] + sorted(
    os.path.relpath(p, REPO) for p in glob.glob(f"{REPO}/docs/*.md"))
BLOCK = re.compile(r"^```(?:sh|bash)\n(.*?)^```", re.S | re.M)
LOOP = re.compile(r"for (\w+) in ([^;]+); do\n(.*?)\ndone", re.S)
ENDS = {">", ">>", "|", "&&", "||", ";", "&"}


def _lines(block: str) -> list[str]:
  """The block's commands: continued lines joined, loops expanded."""

  def expand(loop):
    name, values, body = loop.groups()
    return "\n".join(
        re.sub(rf"\${{?{name}}}?", value, body) for value in values.split())

  block = LOOP.sub(expand, block.replace("\\\n", " "))
  return [line for line in block.splitlines() if line.strip()]


def _train(tokens, start):
  return "train", tokens[start:]


def _invocation(tokens):
  """(command name, its arguments) of a vit-jax command line, or None."""
  for i, token in enumerate(tokens):
    if token.endswith("vit-jax"):
      return tokens[i + 1], tokens[i + 2:]
    if tokens[i:i + 3] == [token, "-m", "vit_jax"]:
      return tokens[i + 3], tokens[i + 4:]
    if token.endswith("launch/tpu_pod.sh") and tokens[i + 1] == "train":
      return _train(tokens, i + 4)
    if token.endswith("launch/local.sh"):
      return _train(tokens, i + 4)
    if token.endswith("launch/slurm.sbatch"):
      return _train(tokens, i + 1)
    if token.endswith("launch/gke.py") and "--" in tokens:
      config = [
          t for t in tokens[:tokens.index("--")] if t.startswith("--config=")
      ]
      return "train", config + tokens[tokens.index("--") + 1:]
  return None


def _commands():
  """(doc, line, command name, arguments) of every command in the docs."""
  found = []
  for doc in DOCS:
    with open(os.path.join(REPO, doc)) as f:
      text = f.read()
    for block in BLOCK.findall(text):
      for line in _lines(block):
        tokens = shlex.split(line, comments=True)
        tokens = tokens[:next((
            i for i, t in enumerate(tokens) if t in ENDS), len(tokens))]
        invocation = _invocation(tokens)
        if invocation:
          found.append((doc, line.strip(), *invocation))
  return found


COMMANDS = _commands()

_FLAGS_PROGRAM = """
import importlib, json
from absl import flags
from vit_jax import cli
result, shared = {}, set(flags.FLAGS)
for name, (module, _) in cli.COMMANDS.items():
  before = set(flags.FLAGS)
  importlib.import_module(f"vit_jax.commands.{module}")
  own = set(flags.FLAGS) - before
  result[name] = sorted(own | shared)
  for flag in own:  # The next command may define the same name.
    delattr(flags.FLAGS, flag)
print(json.dumps(result))
"""


@functools.cache
def _flags_by_command() -> dict[str, set[str]]:
  """Each command's flags, read in a process of its own: importing a command
  defines its flags globally."""
  done = subprocess.run([sys.executable, "-c", _FLAGS_PROGRAM], cwd=REPO,
                        capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(done.stdout.strip().splitlines()[-1])
  return {name: set(names) for name, names in result.items()}


def _config(spec: str):
  path, _, arg = spec.partition(":")
  assert os.path.isfile(os.path.join(REPO, path)), f"no config file {path}"
  module_spec = importlib.util.spec_from_file_location("doc_config",
                                                       os.path.join(REPO, path))
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def test_the_docs_hold_commands_of_every_kind():
  names = {name for _, _, name, _ in COMMANDS}
  assert set(_flags_by_command()) <= names  # Every command is shown.
  assert len(COMMANDS) > 50


@pytest.mark.parametrize(
    "doc, line, name, args", COMMANDS,
    ids=[f"{c[0]}:{c[2]}:{i}" for i, c in enumerate(COMMANDS)])
def test_every_documented_command_parses(doc, line, name, args):
  known = _flags_by_command()
  assert name in known, f"{doc}: unknown command {name!r} in: {line}"
  config = None
  for arg in args:
    if not arg.startswith("--"):
      continue
    flag, _, value = arg[2:].partition("=")
    if flag.startswith("config."):
      assert config is not None, f"{doc}: --{flag} before --config in: {line}"
      node = config
      for part in flag.split(".")[1:]:
        if part not in node:
          pytest.fail(f"{doc}: the config has no field {flag}: {line}")
        node = node[part]
      continue
    boolean_off = flag.startswith("no") and flag[2:] in known[name]
    assert flag in known[name] or boolean_off, (
        f"{doc}: vit-jax {name} has no flag --{flag}: {line}")
    if flag == "config":
      config = _config(value)


def _anchors(path: str) -> set[str]:
  """GitHub's anchors of a Markdown file's headings."""
  with open(path) as f:
    headings = [line.lstrip("#").strip() for line in f if line.startswith("#")]
  return {
      re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings
  }


@pytest.mark.parametrize("doc", DOCS)
def test_every_link_leads_somewhere(doc):
  """Relative links name files that exist, and headings that do."""
  with open(os.path.join(REPO, doc)) as f:
    text = BLOCK.sub("", f.read())
  for target in re.findall(r"\]\(([^)\s]+)\)", text):
    if re.match(r"[a-z]+://", target):
      continue
    path, _, anchor = target.partition("#")
    path = os.path.normpath(os.path.join(
        REPO, os.path.dirname(doc), path)) if path else os.path.join(REPO, doc)
    assert os.path.exists(path), f"{doc}: {target} does not exist"
    if anchor:
      assert anchor in _anchors(path), f"{doc}: no heading for {target}"
