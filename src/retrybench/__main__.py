"""`python -m retrybench`: the same command line as the `retrybench` script."""

from retrybench.cli.main import main

main()
