"""`python -m fedbench` runs the CLI."""

from fedbench.cli import main

main()
