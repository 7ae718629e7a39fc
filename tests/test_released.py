"""Released checkpoints by name or URL, through the local download cache.

The bucket is fake-gcs-server on 127.0.0.1 (tests/helpers/gcs_server.py),
serving a
tiny `testing` model written in the released .npz form; nothing leaves
the machine. Every test has its own cache directory.
"""

import os
import re
import subprocess
import sys
import threading

import flax
import fsspec
import jax
import numpy as np
import pytest

from tests.helpers import gcs_server
from tests.helpers import tiny_models
from vit_jax import inference
from vit_jax import models
from vit_jax import paths
from vit_jax import weights
from vit_jax.config import defaults
from vit_jax.errors import DownloadError
from vit_jax.errors import UserError
from vit_jax.models import VARIANTS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET = "vit_models"
NAME = "ViT-testing@i21k"  # Added to the table by `named`.


@pytest.fixture(scope="module")
def gcs():
  saved = dict(os.environ)
  server = gcs_server.GcsServer()
  server.create_bucket(BUCKET)
  paths.configure_storage()
  yield server
  server.stop()
  os.environ.clear()  # configure_storage() also set variables; undo all.
  os.environ.update(saved)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[bytes, dict]:
  """(the .npz bytes, its flat params) of a `testing` model with a head."""
  model_config = defaults.get_model_config()
  model_config.variant, model_config.gelu_approximate = "testing", True
  model = tiny_models.build(model_config, num_classes=7)
  params = models.init_on_zeros(model, jax.random.key(0), 16)
  path = str(tmp_path_factory.mktemp("tiny") / "testing.npz")
  weights.save_npz(params, path)
  with open(path, "rb") as f:
    data = f.read()
  return data, dict(np.load(path))


def upload(data: bytes, key: str) -> str:
  """`data` as the object gs://vit_models/KEY; returns its URL."""
  fs, inner = fsspec.core.url_to_fs(f"gs://{BUCKET}/{key}")
  with fs.open(inner, "wb") as f:
    f.write(data)
  return f"gs://{BUCKET}/{key}"


def delete(url: str):
  fs, inner = fsspec.core.url_to_fs(url)
  fs.rm(inner)


@pytest.fixture(autouse=True)
def fresh_process_state(monkeypatch, tmp_path):
  """Each test announces afresh and caches in its own directory."""
  weights.forget_announced()
  monkeypatch.setenv(weights.CACHE_VARIABLE, str(tmp_path / "cache"))
  monkeypatch.delenv(weights.OFFLINE_VARIABLE, raising=False)


@pytest.fixture
def named(gcs, tiny, monkeypatch, request):
  """NAME in the released table, pointing at a fresh object; its URL."""
  url = upload(tiny[0], f"imagenet21k/{request.node.name}/testing.npz")
  monkeypatch.setitem(
      weights.RELEASED, NAME,
      weights.Released(url, "testing", "a tiny model for tests"))
  return url


def assert_same(tensors, expected):
  assert sorted(tensors) == sorted(expected)
  for key, value in expected.items():
    np.testing.assert_array_equal(tensors[key], value)


def downloads(capsys) -> int:
  return capsys.readouterr().err.count("Downloading ")


def test_a_url_is_downloaded_once_then_read_from_the_cache(
    gcs, tiny, tmp_path, capsys):
  url = upload(tiny[0], "imagenet21k/url/testing.npz")
  fmt, tensors = weights.read_file(url)
  assert fmt == "npz" and downloads(capsys) == 1
  assert_same(tensors, tiny[1])
  # The copy mirrors the bucket's path (its origin is read from content).
  copy = tmp_path / "cache/gs" / BUCKET / "imagenet21k/url/testing.npz"
  assert copy.read_bytes() == tiny[0]
  assert weights.file_origin(url) == ("released", True)

  weights.forget_announced()  # As a new process would.
  _, again = weights.read_file(url)
  err = capsys.readouterr().err
  assert "Downloading" not in err and "Using cached" in err
  assert_same(again, tiny[1])


