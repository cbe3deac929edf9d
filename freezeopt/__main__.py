"""`python -m freezeopt` runs the command-line interface."""

from freezeopt.cli import main

main()
