"""resolve_settings(): endpoint, region, credentials and addressing of an S3-compatible store
(s3/settings.py), found the way the AWS CLI (v2) and botocore find them, without boto3:
flags, then the environment, then the shared files (~/.aws/credentials and ~/.aws/config).
Pure: no sockets, no subprocesses; it reads the two shared files and nothing else.

Where each rule comes from (paraphrased; the code says the same):

- Profile name: --profile, else AWS_PROFILE, else AWS_DEFAULT_PROFILE (the AWS CLI v2's
  order: awscli/botocore/configprovider.py, 'profile'), else "default". A profile named by
  --profile or the environment must exist in one of the two files (botocore
  Session.get_scoped_config raises ProfileNotFound); an absent "default" is just empty.
- Files: AWS_SHARED_CREDENTIALS_FILE (else ~/.aws/credentials) holds "[NAME]" sections;
  AWS_CONFIG_FILE (else ~/.aws/config) holds "[profile NAME]", "[default]" and
  "[services NAME]" sections (botocore configloader.build_profile_map). A profile's settings
  are its config section overlaid by its credentials-file section (botocore
  Session.full_config merges the credentials file over the config file).
- Credentials, in botocore's chain order (credentials.create_credential_resolver):
  environment keys (skipped when --profile is given: "an explicitly provided profile will
  negate an EnvProvider"; AWS_PROFILE does not), then a role to assume (role_arn), web
  identity (web_identity_token_file, or AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN), SSO
  (sso_session / sso_start_url), the credentials file's keys, `aws login` (login_session),
  credential_process, then the config file's keys. Container and instance-metadata
  credentials come last in botocore; bulkfetch reads neither. Whatever needs AWS's own
  tooling to run (role, web identity, SSO, login, process) is refused with a UsageError that
  says how to export plain keys instead (`aws configure export-credentials --format env`).
- Region: --region, AWS_REGION, AWS_DEFAULT_REGION (the CLI v2 reads both, AWS_REGION first:
  awscli/botocore/configprovider.py 'region'; AWS SDKs reference guide, "AWS Region"), the
  profile's region, else us-east-1.
- Endpoint: --endpoint-url always wins; unless AWS_IGNORE_CONFIGURED_ENDPOINT_URLS (else the
  profile's ignore_configured_endpoint_urls) is "true", then AWS_ENDPOINT_URL_S3,
  AWS_ENDPOINT_URL, the s3 endpoint_url of the profile's `services` section, the profile's
  endpoint_url (botocore ConfiguredEndpointProvider._ENDPOINT_URL_LOOKUP_ORDER and
  args._compute_configured_endpoint_url; AWS SDKs reference guide, "Service-specific
  endpoints", and the CLI guide "Using endpoints in the AWS CLI"); else AWS's own
  https://s3.REGION.amazonaws.com (.amazonaws.com.cn for the cn- regions). The reference
  guide lets the URL carry a path ("one or more path segments"): it is kept, and buckets go
  under it.
- Addressing: "path", "virtual", or "auto" (the default), which the profile's nested
  `s3 = / addressing_style = ...` setting may replace. Auto is decided per bucket, by
  addressing_for(): virtual-hosted on an AWS endpoint (https, host under amazonaws.com[.cn],
  no path) for a bucket name that is one DNS label (no dots: a dotted name breaks the
  *.s3 wildcard certificate), path style otherwise and on every other endpoint (botocore
  forces path style for any endpoint_url unless addressing_style is "virtual": args.py,
  compute_endpoint_resolver_builtin_defaults; unlike botocore, an AWS host given as
  --endpoint-url still counts as AWS here). resolve_settings(bucket=...) decides it at once.

A secret never appears in a repr, a str, describe() or an exception message: S3Credentials
hides the secret key and the session token from its repr, messages name where a value came
from instead of the value, and configuration-file syntax errors are reported by line
number only (configparser's own messages quote the offending line, which may hold a key).
"""

from __future__ import annotations

import configparser
import ipaddress
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from bulkfetch.errors import UsageError
from bulkfetch.s3.settings import (
    _REGION,
    ADDRESSING_STYLES,
    DEFAULT_REGION,
    S3Credentials,
    S3Settings,
    _check_bucket,
    _endpoint,
    _shown,
    aws_endpoint,
)

__all__ = ["resolve_settings"]

