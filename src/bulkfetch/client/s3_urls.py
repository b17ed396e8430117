"""s3://BUCKET/KEY URLs for a Client: the object's URL at the endpoint, and its signature.

The settings (endpoint, region, credentials, addressing) are found as the AWS tools find
them (s3/profiles.py), once, at the first s3:// URL a Client is given. With credentials,
every request of the Client is given its headers by sign(): an object of a bucket seen so
far is signed (s3/signer.py) and any other URL gets headers that unset every signing header,
so an S3 signature or session token never rides along to another host's URL on a reused
handle. For the same reason a Client that signs follows no redirect (S3 redirects only to
say the bucket is elsewhere: a failure to report, not to follow).
"""

from __future__ import annotations

from typing import Any

import pycurl

from bulkfetch.config import S3Options
from bulkfetch.errors import UsageError
from bulkfetch.s3.profiles import resolve_settings
from bulkfetch.s3.settings import parse_s3_url
from bulkfetch.s3.signer import ObjectSigner

# A header named with nothing after the colon: libcurl sends no such header at all.
UNSIGNED = ["Authorization:", "Host:", "x-amz-date:", "x-amz-content-sha256:",
            "x-amz-security-token:", "x-amz-checksum-mode:"]


class S3Urls:
    def __init__(self, options: S3Options) -> None:
        """Raises UsageError when the settings cannot be found (a broken profile ...)."""
        self.settings = resolve_settings(
            endpoint_url=options.endpoint_url, region=options.region, profile=options.profile,
            no_sign_request=options.no_sign_request, addressing=options.addressing)
        # object URL prefix of each bucket seen -> its signer (virtual-hosted buckets each
        # have their own host). Written and read on the Client's loop thread only.
        self.signers: dict[str, ObjectSigner] = {}
        self.buckets: set[str] = set()  # the buckets whose signer is made

    @property
    def signs(self) -> bool:
        return self.settings.credentials is not None

    def object_url(self, url: str) -> str:
        """The URL to GET for s3://BUCKET/KEY; raises ValueError naming what is wrong."""
        try:
            bucket, key = parse_s3_url(url)
        except UsageError as exc:  # for one URL of many: that URL's failure
            raise ValueError(str(exc)) from None
        if not key or key.endswith("/"):
            raise ValueError(f"{url!r} names no object (s3://BUCKET/KEY)")
        if self.signs and bucket not in self.buckets:  # once a bucket, not once a URL
            base = self.settings.object_url(bucket, "x")[:-1]
            self.signers[base] = ObjectSigner(
                self.settings.credentials, self.settings.region, base)  # type: ignore[arg-type]
            self.buckets.add(bucket)
        return self.settings.object_url(bucket, key)

    def sign(self, url: str) -> list[str]:
        """The headers of a request for `url`: signed for an object of a bucket seen, else
        every signing header unset."""
        for base, signer in self.signers.items():
            if url.startswith(base):
                return signer.headers(url)
        return UNSIGNED

    def curl_options(self) -> list[tuple[int, Any]]:
        """What every handle of a signing Client needs: no redirects (see the docstring)."""
        return [(pycurl.FOLLOWLOCATION, 0)] if self.signs else []


__all__ = ["UNSIGNED", "S3Urls"]
