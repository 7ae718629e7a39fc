"""Every command reports a mistake of the user's making as one line.

`error: ...` on stderr, exit status 2, no traceback (unless --verbose),
nothing written, and without loading what only reading data or compiling
for a TPU needs (TensorFlow, TFDS, clu, libtpu), nor Orbax: in about a
second.
"""

import os
import shutil
import subprocess
import sys

from absl import app
import flax
import jax
import numpy as np
import pytest

from tests.helpers import processes
from vit_jax import cli
from vit_jax import models
from vit_jax.errors import UserError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MISTAKES = {
    "main: bad value": ([
        "vit_jax", "train", "--config=configs/digits.py:runlocal",
        "--workdir=/tmp/unused", "--config.lr=-1"
    ], "error: config.lr=-1.0 must be positive."),
    "main: misspelt field": ([
        "vit_jax", "train", "--config=configs/digits.py:runlocal",
        "--workdir=/tmp/unused", "--config.totl_steps=5"
    ], "error: the config has no field 'totl_steps'; Did you mean "
                             "\"total_steps\""),
    "main: unknown preset": ([
        "vit_jax", "train", "--config=configs/finetune.py:nosuch",
        "--workdir=/tmp/unused"
    ], "error: flag --config=configs/finetune.py:nosuch: Unknown fine-tuning "
                             "preset 'nosuch'"),
    "export: a RoPE model as a bare timm file": ([
        "vit_jax", "export",
        "--checkpoint=tests/references/tiny_rope_axial.safetensors",
        "--format=timm", "--out={tmp}/rope.safetensors"
    ], ("error: timm's VisionTransformer has no place for this model's "
        "config.model.rope='axial'")),
    # configs/digits.py with its Mixer variant: the option a Mixer cannot
    # take is named (and, in the same line, the pooling it needs).
    "main: RoPE on a Mixer": ([
        "vit_jax", "train", "--config=configs/digits.py",
        "--workdir=/tmp/unused", "--config.model.variant=digits-mixer",
        "--config.model.rope=dinov3"
    ], ("error: digits-mixer is an MLP-Mixer, and rope='dinov3' is an option "
        "only a ViT takes: set --config.model.rope=none "
        "--config.model.classifier=gap.")),
    "main: SwiGLU on a Mixer": ([
        "vit_jax", "train", "--config=configs/digits.py",
        "--workdir=/tmp/unused", "--config.model.variant=digits-mixer",
        "--config.model.swiglu=True", "--config.model.classifier=gap"
    ], ("error: digits-mixer is an MLP-Mixer, and swiglu=True is an option "
        "only a ViT takes: set --config.model.swiglu=False.")),
    "main: layer decay past 1": ([
        "vit_jax", "train", "--config=configs/digits.py:runlocal",
        "--workdir=/tmp/unused", "--config.layer_decay=1.5"
    ], "error: config.layer_decay=1.5 must be in (0, 1]"),
    "main: unknown checkpoint family": ([
        "vit_jax", "train", "--config=configs/finetune.py:digits,family=eva",
        "--workdir=/tmp/unused"
    ], "error: flag --config=configs/finetune.py:digits,family=eva: Unknown "
                                        "checkpoint family 'eva'"),
    "main: negative timeout": ([
        "vit_jax", "train", "--config=configs/digits.py:runlocal",
        "--workdir=/tmp/unused", "--lost_process_timeout=-3"
    ], "error: flag --lost_process_timeout=-3.0: give a positive number of "
                               "seconds"),
    "main: exit status past 255": ([
        "vit_jax", "train", "--config=configs/digits.py:runlocal",
        "--workdir=/tmp/unused", "--preempted_exit_code=999"
    ], "error: flag --preempted_exit_code=999: an exit status is 0 to 255; "
                                   "give 0"),
    "main: process id past the count": ([
        "vit_jax", "train", "--config=configs/digits.py:runlocal",
        "--workdir=/tmp/unused", "--num_processes=2", "--process_id=2"
    ], "error: flags process_id=2, num_processes=2: --process_id counts from "
                                        "0: give one below --num_processes."),
    "predict: no classes shown": ([
        "vit_jax", "predict", "--checkpoint=/no/such.npz", "--top_k=0",
        "docs/digits"
    ], "error: flag --top_k=0: 0 is not a positive integer"),
    "fewshot: missing checkpoint": ([
        "vit_jax", "fewshot", "--config=configs/fewshot.py:runlocal",
        "--checkpoints=/no/such/weights.npz"
    ], "error: No weights at /no/such/weights.npz"),
    "export: missing checkpoint": (
        ["vit_jax", "export", "--checkpoint=/no/such.npz",
         "--out=/tmp/x.npz"], "error: No weights at /no/such.npz"),
    "inspect: missing checkpoint": (
        ["vit_jax", "inspect",
         "/no/such.npz"], "error: No weights at /no/such.npz"),
    "zeroshot: a checkpoint without a text tower": ([
        "vit_jax", "zeroshot",
        "--checkpoint=tests/references/tiny_timm.safetensors"
    ], "error: tests/references/tiny_timm.safetensors holds no text tower"),
    "convert-data: no dataset": (
        ["vit_jax", "convert-data"], "error: Pass --dataset=NAME (a prepared "
        "TFDS dataset)"),
    "zeroshot: missing checkpoint": ([
        "vit_jax", "zeroshot", "--checkpoint=/nonexistent/ckpt"
    ], "error: No weights at /nonexistent/ckpt: the path does not exist."),
    "train: an unknown objective": ([
        "vit_jax", "train", "--config=configs/digits.py:runlocal",
        "--workdir=/tmp/unused", "--config.objective=byol"
    ], "error: config.objective='byol' is not an objective; known: "),
    "predict: an image-text model without class names": (
        [
            "vit_jax", "predict",
            "--checkpoint=tests/references/tiny_hf_siglip", "docs/digits"
        ], "error: tests/references/tiny_hf_siglip is an image-text model: it "
        "classifies among names you give"),
    "predict: missing checkpoint": (
        ["vit_jax", "predict", "--checkpoint=/no/such.npz",
         "docs/digits"], "error: No weights at /no/such.npz"),
    "analyze: images as arguments": (
        ["vit_jax", "analyze", "--checkpoint=/no/such.npz",
         "docs/digits"], "error: Unexpected arguments ['docs/digits']"),
    "benchmark: unknown variant": (
        ["vit_jax", "benchmark",
         "--variant=ViT-X/1"], "error: Unknown model variant 'ViT-X/1'"),
    "fewshot: bad protocol": ([
        "vit_jax", "fewshot", "--config=configs/fewshot.py:runlocal",
        "--checkpoints=random", "--config.fewshot.l2_reg=-1"
    ], "error: config.fewshot.l2_reg and every value of config.fewshot.l2_grid "
                              "must be positive."),
    "plan: bad value": ([
        "vit_jax", "plan", "--config=configs/digits.py", "--topology=v5e:2x2",
        "--config.batch_size=0"
    ], "error: config.batch_size=0 must be positive."),
    "vtab: bad value": ([
        "vit_jax", "vtab", "--config=configs/vtab.py", "--checkpoint=/no/such",
        "--workdir={tmp}/vtab", "--config.lr=-1"
    ], "error: config.lr=-1.0 must be positive."),
    "export: a directory onto a file": ([
        "vit_jax", "export", "--checkpoint=/no/such.npz", "--format=hf",
        "--out={tmp}/a_file"
    ], "error: --out={tmp}/a_file is an existing file, and --format=hf writes "
                                        "a directory; give a new path"),
    "export: a file onto a directory": ([
        "vit_jax", "export", "--checkpoint=/no/such.npz", "--format=npz",
        "--out={tmp}"
    ], "error: --out={tmp} is a directory, and --format=npz writes one file; "
                                        "give the file's path"),
    "main: a teacher that is not there": ([
        "vit_jax", "train", "--config=configs/distill.py:digits,runlocal",
        "--workdir=/tmp/unused", "--config.distill.teachers=('/no/teacher',)"
    ], "error: config.distill.teachers[0]: no checkpoint at /no/teacher."),
    "main: a missing image folder": ([
        "vit_jax", "train", "--config=configs/digits.py:runlocal",
        "--workdir={tmp}/run", "--config.dataset=folder:{tmp}/no_images"
    ], "error: Image folder {tmp}/no_images does not exist."),
    "benchmark-input: a start past the stream": ([
        "vit_jax", "benchmark-input", "--config=configs/digits.py:runlocal",
        "--batches=1", "--start_step=100000000000000000000"
    ], "error: start_step=100000000000000000000 with the 3 batches read "
                                                 "from it goes past the "
                                                 "stream's last step"),
    "main: a RoPE base of 0": ([
        "vit_jax", "train", "--config=configs/digits.py",
        "--workdir=/tmp/unused", "--config.model.rope=axial",
        "--config.model.rope_temperature=0"
    ], "error: config.model.rope_temperature=0.0 must be positive"),
    "main: MAP heads without a MAP head": ([
        "vit_jax", "train", "--config=configs/digits.py:runlocal",
        "--workdir=/tmp/unused", "--config.model.map_heads=3"
    ], "error: config.model.map_heads=3 sets the heads of a MAP head, and "
                                           "classifier=token has none"),
    "analyze: MAE's target for a checkpoint without MAE's decoder": (
        ["vit_jax", "analyze", "--checkpoint={classifier}", "--norm_pix_loss"
        ], "error: --norm_pix_loss says what an MAE decoder predicts, and "
        "{classifier} has none"),
    "predict: two class names for ten classes": ([
        "vit_jax", "predict", "--checkpoint={classifier}", "--class_names=a,b",
        "docs/digits"
    ], "error: --class_names names 2 classes, and {classifier}'s head has 10"),
    "main: a broken config.json beside the weights": ([
        "vit_jax", "train", "--config=configs/digits.py:runlocal",
        "--workdir={tmp}/run", "--config.init.checkpoint={tmp}/timm_dir"
    ], "error: {tmp}/timm_dir/config.json is not a JSON object (Expecting "
                                                      "property name"),
}
# Run as `python -m vit_jax` does; then says on stderr which of the modules
# a mistake should not wait for were loaded.
_RUN_AND_LIST_LOADED = """
import sys
from vit_jax import __main__ as entry
try:
  entry.main()
finally:
  loaded = [name for name in ("tensorflow", "tensorflow_datasets", "clu",
                              "orbax.checkpoint") if name in sys.modules]
  with open("/proc/self/maps") as maps:
    loaded += ["libtpu.so"] if "libtpu.so" in maps.read() else []
  print("loaded:", " ".join(loaded), file=sys.stderr)
"""


