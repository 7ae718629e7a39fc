"""config.imports: the user's modules, loaded by path or by name."""

import sys

import ml_collections
import pytest

from vit_jax.config import imports
from vit_jax.errors import UserError


def _config(*entries):
  return ml_collections.ConfigDict({"imports": tuple(entries)})


def test_paths_are_made_absolute_and_same_basenames_are_two_modules(
    tmp_path, monkeypatch):
  for folder in ("a", "b"):
    (tmp_path / folder).mkdir()
    (tmp_path / folder / "ext.py").write_text(f"WHERE = {folder!r}\n")
  monkeypatch.chdir(tmp_path)
  config = _config("a/ext.py", "b/ext.py")
  imports.load(config)
  # config.json records where they are: a resumed run finds them anywhere.
  assert config.imports == (str(
      tmp_path / "a" / "ext.py"), str(tmp_path / "b" / "ext.py"))
  loaded = [imports._LOADED[path] for path in config.imports]
  assert [module.WHERE for module in loaded] == ["a", "b"]
  assert loaded[0].__name__ != loaded[1].__name__
  assert all(sys.modules[module.__name__] is module for module in loaded)
  imports.load(config)  # Once per process.
  assert [imports._LOADED[path] for path in config.imports] == loaded


def test_a_module_that_fails_is_loaded_afresh_next_time(tmp_path):
  path = tmp_path / "flaky.py"
  path.write_text("raise RuntimeError('not yet')\n")
  with pytest.raises(RuntimeError, match="not yet"):
    imports.load(_config(str(path)))
  path.write_text("READY = True\n")
  imports.load(_config(str(path)))
  assert imports._LOADED[str(path)].READY


def test_missing_modules_and_dependencies_are_named(tmp_path, monkeypatch):
  with pytest.raises(UserError, match="no_such_file.py', which is not a "
                     "file"):
    imports.load(_config(str(tmp_path / "no_such_file.py")))
  with pytest.raises(
      UserError, match="'no_such_module_xyz', which cannot be "
      "imported .*put it on PYTHONPATH"):
    imports.load(_config("no_such_module_xyz"))
  (tmp_path / "needs_more.py").write_text("import no_such_dependency_xyz\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  with pytest.raises(
      UserError, match="'needs_more', which imports "
      "'no_such_dependency_xyz', not installed"):
    imports.load(_config("needs_more"))
