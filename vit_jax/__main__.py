"""`python -m vit_jax NAME [flags]`: the `vit-jax` command without its script."""

from vit_jax import cli

cli.dispatch()
