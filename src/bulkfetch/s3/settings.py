"""Endpoint, region, credentials and addressing of an S3-compatible store, found the way the
AWS CLI and SDKs find them, without boto3: flags, then the environment, then the shared
files (~/.aws/credentials and ~/.aws/config). Requests are signed by libcurl (SigV4); this
module only says with what. A secret never appears in a repr, a message or describe().
"""

from __future__ import annotations

import configparser
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlsplit

from bulkfetch.errors import UsageError

DEFAULT_REGION = "us-east-1"
# What a profile may hold that we cannot turn into keys ourselves.
_UNSUPPORTED = ("credential_process", "sso_session", "sso_start_url", "role_arn",
                "web_identity_token_file")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.\-_]{1,253}[a-z0-9]")  # path style allows '_'
_DNS_BUCKET = re.compile(r"[a-z0-9][a-z0-9\-]{1,61}[a-z0-9]")


@dataclass(frozen=True, slots=True)
class S3Credentials:
    access_key: str
    secret_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)
    source: str = ""  # where they came from, for messages


@dataclass(frozen=True, slots=True)
class S3Settings:
    endpoint: str  # scheme://host[:port], no trailing slash
    region: str
    credentials: S3Credentials | None  # None: unsigned requests (--no-sign-request)
    addressing: str  # "path" | "virtual" | "auto" (decided per bucket)

    def _virtual(self, bucket: str) -> bool:
        if self.addressing != "auto":
            return self.addressing == "virtual"
        host = urlsplit(self.endpoint).hostname or ""
        return (host.endswith(".amazonaws.com") and self.endpoint.startswith("https://")
                and _DNS_BUCKET.fullmatch(bucket) is not None)

    def bucket_url(self, bucket: str) -> str:
        if self._virtual(bucket):
            parts = urlsplit(self.endpoint)
            return f"{parts.scheme}://{bucket}.{parts.netloc}/"
        return f"{self.endpoint}/{quote(bucket, safe='')}"

    def object_url(self, bucket: str, key: str) -> str:
        """Every byte of the key but RFC 3986's unreserved and '/' percent-encoded, once
        (libcurl's SigV4 signs the path as sent, as S3 expects)."""
        encoded = quote(key.encode("utf-8", "surrogateescape"), safe="/-_.~")
        base = self.bucket_url(bucket)
        return (base if base.endswith("/") else base + "/") + encoded

    def sigv4(self) -> str | None:
        return None if self.credentials is None else f"aws:amz:{self.region}:s3"

    def userpwd(self) -> str | None:
        # libcurl splits USERPWD at the first ':'; an access key holds none
        if self.credentials is None:
            return None
        return f"{self.credentials.access_key}:{self.credentials.secret_key}"

    def headers(self) -> list[str]:
        if self.credentials is None:
            return []
        found = ["x-amz-content-sha256: UNSIGNED-PAYLOAD"]
        if self.credentials.session_token:
            found.append(f"x-amz-security-token: {self.credentials.session_token}")
        return found

    def describe(self) -> str:
        signed = ("unsigned" if self.credentials is None
                  else f"signed, credentials from {self.credentials.source}")
        return f"{self.endpoint}, {self.region}, {signed}"


def parse_s3_url(url: str) -> tuple[str, str]:
    """("bucket", "some/prefix") of "s3://bucket/some/prefix"."""
    if not url.startswith("s3://"):
        raise UsageError(f"{url!r} is not an s3://BUCKET[/PREFIX] URL")
    bucket, _, prefix = url[len("s3://"):].partition("/")
    if not bucket:
        raise UsageError(f"{url!r}: no bucket; give s3://BUCKET[/PREFIX]")
    if _BUCKET.fullmatch(bucket) is None or ".." in bucket:
        raise UsageError(f"{url!r}: {bucket!r} is not a valid bucket name (3-255 lower-case "
                         "letters, digits, '.', '-' and '_')")
    return bucket, prefix


def _files(environ: Mapping[str, str], home: Path) -> tuple[Path, Path]:
    credentials = environ.get("AWS_SHARED_CREDENTIALS_FILE") or str(home / ".aws/credentials")
    config = environ.get("AWS_CONFIG_FILE") or str(home / ".aws/config")
    return Path(credentials).expanduser(), Path(config).expanduser()


