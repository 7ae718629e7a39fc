"""Few-shot linear evaluation: closed-form solver, features, sweeps."""