def test_a_changed_object_is_downloaded_again_and_a_gone_one_is_not_needed(
    gcs, tiny, capsys):
  url = upload(tiny[0], "imagenet21k/changed/testing.npz")
  weights.read_file(url)
  changed = {k: v + 1 for k, v in tiny[1].items()}
  weights.save_npz(changed, url)
  _, tensors = weights.read_file(url)
  assert downloads(capsys) == 2
  assert_same(tensors, changed)

  delete(url)  # Unreachable: the cached copy is used, with a warning.
  weights.forget_announced()
  _, tensors = weights.read_file(url)
  err = capsys.readouterr().err
  assert "Could not check" in err and "Downloading" not in err
  assert_same(tensors, changed)


def test_a_released_name_loads_and_predicts_without_a_config(
    named, tiny, capsys):
  loaded = inference.load(NAME)
  assert loaded.config.model.variant == "testing"
  assert loaded.checkpoint == NAME and loaded.num_classes == 7
  flat = flax.traverse_util.flatten_dict(loaded.params, sep="/")
  assert_same({k: np.asarray(v) for k, v in flat.items()}, tiny[1])
  # The name was read three times (architecture, GELU, parameters).
  assert downloads(capsys) == 1


def test_a_name_for_another_variant_is_refused_before_downloading(
    named, tmp_path):
  config = defaults.get_config()
  config.init.checkpoint = NAME
  config.init.cache_dir = str(tmp_path / "own_cache")
  refused = ("ViT-testing@i21k is a testing checkpoint but "
             "config.model.variant is ViT-B/16; set "
             "--config.model.variant=testing")
  with pytest.raises(weights.WeightsError, match=refused):
    weights.decide(config)
  assert not os.path.exists(config.init.cache_dir)

  config.model.variant = "testing"
  config.image_size = 16
  config = weights.decide(config)  # A released name: tanh, not downloaded.
  assert config.model.gelu_approximate is True
  assert not os.path.exists(config.init.cache_dir)
  model = tiny_models.build(config.model, num_classes=7)
  loaded, report = weights.load_for_config(config, NAME,
                                           models.param_shapes(model, 16))
  assert report.ok and report.path == NAME
  assert os.listdir(config.init.cache_dir) == ["gs"]  # config.init.cache_dir.


def test_offline_mode_refuses_to_download_but_reads_the_cache(
    named, tiny, tmp_path, monkeypatch):
  monkeypatch.setenv(weights.OFFLINE_VARIABLE, "1")
  target = weights.cache_path(named)
  with pytest.raises(DownloadError) as error:
    weights.read_file(NAME)
  message = str(error.value)
  for part in ("Offline mode is on", NAME, named, target,
               "unset VIT_JAX_OFFLINE"):
    assert part in message

  monkeypatch.delenv(weights.OFFLINE_VARIABLE)
  weights.read_file(NAME)  # Online: downloaded.
  delete(named)
  monkeypatch.setenv(weights.OFFLINE_VARIABLE, "1")
  assert_same(weights.read_file(NAME)[1], tiny[1])


def test_the_offline_flag_reaches_the_command(gcs, tiny, tmp_path):
  url = upload(tiny[0], "imagenet21k/flag/testing.npz")
  result = subprocess.run(
      [sys.executable, "-m", "vit_jax", "inspect", "--offline", url], cwd=REPO,
      capture_output=True, text=True, timeout=120, env={
          **gcs.env(), weights.CACHE_VARIABLE: str(tmp_path / "cache")
      })
  assert result.returncode == 2, result.stderr[-2000:]
  assert "error: Offline mode is on" in result.stderr


