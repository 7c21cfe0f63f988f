"""Writing results to disk: one module per format (orbax.py, safetensors.py)."""
