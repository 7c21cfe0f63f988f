"""The `suture` command line: a typer app (`app.py`), its commands and the views they print."""

from .app import app as app
from .app import main as main

__all__ = ["app", "main"]