def _expand(path: str, env: Mapping[str, str], home: Path) -> Path:
    """~ and $VAR / ${VAR} expanded as botocore does (expandvars, then expanduser), from
    the given environment and home."""
    def variable(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return env.get(name, match.group(0))

    path = re.sub(r"\$(?:\{([^}]*)\}|([A-Za-z_][A-Za-z0-9_]*))", variable, path)
    if path == "~" or path.startswith("~/"):
        return home / path[2:]
    return Path(path)


def _read(path: Path) -> configparser.RawConfigParser:
    """The INI file at `path` (an absent one is empty, as botocore treats it). Syntax errors
    are told by line number only: configparser quotes the line, which may hold a key."""
    parser = configparser.RawConfigParser()  # what botocore uses: no interpolation
    try:
        with open(path, encoding="utf-8") as handle:
            parser.read_file(handle)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        pass
    except UnicodeDecodeError:
        raise UsageError(f"cannot read {path}: not UTF-8 text") from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or type(exc).__name__}") from None
    except configparser.MissingSectionHeaderError as exc:
        raise UsageError(f"cannot read {path}: line {exc.lineno} comes before the first "
                         "[section]") from None
    except configparser.ParsingError as exc:
        lines = ", ".join(str(number) for number, _ in exc.errors)
        raise UsageError(f"cannot read {path}: line {lines} is not 'name = value'") from None
    except configparser.DuplicateSectionError as exc:
        raise UsageError(f"cannot read {path}: section [{exc.section}] appears twice (line "
                         f"{exc.lineno})") from None
    except configparser.DuplicateOptionError as exc:
        raise UsageError(f"cannot read {path}: {exc.option!r} appears twice in "
                         f"[{exc.section}] (line {exc.lineno})") from None
    except configparser.Error as exc:
        raise UsageError(f"cannot read {path}: {type(exc).__name__}") from None
    return parser


def _named_sections(parser: configparser.RawConfigParser, kind: str) -> dict[str, dict]:
    """"[kind NAME]" sections by NAME (botocore's _parse_section: shell-like words, exactly
    two), with "[default]" as the profile "default"."""
    found: dict[str, dict[str, str]] = {}
    for section in parser.sections():
        if kind == "profile" and section == "default":
            found.setdefault("default", {}).update(parser.items(section))
        elif section.startswith(kind):
            try:
                words = shlex.split(section)
            except ValueError:
                continue
            if len(words) == 2 and words[0] == kind:
                found.setdefault(words[1], {}).update(parser.items(section))
    return found


def _nested(value: str, where: str) -> dict[str, str]:
    """A nested setting ("s3 =\\n  addressing_style = path") as a dict; a plain value is
    not nested (botocore: a value that starts with a newline)."""
    if not value.startswith("\n"):
        return {}
    found = {}
    for line in value.splitlines():
        if not line.strip():
            continue
        name, equals, rest = line.partition("=")
        if not equals:
            raise UsageError(f"{where}: a nested line is not 'name = value'")
        found[name.strip()] = rest.strip()
    return found


@dataclass(frozen=True, slots=True)
class _Profile:
    name: str
    where: str  # "--profile", "AWS_PROFILE", "AWS_DEFAULT_PROFILE" or "" (the default)
    config: dict[str, str]  # its [profile NAME] / [default] section of the config file
    credentials: dict[str, str]  # its [NAME] section of the credentials file
    services: dict[str, dict[str, str]]  # the config file's [services NAME] sections
    config_file: Path
    credentials_file: Path

    @property
    def settings(self) -> dict[str, str]:
        return self.config | self.credentials  # botocore: the credentials file wins

    def label(self) -> str:
        return f"profile {self.name!r}"

    def origin(self, setting: str) -> str:
        """Where the profile's `setting` is written, for messages."""
        path = self.credentials_file if setting in self.credentials else self.config_file
        return f"{self.label()} in {path}: {setting}"


def _load_profile(profile: str | None, env: Mapping[str, str], home: Path) -> _Profile:
    if profile is not None:
        if not profile.strip():
            raise UsageError("--profile: give a profile name")
        name, where = profile, "--profile"
    elif env.get("AWS_PROFILE"):
        name, where = env["AWS_PROFILE"], "AWS_PROFILE"
    elif env.get("AWS_DEFAULT_PROFILE"):
        name, where = env["AWS_DEFAULT_PROFILE"], "AWS_DEFAULT_PROFILE"
    else:
        name, where = "default", ""
    credentials_file = _expand(env.get("AWS_SHARED_CREDENTIALS_FILE")
                               or "~/.aws/credentials", env, home)
    config_file = _expand(env.get("AWS_CONFIG_FILE") or "~/.aws/config", env, home)
    config = _read(config_file)
    credentials = _read(credentials_file)
    profiles = _named_sections(config, "profile")
    in_credentials = credentials.has_section(name)
    if where and name not in profiles and not in_credentials:
        raise UsageError(f"{where} names profile {name!r}, which is in neither "
                         f"{credentials_file} nor {config_file}")
    return _Profile(name, where, profiles.get(name, {}),
                    dict(credentials.items(name)) if in_credentials else {},
                    _named_sections(config, "services"), config_file, credentials_file)


