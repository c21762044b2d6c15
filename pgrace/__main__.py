"""``python -m pgrace`` runs the command line, through the same entry as the ``pgrace`` command."""

from pgrace.cli.entry import main

main()
