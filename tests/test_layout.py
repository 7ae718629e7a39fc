"""The package keeps the shape its docstring draws: every folder named there
and no other, few modules at the root, no two modules with one basename, none
named like a standard-library module, and commands that nothing imports."""

import ast
import collections
import os
import re
import sys

import vit_jax

PACKAGE = os.path.dirname(vit_jax.__file__)


def _modules():
  """Paths of the package's modules, relative to the package."""
  for folder, _, files in os.walk(PACKAGE):
    for name in files:
      if name.endswith(".py"):
        yield os.path.relpath(os.path.join(folder, name), PACKAGE)


def test_the_docstring_names_every_folder_and_no_other():
  folders = sorted(d for d in os.listdir(PACKAGE)
                   if os.path.isfile(os.path.join(PACKAGE, d, "__init__.py")))
  assert sorted(re.findall(r"vit_jax/(\w+)/", vit_jax.__doc__)) == folders


def test_the_docstring_names_every_module_at_the_root():
  root = vit_jax.__doc__.split("vit_jax/", 1)[1].split("vit_jax/commands/")[0]
  for module in _modules():
    if os.sep not in module and not module.startswith("__"):
      assert re.search(rf"\b{module[:-3]}\b", root), module


def test_at_most_eight_modules_at_the_root():
  root = [
      m for m in _modules()
      if os.sep not in m and m not in ("__init__.py", "__main__.py")
  ]
  assert len(root) <= 8, root


def test_no_two_modules_share_a_basename():
  names = collections.Counter(
      os.path.basename(m) for m in _modules() if not m.endswith("__init__.py"))
  assert [n for n, count in names.items() if count > 1] == []


def test_no_module_is_named_like_a_standard_library_module():
  names = {os.path.basename(m)[:-3] for m in _modules()
          } - {"__init__", "__main__"}
  assert sorted(names & set(sys.stdlib_module_names)) == []


def _imports(module: str) -> set[str]:
  """The modules `module` imports (`from a import b` counts as a and a.b)."""
  with open(os.path.join(PACKAGE, module)) as f:
    tree = ast.parse(f.read())
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      names.add(node.module)
      names.update(f"{node.module}.{alias.name}" for alias in node.names)
  return names


def test_the_library_never_imports_a_command():
  for module in _modules():
    if module.startswith("commands" + os.sep):
      continue
    imported = _imports(module)
    assert not any(
        name.startswith("vit_jax.commands") for name in imported), module
    # cli.py finds the commands by name at run time (importlib), not here.