# -- resolution -------------------------------------------------------------------------
def resolve_settings(*, endpoint_url: str | None = None, region: str | None = None,
                     profile: str | None = None, no_sign_request: bool = False,
                     addressing: str = "auto", environ: Mapping[str, str] | None = None,
                     home: Path | None = None, bucket: str | None = None) -> S3Settings:
    """The settings the flags, the environment and the shared files give (precedence in
    the module docstring). `environ` and `home` default to the process's; tests pass
    both. With `bucket`, "auto" addressing is decided at once (the result's addressing is
    "path" or "virtual"); without it, per bucket by bucket_url()/object_url().
    With `no_sign_request` no credentials are looked for (none is required, a profile's
    credential_process is not an error); the profile still gives region, endpoint and
    addressing, as for the AWS CLI's --no-sign-request."""
    env: Mapping[str, str] = os.environ if environ is None else environ
    if home is None:
        home = Path(env.get("HOME") or os.path.expanduser("~"))
    if addressing not in ADDRESSING_STYLES:
        raise UsageError(f"--addressing-style {addressing!r}: give auto, path or virtual")
    found = _load_profile(profile, env, home)
    settings = found.settings

    # Region
    candidates = ((region, "--region"), (env.get("AWS_REGION"), "AWS_REGION"),
                  (env.get("AWS_DEFAULT_REGION"), "AWS_DEFAULT_REGION"),
                  (settings.get("region"), found.origin("region")), (DEFAULT_REGION, "default"))
    chosen_region, region_source = next((value, source) for value, source in candidates
                                        if value)
    if _REGION.fullmatch(chosen_region) is None:
        raise UsageError(f"{region_source}: {chosen_region!r} is not a region name "
                         "(letters, digits, '-', '_' and '.', at most 64)")

    # Endpoint
    endpoint, endpoint_source = endpoint_url, "--endpoint-url"
    if endpoint is None and not _ignore_configured(env, settings):
        endpoint, endpoint_source = _configured_endpoint(env, found)
    if endpoint is None:
        endpoint = aws_endpoint(chosen_region)
        endpoint_source = f"AWS's endpoint for {chosen_region}"
    endpoint = _endpoint(endpoint, endpoint_source)

    # Addressing
    style = addressing
    if style == "auto":
        nested = _nested(settings.get("s3", ""), found.origin("s3"))
        configured = nested.get("addressing_style", "auto")
        if configured not in ADDRESSING_STYLES:
            raise UsageError(f"{found.origin('s3')} addressing_style {configured!r}: give "
                             "auto, path or virtual")
        style = configured
    if style == "virtual":
        host = urlsplit(endpoint).hostname or ""
        try:
            ipaddress.ip_address(host)
        except ValueError:
            pass
        else:
            raise UsageError(f"virtual-hosted addressing needs a host name to put the bucket "
                             f"in, and {endpoint_source} {_shown(endpoint)} is an IP address:"
                             " use --addressing-style path")

    credentials = None if no_sign_request else _credentials(env, found)
    result = S3Settings(endpoint, chosen_region, credentials, style, endpoint_source,
                        region_source)
    if bucket is not None and style == "auto":
        result = S3Settings(endpoint, chosen_region, credentials,
                            result.addressing_for(bucket), endpoint_source, region_source)
    if bucket is not None:
        _check_bucket(bucket, "bucket")
    return result


def _ignore_configured(env: Mapping[str, str], settings: Mapping[str, str]) -> bool:
    """AWS_IGNORE_CONFIGURED_ENDPOINT_URLS if set (whatever its value), else the profile's
    ignore_configured_endpoint_urls; "true" in any case means true (botocore
    utils.ensure_boolean), anything else false."""
    if "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS" in env:
        return env["AWS_IGNORE_CONFIGURED_ENDPOINT_URLS"].lower() == "true"
    return settings.get("ignore_configured_endpoint_urls", "").lower() == "true"


def _configured_endpoint(env: Mapping[str, str], found: _Profile) -> tuple[str | None, str]:
    for variable in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        if env.get(variable):
            return env[variable], variable
    settings = found.settings
    if settings.get("services"):
        section = settings["services"]
        if section not in found.services:
            raise UsageError(f"{found.origin('services')} names {section!r}, but "
                             f"{found.config_file} has no [services {section}] section")
        where = f"[services {section}] in {found.config_file}: s3"
        nested = _nested(found.services[section].get("s3", ""), where)
        if nested.get("endpoint_url"):
            return nested["endpoint_url"], f"{where} endpoint_url"
    if settings.get("endpoint_url"):
        return settings["endpoint_url"], found.origin("endpoint_url")
    return None, ""


