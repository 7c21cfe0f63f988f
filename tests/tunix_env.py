"""Tunix's own virtual environment, for the tests that compare suture with Tunix.

google-tunix 0.1.7 requires ``safetensors<0.8``, so installing it beside the project would
take safetensors, transformers and tokenizers back to older versions. It gets an environment
of its own instead, with the project's JAX, Flax and Orbax pinned and suture installed from
this checkout (editable, no dependencies): ``python tests/tunix_env.py`` makes it (a few
minutes, from PyPI); the tests that need it skip, saying this, while it is absent.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("SUTURE_TUNIX_VENV", ROOT / ".venv-tunix"))
PYTHON = VENV / "bin" / "python"
WORKER = Path(__file__).with_name("tunix_worker.py")
# Tunix, the JAX stack suture is tested with, and suture's own dependencies.
RUNTIME = [
    "google-tunix==0.1.7",
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "orbax-checkpoint==0.12.8",
    "tensorstore",
    "ml_dtypes",
    "numpy",
    "typer",
    "rich",
    "msgpack",
    "pyyaml",
    "regex",
]
MISSING = (
    f"Tunix's environment {VENV} is absent (google-tunix pins safetensors<0.8, so it does not "
    f"share the project's): make it with `python tests/tunix_env.py`."
)


def ensure_venv() -> Path:
    """The Python of Tunix's environment, made when missing."""
    if PYTHON.exists():
        return PYTHON
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pip = [str(PYTHON), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, *RUNTIME], check=True)
    subprocess.run([*pip, "--no-deps", "-e", str(ROOT)], check=True)
    return PYTHON


def run_worker(*args: str, devices: int = 1, timeout: float = 300) -> subprocess.CompletedProcess:
    """`tests/tunix_worker.py` with `args` in Tunix's environment, on `devices` CPU devices."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "JAX_PLATFORMS": "cpu",
        "PYTHONWARNINGS": "ignore",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
    }
    done = subprocess.run(
        [str(PYTHON), str(WORKER), *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    if done.returncode:
        raise AssertionError(f"Tunix worker {args[0]} failed:\n{done.stderr[-4000:]}")
    return done


if __name__ == "__main__":
    print(ensure_venv())
