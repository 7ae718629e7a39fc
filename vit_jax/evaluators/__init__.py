"""Evaluators: small plug-ins with `run(params) -> dict of metrics`."""