def _run(args):
  return subprocess.run([sys.executable, "-m", *args], cwd=REPO,
                        env=processes.command_env(), capture_output=True,
                        text=True, timeout=300)


@pytest.fixture(scope="module")
def classifier(tmp_path_factory) -> str:
  """A .npz of the `testing` ViT with a head of 10 classes (released
  checkpoints' names), made once for the cases that name {classifier}."""
  model = models.create_model("testing", 10)
  params = jax.jit(model.init)(jax.random.key(0), np.zeros(
      (1, 16, 16, 3)))["params"]
  path = str(tmp_path_factory.mktemp("classifier") / "testing.npz")
  np.savez(path, **flax.traverse_util.flatten_dict(params, sep="/"))
  return path


@pytest.mark.parametrize("case", MISTAKES)
def test_a_user_mistake_is_one_line_and_status_2(case, tmp_path, request):
  args, message = MISTAKES[case]
  names = {"tmp": tmp_path}
  if any("{classifier}" in arg for arg in args):
    names["classifier"] = request.getfixturevalue("classifier")
  (tmp_path / "a_file").write_text("kept")
  weights = tmp_path / "timm_dir"  # Written by timm, its config.json cut.
  weights.mkdir()
  shutil.copy(
      os.path.join(REPO, "tests", "references", "tiny_timm.safetensors"),
      weights / "model.safetensors")
  (weights / "config.json").write_text('{"architecture": "vit_tiny", ')
  before = sorted(tmp_path.rglob("*"))
  done = subprocess.run([
      sys.executable, "-c", _RUN_AND_LIST_LOADED,
      *[arg.format(**names) for arg in args[1:]]
  ], cwd=REPO, env=processes.command_env(), capture_output=True, text=True,
                        timeout=300)
  assert done.returncode == 2, done.stderr[-2000:]
  assert "Traceback" not in done.stderr, done.stderr[-2000:]
  errors = [
      line for line in done.stderr.splitlines() if line.startswith("error: ")
  ]
  assert len(errors) == 1 and errors[0].startswith(
      message.format(**names)), errors
  assert done.stderr.splitlines()[-1] == "loaded: ", done.stderr[-2000:]
  assert sorted(tmp_path.rglob("*")) == before  # Nothing written.
  assert (tmp_path / "a_file").read_text() == "kept"


