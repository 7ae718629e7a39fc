"""`python -m vit_jax NAME [flags]`: `vit-jax NAME` without the script."""

from vit_jax import cli

cli.dispatch()
