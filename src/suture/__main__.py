"""`python -m suture` runs the command line."""

from .cli import main

main()