def test_an_unknown_dataset_leaves_the_new_workdir_unmade(tmp_path):
  """Found in TFDS's registry (TensorFlow is not loaded for it): one line,
  status 2, and nothing written (the workdir is made once every check has
  passed)."""
  done = _run([
      "vit_jax", "train", "--config=configs/digits.py:runlocal",
      f"--workdir={tmp_path / 'run'}", "--config.dataset=no_such_dataset"
  ])
  assert done.returncode == 2, done.stderr[-2000:]
  assert done.stderr.strip().splitlines() == [
      "error: Unknown dataset 'no_such_dataset': TFDS has no builder of that "
      "name. Use a TFDS name (e.g. 'cifar10'), the built-in 'digits', or "
      "'folder:/path/to/images' for an image folder."
  ]
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize("args, level", [([], "2"), (["--verbose"], "0")])
def test_the_entry_point_sets_the_log_level_before_jax_loads(args, level):
  """TensorFlow's and XLA's C++ lines are off unless details are asked for:
  JAX, imported by cli, would set its own default (1) had it come first."""
  program = (
      "import os, sys\n"
      "from vit_jax import __main__ as entry\n"
      "try:\n"
      "  entry.main()\n"
      "except SystemExit:\n"
      "  print(os.environ['TF_CPP_MIN_LOG_LEVEL'], 'jax' in sys.modules)")
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  done = subprocess.run([sys.executable, "-c", program, "help", *args],
                        cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=300)
  assert done.stdout.split() == [level, "True"], done.stderr[-2000:]


