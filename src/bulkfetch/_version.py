"""The release, in a module of its own: the User-Agent (net/curl.py) and reports read it without
importing the package's public face."""

__version__ = "0.1.0"
