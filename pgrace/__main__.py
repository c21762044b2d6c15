"""``python -m pgrace`` runs the command line."""

from pgrace.cli import main

main()
