"""Few-shot linear evaluation: closed-form solver, feature extraction, sweeps."""