def _read(path: Path) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser()
    try:
        with open(path, encoding="utf-8") as handle:
            parser.read_file(handle)
    except FileNotFoundError:
        pass
    except (OSError, configparser.Error, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None
    return parser


def _section(parser: configparser.RawConfigParser, name: str, config: bool) -> dict[str, str]:
    """A profile's settings: "[name]" in the credentials file, "[profile name]" (or
    "[default]") in the config file."""
    wanted = name if not config or name == "default" else f"profile {name}"
    if parser.has_section(wanted):
        return dict(parser.items(wanted))
    return {}


def _nested(value: str) -> dict[str, str]:
    """A nested setting ("s3 =\\n  addressing_style = path") as a dict."""
    found = {}
    for line in value.splitlines():
        key, equals, rest = line.partition("=")
        if equals:
            found[key.strip()] = rest.strip()
    return found


def resolve_settings(*, endpoint_url: str | None = None, region: str | None = None,
                     profile: str | None = None, no_sign_request: bool = False,
                     addressing: str = "auto", environ: Mapping[str, str] | None = None,
                     home: Path | None = None) -> S3Settings:
    env = os.environ if environ is None else environ
    home = Path.home() if home is None else home
    name = profile or env.get("AWS_PROFILE") or env.get("AWS_DEFAULT_PROFILE") or "default"
    credentials_file, config_file = _files(env, home)
    creds_section = _section(_read(credentials_file), name, config=False)
    config_section = _section(_read(config_file), name, config=True)
    if profile is not None and not creds_section and not config_section:
        raise UsageError(f"--profile {profile!r}: no such profile in {credentials_file} or "
                         f"{config_file}")
    settings = config_section | creds_section

    chosen_region = (region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
                     or settings.get("region") or DEFAULT_REGION)
    s3_nested = _nested(settings.get("s3", ""))
    where = "--endpoint-url"
    endpoint = endpoint_url
    ignore_config = env.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "").lower() == "true"
    if endpoint is None and not ignore_config:
        for variable in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
            if env.get(variable):
                endpoint, where = env[variable], variable
                break
        if endpoint is None and s3_nested.get("endpoint_url"):
            endpoint, where = s3_nested["endpoint_url"], f"profile {name!r}'s s3 endpoint_url"
        if endpoint is None and settings.get("endpoint_url"):
            endpoint, where = settings["endpoint_url"], f"profile {name!r}'s endpoint_url"
    if endpoint is None:
        endpoint = f"https://s3.{chosen_region}.amazonaws.com"
    parts = urlsplit(endpoint)
    try:
        parts.port  # noqa: B018  # raises ValueError for a port that is not a number
    except ValueError:
        raise UsageError(f"{where} {endpoint!r}: the port is not a number") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query \
            or parts.path.strip("/"):
        raise UsageError(f"{where} {endpoint!r}: give http:// or https:// with a host (and "
                         "port), without a path")

    style = addressing
    if style == "auto" and s3_nested.get("addressing_style") in ("path", "virtual"):
        style = s3_nested["addressing_style"]

    credentials = None
    if not no_sign_request:
        credentials = _credentials(env, name, profile, creds_section, config_section,
                                   credentials_file, config_file)
    return S3Settings(f"{parts.scheme}://{parts.netloc}", chosen_region, credentials, style)


def _credentials(env: Mapping[str, str], name: str, profile: str | None,
                 creds_section: dict[str, str], config_section: dict[str, str],
                 credentials_file: Path, config_file: Path) -> S3Credentials:
    key, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
    if profile is None and (key or secret):
        if not key or not secret:
            missing = "AWS_SECRET_ACCESS_KEY" if key else "AWS_ACCESS_KEY_ID"
            raise UsageError(f"{missing} is not set while its pair is: set both, or neither")
        return S3Credentials(key, secret, env.get("AWS_SESSION_TOKEN") or None, "environment")
    for section, path in ((creds_section, credentials_file), (config_section, config_file)):
        if section.get("aws_access_key_id") and section.get("aws_secret_access_key"):
            return S3Credentials(section["aws_access_key_id"],
                                 section["aws_secret_access_key"],
                                 section.get("aws_session_token") or None,
                                 f"profile {name!r} in {path}")
    needs = [option for option in _UNSUPPORTED
             if option in creds_section or option in config_section]
    if needs:
        raise UsageError(f"profile {name!r} gets its credentials through {needs[0]}, which "
                         "bulkfetch does not run: export keys for it first, e.g. eval "
                         f"\"$(aws configure export-credentials --profile {name} "
                         "--format env)\"")
    raise UsageError("no AWS credentials found: set AWS_ACCESS_KEY_ID and "
                     "AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary ones), or "
                     f"give --profile NAME from {credentials_file}, or --no-sign-request for "
                     "a public bucket")