def test_verbose_shows_the_traceback():
  args, _ = MISTAKES["export: missing checkpoint"]
  done = _run(args + ["--verbose"])
  assert done.returncode != 0
  assert "Traceback" in done.stderr and "WeightsError" in done.stderr


@pytest.mark.parametrize("error, status",
                         [(UserError("bad value"), 2),
                          (app.UsageError("no such flag"), 2),
                          (FileNotFoundError("/no/such/file"), 2),
                          (PermissionError("denied"), 2),
                          (ConnectionResetError("reset by peer"), 75),
                          (TimeoutError("slow"), 75),
                          (OSError("storage did not answer"), 75)])
def test_mistakes_exit_2_and_storage_errors_that_may_pass_exit_75(
    error, status):
  """A scheduler retries 75 (EX_TEMPFAIL), not 2: a mistake recurs."""
  assert cli.exit_status(error) == status


@pytest.mark.parametrize("plugin, platforms",
                         [(None, "cpu"), ("jax_cuda12_plugin", "cuda,cpu"),
                          ("jax_cuda13_plugin", "cuda,cpu")])
def test_libtpu_without_tpu_chips_is_left_out(monkeypatch, plugin, platforms):
  """libtpu installed (the `tpu` extra) on a host without TPU chips: JAX
  uses the CPU, or the GPU of either CUDA extra, instead of starting it."""
  installed = {"libtpu", plugin}

  def find_spec(name):
    return object() if name in installed else None

  monkeypatch.delenv("JAX_PLATFORMS", raising=False)
  monkeypatch.setattr(cli.importlib.util, "find_spec", find_spec)
  monkeypatch.setattr(cli.glob, "glob", lambda pattern: [])  # No chips.
  updates = {}
  monkeypatch.setattr(cli.jax.config, "update", updates.__setitem__)
  cli.skip_absent_tpu()
  assert updates == {"jax_platforms": platforms}
