"""The package keeps the shape its docstring draws: every folder named there
and no other, imports that only go down its layers, few modules at the root,
no two modules with one basename, none named like a standard-library module,
and commands that nothing imports."""

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


def _layers() -> list[list[str]]:
  """The docstring's layers, lowest first: each a list of folders and root
  modules (`vit_jax/data/` -> `data`)."""
  layers = []
  for line in vit_jax.__doc__.splitlines():
    match = re.match(r"  (\S[\w/, ]*?)(\s{2,}\S|$)", line)
    if match:
      layers.append([
          unit.strip().removeprefix("vit_jax/").rstrip("/")
          for unit in match.group(1).split(",")
      ])
  return layers


def _unit(module: str) -> str:
  """The folder or root module a module belongs to."""
  return module.split(os.sep)[0].removesuffix(".py")


def test_the_docstring_places_every_folder_and_root_module_once():
  placed = [unit for layer in _layers() for unit in layer]
  units = {_unit(m) for m in _modules()} - {"__init__", "__main__"}
  assert sorted(placed) == sorted(units)


def _against_the_order(imports_by_module: dict[str, set[str]],
                       layers: list[list[str]]) -> list[str]:
  """'module imports name' for each import of a later layer's module."""
  rank = {unit: i for i, layer in enumerate(layers) for unit in layer}
  against = []
  for module, names in sorted(imports_by_module.items()):
    for name in sorted(names):
      parts = name.split(".")
      if (parts[0] == "vit_jax" and len(parts) > 1 and parts[1] in rank and
          rank[parts[1]] > rank[_unit(module)]):
        against.append(f"{module} imports {name}")
  return against


def test_every_import_goes_down_the_layers():
  imports = {
      m: _imports(m)
      for m in _modules()
      if _unit(m) not in ("__init__", "__main__")
  }
  assert _against_the_order(imports, _layers()) == []


def test_an_import_up_the_layers_is_caught():
  layers = [["errors"], ["models"], ["training"]]
  imports = {
      os.path.join("models", "vit.py"): {"vit_jax.training.steps"},
      os.path.join("training", "steps.py"): {"vit_jax.models", "vit_jax"},
      "errors.py": set()
  }
  assert _against_the_order(imports, layers) == [
      f"{os.path.join('models', 'vit.py')} imports vit_jax.training.steps"
  ]


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
