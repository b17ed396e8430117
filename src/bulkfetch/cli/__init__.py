"""The command line: `bulkfetch` and its verbs (main.py, one module per verb), the live
display and the end-of-run summary. The entry point is `bulkfetch.cli:main`."""

from bulkfetch.cli.main import main

__all__ = ["main"]
