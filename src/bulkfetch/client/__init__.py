"""`bulkfetch.Client`: many URLs' bodies handed to a Python program from one libcurl loop
(core.py), with a memory cache (memcache.py), an HTTP cache on disk (httpcache.py, its
freshness rules in freshness.py, settled on the caller's thread by disk_layer.py) and
s3:// URLs signed as the AWS tools would (s3_urls.py)."""

from bulkfetch.client.core import Client, FetchError

__all__ = ["Client", "FetchError"]
