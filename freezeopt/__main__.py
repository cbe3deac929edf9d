"""`python -m freezeopt` runs the command-line interface."""

from freezeopt.entry import main

main()