def test_concurrent_loaders_on_one_host_download_once(gcs, tiny, capsys):
  url = upload(tiny[0], "imagenet21k/concurrent/testing.npz")
  start = threading.Barrier(3)
  results = []

  def load():  # Its own lock file handle: as another process would.
    start.wait()
    results.append(weights.locate(url))

  threads = [threading.Thread(target=load) for _ in range(3)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  assert len(results) == 3 and len(set(results)) == 1
  assert downloads(capsys) == 1
  with open(results[0], "rb") as f:
    assert f.read() == tiny[0]
  leftovers = [
      n for n in os.listdir(os.path.dirname(results[0])) if n.endswith(".part")
  ]
  assert not leftovers


def test_a_directory_at_a_url_is_read_in_place(gcs, tiny, tmp_path):
  upload(tiny[0], "workdir/checkpoints/1/default/_METADATA")
  assert weights.locate(f"gs://{BUCKET}/workdir") == f"gs://{BUCKET}/workdir"
  assert not os.path.exists(tmp_path / "cache")
  # Never cached, so a cache that could not hold files does not matter.
  remote_cache = f"gs://{BUCKET}/cache"
  assert weights.locate(f"gs://{BUCKET}/workdir",
                        remote_cache) == (f"gs://{BUCKET}/workdir")
  url = upload(tiny[0], "imagenet21k/remote_cache/testing.npz")
  with pytest.raises(UserError, match="must be a local directory"):
    weights.locate(url, remote_cache)


def test_offline_mode_says_a_url_may_be_an_orbax_directory(
    monkeypatch, tmp_path):
  """Offline, nothing asks the storage whether the URL is a file (to put
  into the cache) or a workdir (read in place, so not offline)."""
  monkeypatch.setenv(weights.OFFLINE_VARIABLE, "1")
  url = "gs://some-bucket/workdirs/run/checkpoints"
  with pytest.raises(DownloadError) as error:
    weights.locate(url)
  message = str(error.value)
  for part in (f"no cached copy at {weights.cache_path(url)}",
               "If it is a weights file, put it at that path",
               "if it is an Orbax checkpoint directory, it is always read in "
               "place from the storage, never cached, so it cannot be read "
               "offline", "unset VIT_JAX_OFFLINE"):
    assert part in message


@pytest.fixture
def no_downloads(monkeypatch):
  """Offline mode off and no storage: any attempt to fetch fails loudly."""

  def fetch(url, *args):
    raise AssertionError(f"tried to fetch {url}")

  monkeypatch.setattr(fsspec.core, "url_to_fs", fetch)  # Every download's.


def test_commands_refuse_a_name_for_another_variant_before_downloading(
    no_downloads):
  """predict/analyze (`inference`) and `inspect NAME --config`."""
  config = defaults.get_config()
  config.model.variant = "testing"
  refused = ("ViT-L/16@i21k is a ViT-L/16 checkpoint but config.model.variant "
             "is testing; set --config.model.variant=ViT-L/16")
  for read in (lambda: inference.config_for("ViT-L/16@i21k", config),
               lambda: inference.load("ViT-L/16@i21k", config),
               lambda: weights.describe_weights("ViT-L/16@i21k", config),
               lambda: weights.compare_with_config("ViT-L/16@i21k", config)):
    with pytest.raises(weights.WeightsError, match=re.escape(refused)):
      read()


def test_an_unknown_name_lists_close_matches_and_how_to_pass_a_path():
  with pytest.raises(weights.WeightsError) as error:
    weights.read_file("ViT-B/16@in21k")
  message = str(error.value)
  assert message.startswith("No weights at ViT-B/16@in21k: the path does not "
                            "exist. It is not the name of a released")
  assert "ViT-B/16@i21k" in message and "Pass the path" in message
  with pytest.raises(weights.WeightsError) as error:  # A plain missing file.
    weights.read_file("/nonexistent/dir/model.npz")
  assert str(error.value) == ("No weights at /nonexistent/dir/model.npz: the "
                              "path does not exist.")


def test_the_table_names_variants_and_the_bucket_layout():
  for name, entry in weights.RELEASED.items():
    assert entry.variant in VARIANTS, name
    assert name.startswith(entry.variant + "@"), name
    assert (entry.url.startswith(
        ("gs://vit_models/", "gs://big_vision/", "gs://mixer_models/")) and
            entry.url.endswith(".npz")) or (re.fullmatch(
                r"https://huggingface\.co/timm/[a-z0-9_]+\.[a-z0-9_]+/"
                r"resolve/main/model\.safetensors",
                entry.url)) or (re.fullmatch(
                    r"https://dl\.fbaipublicfiles\.com/mae/(pretrain|"
                    r"visualize)/mae_(pretrain|visualize)_vit_(base|large|"
                    r"huge)(_full)?\.pth", entry.url)), name
  assert weights.lookup_released("ViT-B/16@i21k").url == (
      "gs://vit_models/imagenet21k/ViT-B_16.npz")
  assert weights.lookup_released("ViT-L/16@mae-full").url == (
      "https://dl.fbaipublicfiles.com/mae/pretrain/"
      "mae_pretrain_vit_large_full.pth")
  assert weights.lookup_released("R50+ViT-B/16@i21k-ft-i1k").url == (
      "gs://vit_models/imagenet21k+imagenet2012/R50+ViT-B_16.npz")
  assert weights.lookup_released("ViT-B/16@augreg-i21k").url == (
      "gs://vit_models/augreg/B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-"
      "do_0.0-sd_0.0.npz")
  stem = ("R_Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0--"
          "oxford_iiit_pet-steps_0k-lr_0.003-res_384")
  for given in (stem, stem + ".npz"):
    entry = weights.lookup_released(given)
    assert entry.url == f"gs://vit_models/augreg/{stem}.npz"
    assert entry.variant == "R+ViT-Ti/16"
  assert weights.lookup_released("B_16") is None
  assert weights.lookup_released("ViT-B/16") is None
  assert weights.cache_path(
      "gs://vit_models/imagenet21k+imagenet2012/ViT-L_16-224.npz",
      "/c") == "/c/gs/vit_models/imagenet21k+imagenet2012/ViT-L_16-224.npz"


def test_a_hub_name_downloads_over_http_and_loads_its_family(
    monkeypatch, tmp_path):
  """A RoPE encoder's name (timm's Hub repository, `model.safetensors`)
  resolves to its URL; through a local HTTP stand-in of the Hub, it is
  downloaded once into the cache and loads as its family (RoPE-ViT,
  axial), with timm's logits."""
  import functools  # pylint: disable=g-import-not-at-top
  import http.server  # pylint: disable=g-import-not-at-top

  from tests.helpers import compiled  # pylint: disable=g-import-not-at-top
  from tests.references import stored  # pylint: disable=g-import-not-at-top
  name = "ViT-S/16@rope-axial-i1k"
  assert weights.RELEASED[name].url == (
      "https://huggingface.co/timm/vit_small_patch16_rope_224.naver_in1k/"
      "resolve/main/model.safetensors")
  repository = tmp_path / "hub/timm/tiny_rope/resolve/main"
  repository.mkdir(parents=True)
  (repository / "model.safetensors").write_bytes(
      open(stored.path("tiny_rope_axial.safetensors"), "rb").read())

  class Quiet(http.server.SimpleHTTPRequestHandler):

    def log_message(self, *args):
      del args

  handler = functools.partial(Quiet, directory=str(tmp_path / "hub"))
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  url = (f"http://127.0.0.1:{server.server_port}/timm/tiny_rope/resolve/main/"
         "model.safetensors")
  VARIANTS.setdefault(
      "tiny-timm",
      models.Variant(hidden_size=32, mlp_dim=128, num_heads=4, num_layers=2,
                     patch_size=8))
  # The registered name of its size (other tests' modules register it too).
  variant = weights.read_architecture(
      stored.path("tiny_rope_axial.safetensors")).variant
  monkeypatch.setitem(weights.RELEASED, name,
                      weights.Released(url, variant, "a tiny stand-in"))
  try:
    path = weights.locate(name)
    assert path.startswith(str(
        tmp_path / "cache")) and weights.locate(name) == path
    loaded = inference.load(name, image_size=32)
    assert (loaded.model.form.rope,
            loaded.model.form.rope_axes) == ("axial", "column_row")
    logits = compiled.logits(loaded.model, jax.device_get(loaded.params),
                             stored.tiny_images())
    assert np.abs(logits - stored.tiny_rope_output("rope_axial")).max() < 1e-5
  finally:
    server.shutdown()