_EXPORT_HINT = ("export plain keys first, e.g. eval \"$(aws configure export-credentials "
                "{profile}--format env)\", then run bulkfetch without --profile (the "
                "environment's keys are used then), or use --no-sign-request for a public "
                "bucket")


def _unsupported(what: str, whose: str, profile_flag: str) -> UsageError:
    return UsageError(f"{whose} gets its credentials through {what}, which bulkfetch cannot "
                      "use (it reads only static keys): "
                      + _EXPORT_HINT.format(profile=profile_flag))


def _keys(section: Mapping[str, str], source: str) -> S3Credentials | None:
    key = section.get("aws_access_key_id", "")
    secret = section.get("aws_secret_access_key", "")
    if not key and not secret:
        return None
    if not key or not secret:
        present, missing = (("aws_access_key_id", "aws_secret_access_key") if key
                            else ("aws_secret_access_key", "aws_access_key_id"))
        raise UsageError(f"{source} has {present} but no {missing}: give both")
    # botocore reads aws_security_token too (the older name), after aws_session_token
    token = section.get("aws_session_token") or section.get("aws_security_token") or None
    return S3Credentials(key, secret, token, source)


def _credentials(env: Mapping[str, str], found: _Profile) -> S3Credentials:
    explicit = found.where == "--profile"
    # 1. The environment, unless --profile names a profile (botocore removes the
    #    environment provider then; AWS_PROFILE does not).
    if not explicit:
        key, secret = env.get("AWS_ACCESS_KEY_ID", ""), env.get("AWS_SECRET_ACCESS_KEY", "")
        if key or secret:
            if not key or not secret:
                missing = "AWS_SECRET_ACCESS_KEY" if key else "AWS_ACCESS_KEY_ID"
                present = "AWS_ACCESS_KEY_ID" if key else "AWS_SECRET_ACCESS_KEY"
                raise UsageError(f"{present} is set but {missing} is not: set both (and "
                                 "AWS_SESSION_TOKEN for temporary credentials), or neither")
            token = env.get("AWS_SESSION_TOKEN") or env.get("AWS_SECURITY_TOKEN") or None
            return S3Credentials(key, secret, token, "environment (AWS_ACCESS_KEY_ID)")

    settings = found.settings
    whose = found.label() + (f" (from {found.where})" if found.where else "")
    flag = f"--profile {shlex.quote(found.name)} " if found.name != "default" else ""
    # 2.-4. What AWS's tools run for a profile before its static keys.
    if settings.get("role_arn"):
        how = ("web identity (role_arn + web_identity_token_file)"
               if settings.get("web_identity_token_file") else
               "an assumed role (role_arn + " + ("source_profile)" if settings.get(
                   "source_profile") else "credential_source)"))
        raise _unsupported(how, whose, flag)
    if settings.get("web_identity_token_file"):
        raise _unsupported("web identity (web_identity_token_file)", whose, flag)
    if not explicit and env.get("AWS_WEB_IDENTITY_TOKEN_FILE") and env.get("AWS_ROLE_ARN"):
        raise _unsupported("web identity (AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN)",
                           "the environment", "")
    if settings.get("sso_session") or settings.get("sso_start_url"):
        raise _unsupported("IAM Identity Center (SSO: sso_session / sso_start_url)", whose,
                           flag)
    # 5. The credentials file's keys.
    keys = _keys(found.credentials, f"{found.label()} in {found.credentials_file}")
    if keys is not None:
        return keys
    # 6.-7. `aws login` and credential_process, which come before the config file's keys.
    if settings.get("login_session"):
        raise _unsupported("`aws login` (login_session)", whose, flag)
    if settings.get("credential_process"):
        raise _unsupported("credential_process", whose, flag)
    # 8. The config file's keys.
    keys = _keys(found.config, f"{found.label()} in {found.config_file}")
    if keys is not None:
        return keys
    if found.where:
        raise UsageError(f"{whose} has no aws_access_key_id/aws_secret_access_key in "
                         f"{found.credentials_file} or {found.config_file}")
    container = ("; container credentials (AWS_CONTAINER_CREDENTIALS_*) are not read: "
                 + _EXPORT_HINT.format(profile="")
                 if env.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
                 or env.get("AWS_CONTAINER_CREDENTIALS_FULL_URI") else "")
    raise UsageError("no AWS credentials found: set AWS_ACCESS_KEY_ID and "
                     "AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary ones), or "
                     f"give --profile NAME ({found.credentials_file}, {found.config_file}), "
                     "or --no-sign-request for a public bucket" + container)
