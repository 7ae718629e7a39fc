"""Docs that cannot rot: every `vit-jax` command shown, in the shell blocks of
README.md and docs/*.md and in the usage lines of the modules' docstrings
(configs/, vit_jax/), names a command that exists and passes only flags it
defines; its `--config=FILE[:ARG]` file exists and `get_config(ARG)` builds;
every `--config.a.b=VALUE` field it overrides exists and takes that value.
The launchers' command lines (`tpu_pod.sh train`, `local.sh`,
`slurm.sbatch`, `gke.py`, the image) are `vit-jax train` commands too. A
line that mentions a command in a form not recognised here fails, so nothing
is skipped silently. Nothing is run: commands are parsed (long lines joined,
`for` loops expanded), and relative links checked."""

import ast
import functools
import glob
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md"] + sorted(
    os.path.relpath(p, REPO) for p in glob.glob(f"{REPO}/docs/*.md"))
MODULES = sorted(
    os.path.relpath(p, REPO)
    for pattern in ("configs/*.py", "vit_jax/**/*.py", "launch/*.py")
    for p in glob.glob(f"{REPO}/{pattern}", recursive=True))
BLOCK = re.compile(r"^([ \t]*)```(?:sh|bash)\n(.*?)^\1```", re.S | re.M)
LOOP = re.compile(r"for (\w+) in ([^;]+); do\n(.*?)\ndone", re.S)
SEPARATORS = {"&&", "||", ";", "|"}
ENDS = {">", ">>", "2>", "&"}
# A line that shows one of our commands (to fail on forms not parsed here).
MENTIONS = re.compile(r"(^|[\s/])vit-jax\s+-*\w|-m vit_jax|vit_jax\.commands")
IMAGE = re.compile(r"(^|/)vit-jax:[\w.-]+$")  # Our container image.
# How the shell examples in docstrings begin (other indented text is prose).
COMMAND_WORDS = ("vit-jax", "python", ".venv/", "launch/", "sbatch", "docker")


def _lines(block: str) -> list[str]:
  """The block's commands: continued lines joined, loops expanded."""

  def expand(loop):
    name, values, body = loop.groups()
    return "\n".join(
        re.sub(rf"\${{?{name}}}?", value, body) for value in values.split())

  block = LOOP.sub(expand, textwrap.dedent(block).replace("\\\n", " "))
  return [line.strip() for line in block.splitlines() if line.strip()]


def _invocation(tokens):
  """(command name, its arguments) of a command line, or None."""
  for i, token in enumerate(tokens):
    after = tokens[i + 1:]
    if token.endswith("vit-jax") or IMAGE.search(token) and "run" in tokens:
      return (after[0], after[1:]) if after else None
    if token == "-m" and after[:1] == ["vit_jax"]:
      return (after[1], after[2:]) if len(after) > 1 else None
    if token.endswith("launch/tpu_pod.sh"):
      return ("train", after[3:]) if after[:1] == ["train"] else None
    if token.endswith("launch/local.sh"):
      return "train", after[3:]
    if token.endswith("launch/slurm.sbatch"):
      return "train", after
    if token.endswith("launch/gke.py"):
      ours = after[:after.index("--")] if "--" in after else after
      train = after[after.index("--") + 1:] if "--" in after else []
      return "train", [t for t in ours if t.startswith("--config=")] + train
  return None


def _segments(line: str) -> list[list[str]]:
  """The line's commands, split at && ; | and cut at redirections."""
  segments, current = [], []
  try:
    tokens = shlex.split(line, comments=True)
  except ValueError:  # Unbalanced quotes: not a command line.
    return []
  for token in tokens + [";"]:
    if token in SEPARATORS:
      cut = next((i for i, t in enumerate(current) if t in ENDS), None)
      segments.append(current[:cut])
      current = []
    else:
      current.append(token)
  return [s for s in segments if s]


def _docstring_blocks(path: str) -> list[str]:
  """Indented usage lines of a module's docstring (its shell examples)."""
  with open(os.path.join(REPO, path)) as f:
    doc = ast.get_docstring(ast.parse(f.read())) or ""
  blocks, block = [], []
  for line in doc.splitlines() + [""]:
    if line.startswith("    "):
      block.append(line)
    elif block:
      blocks.append("\n".join(block))
      block = []
  return [b for b in blocks if b.split()[0].startswith(COMMAND_WORDS)]


def _sources():
  """(where, block of shell lines) in the docs and the docstrings."""
  for doc in DOCS:
    with open(os.path.join(REPO, doc)) as f:
      for _, block in BLOCK.findall(f.read()):
        yield doc, block
  for module in MODULES:
    for block in _docstring_blocks(module):
      yield module, block


def _commands():
  """(where, line, command name, arguments) of every command shown; lines
  that mention a command in another form give (where, line, None, None)."""
  found = []
  for where, block in _sources():
    for line in _lines(block):
      parsed = [_invocation(s) for s in _segments(line)]
      parsed = [p for p in parsed if p]
      for name, args in parsed:
        found.append((where, line, name, args))
      if not parsed and MENTIONS.search(line.split("#")[0]):
        found.append((where, line, None, None))
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


def _takes(default, value: str) -> bool:
  """Whether an override VALUE parses as a field of `default`'s type (what
  ml_collections' flags do); None (placeholders) and strings take anything."""
  try:
    if isinstance(default, bool):
      return value.lower() in ("true", "false", "1", "0")
    if isinstance(default, (int, float)):
      type(default)(value.replace("_", ""))
    elif isinstance(default, tuple):
      return isinstance(ast.literal_eval(value), tuple)
    return True
  except (ValueError, SyntaxError):
    return False


def test_the_docs_show_every_command():
  names = {name for _, _, name, _ in COMMANDS}
  assert set(_flags_by_command()) <= names
  assert len(COMMANDS) > 80


@pytest.mark.parametrize(
    "where, line, name, args", COMMANDS,
    ids=[f"{c[0]}:{c[2]}:{i}" for i, c in enumerate(COMMANDS)])
def test_every_command_shown_parses(where, line, name, args):
  assert name is not None, f"{where}: a command in a form not parsed: {line}"
  known = _flags_by_command()
  assert name in known, f"{where}: unknown command {name!r} in: {line}"
  config = None
  for arg in args:
    if not arg.startswith("--") or arg == "--":
      continue
    flag, _, value = arg[2:].partition("=")
    if flag.startswith("config."):
      assert config is not None, f"{where}: --{flag} before --config: {line}"
      node = config
      for part in flag.split(".")[1:]:
        if part not in node:
          pytest.fail(f"{where}: the config has no field {flag}: {line}")
        node, default = node[part], node[part]
      if not _takes(default, value):
        pytest.fail(f"{where}: --{flag}={value} is not a {type(default)}")
      continue
    boolean_off = flag.startswith("no") and flag[2:] in known[name]
    assert flag in known[name] or boolean_off, (
        f"{where}: vit-jax {name} has no flag --{flag}: {line}")
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
