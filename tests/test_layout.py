"""The package keeps the shape its docstring draws: every folder named there
and no other, imports that only go down its layers, few modules at the root,
no two modules with one basename, none named like a standard-library module,
commands that nothing imports, no circle of imports, and a weights core that
imports none of the origins' rooms."""

import ast
import collections
import os
import re
import sys

import vit_jax

PACKAGE = os.path.dirname(vit_jax.__file__)


def _modules(package: str = PACKAGE):
  """Paths of the package's modules, relative to the package."""
  for folder, _, files in os.walk(package):
    for name in files:
      if name.endswith(".py"):
        yield os.path.relpath(os.path.join(folder, name), package)


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


def _dotted(module: str) -> str:
  """'weights/origins.py' -> 'vit_jax.weights.origins' (a package's
  __init__.py: the package's name)."""
  parts = ["vit_jax", *module[:-len(".py")].split(os.sep)]
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_imports(path: str, known: set[str]) -> set[str]:
  """The modules of `known` that the file at `path` imports, at any depth
  of its code (a function's imports too): `from a import b` is a.b where
  that is a module, else a."""
  with open(path) as f:
    tree = ast.parse(f.read())
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      for alias in node.names:
        name = f"{node.module}.{alias.name}"
        found.add(name if name in known else node.module)
  return found & known


def _package_imports(package: str = PACKAGE) -> dict[str, set[str]]:
  """{module: the package's modules it imports} over the whole package."""
  modules = {_dotted(m): m for m in _modules(package)}
  return {
      name: _module_imports(os.path.join(package, path), set(modules)) - {name}
      for name, path in modules.items()
  }


def _circles(imports: dict[str, set[str]]) -> list[list[str]]:
  """The import circles: each set of modules that import one another in a
  ring, sorted (the strongly connected components of more than one
  module, by Tarjan's algorithm)."""
  index, low, stack, circles = {}, {}, [], []

  def visit(module):
    index[module] = low[module] = len(index)
    stack.append(module)
    for other in sorted(imports.get(module, ())):
      if other not in index:
        visit(other)
        low[module] = min(low[module], low[other])
      elif other in stack:
        low[module] = min(low[module], index[other])
    if low[module] == index[module]:
      component = []
      while not component or component[-1] != module:
        component.append(stack.pop())
      if len(component) > 1:
        circles.append(sorted(component))

  for module in sorted(imports):
    if module not in index:
      visit(module)
  return sorted(circles)


def test_no_module_imports_itself_through_others():
  """No circle of imports in the package (`farm-studio look` draws none):
  a function's import counts as the module's."""
  assert _circles(_package_imports()) == []


def test_a_circle_through_a_functions_import_is_caught(tmp_path):
  imports = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
  assert _circles(imports) == [["a", "b", "c"]]
  module = tmp_path / "m.py"
  module.write_text("def f():\n  from vit_jax.weights import origins\n")
  assert _module_imports(
      str(module), {"vit_jax.weights.origins"}) == {"vit_jax.weights.origins"}


# The origins' rooms of vit_jax/weights/ (vit_jax/weights/__init__.py): each
# imports the core (weights/*.py), which imports none of them; what the
# core needs of a room, the room registers into `origins`' tables. files/
# (the formats every origin's files come in) lies beneath the core: it
# imports nothing of it, and the core reads files through it.
_ROOMS = ("big_vision", "mae", "timm", "transformers")


def test_the_weights_core_imports_no_room():
  """At any depth of its code; the package's face (__init__) imports the
  rooms, so that they register."""
  imports = _package_imports()
  core = [
      name for name in imports
      if re.fullmatch(r"vit_jax\.weights\.\w+", name) and
      name.split(".")[-1] not in _ROOMS + ("files",)
  ]
  assert core and "vit_jax.weights.origins" in core
  rooms = tuple(f"vit_jax.weights.{room}" for room in _ROOMS)
  assert [(name, sorted(i
                        for i in imports[name]
                        if i.startswith(rooms)))
          for name in core
          if any(i.startswith(rooms) for i in imports[name])] == []
