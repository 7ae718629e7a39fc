# vit_jax in a container: TPU VMs and GKE TPU nodes (EXTRA=tpu, the
# default: JAX's TPU build with its libtpu) or NVIDIA GPUs (EXTRA=cuda:
# JAX's CUDA 12 build with its CUDA libraries; the host gives the driver).
# Python 3.13, the version CI tests constraints.txt on.
#
#   docker build -t vit-jax:tpu .
#   docker build --build-arg EXTRA=cuda -t vit-jax:cuda .
#   docker run --rm vit-jax:tpu train --config=configs/digits.py:runlocal \
#       --workdir=/tmp/run
#
# (on a TPU VM add --privileged --net=host for the TPU devices; on GPU
# hosts --gpus=all. EXTRA=cuda13 builds on CUDA 13, for drivers 580+.)
# The entry point is `vit-jax`; our configs are in the working directory
# (configs/...). The package is installed with the versions the tests ran
# (constraints.txt) on the Python they ran on; the build stage's tools and
# pip's cache stay behind, and it runs as an unprivileged user.
ARG PYTHON_IMAGE=python:3.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG EXTRA=tpu
WORKDIR /src
COPY setup.py constraints.txt ./
COPY vit_jax ./vit_jax
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir -c constraints.txt ".[${EXTRA}]"

FROM ${PYTHON_IMAGE}
COPY --from=build /opt/venv /opt/venv
COPY configs /opt/vit_jax/configs
RUN useradd --create-home --uid 1000 --user-group vit
# GKE's GPU nodes mount the driver's libraries in /usr/local/nvidia (images
# built on nvidia/cuda set the same path); nothing is there on TPU hosts.
ENV PATH=/opt/venv/bin:$PATH \
    LD_LIBRARY_PATH=/usr/local/nvidia/lib64 \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    PYTHONUNBUFFERED=1
# By number, so Kubernetes' runAsNonRoot can check it.
USER 1000:1000
WORKDIR /opt/vit_jax
ENTRYPOINT ["vit-jax"]
