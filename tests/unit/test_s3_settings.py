"""s3/settings.py: credentials, region, endpoint and addressing found as the AWS tools find
them, URLs of buckets and keys, and no secret in any text. Every test passes its own
environment and a temporary HOME: the real environment and ~/.aws are never read."""

from __future__ import annotations

import pickle
from pathlib import Path
from urllib.parse import unquote_to_bytes, urlsplit

import pytest

from bulkfetch.errors import UsageError
from bulkfetch.s3 import profiles as settings_module
from bulkfetch.s3.profiles import resolve_settings
from bulkfetch.s3.settings import (
    S3Credentials,
    S3Settings,
    UnsendableKey,
    aws_endpoint,
    parse_s3_url,
)

SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCY=SECRET"  # distinctive: grep'able in any text
TOKEN = "FwoGZXIvYXdzEXAMPLETOKEN//0123456789="
BARE = "wJalrXUtnFEMIbareSECRETwithoutEquals"  # a secret alone on a line: no '=' to split at
KEYS = {"AWS_ACCESS_KEY_ID": "AKIAENVIRONMENT", "AWS_SECRET_ACCESS_KEY": SECRET}


@pytest.fixture(autouse=True)
def _no_real_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A belt to the braces of passing environ= and home=: should a code path fall back to
    the process's environment or home, it finds nothing of the developer's."""
    monkeypatch.setenv("HOME", str(tmp_path / "not-home"))
    for name in list(__import__("os").environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)


def write(home: Path, name: str, text: str) -> Path:
    path = home / ".aws" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def resolve(home: Path, env: dict[str, str] | None = None, **kwargs) -> S3Settings:
    return resolve_settings(environ=env or {}, home=home, **kwargs)


def usage_error(home: Path, env: dict[str, str] | None = None, **kwargs) -> str:
    with pytest.raises(UsageError) as caught:
        resolve(home, env, **kwargs)
    message = str(caught.value)
    assert SECRET not in message and TOKEN not in message and BARE not in message
    return message


# -- credentials ------------------------------------------------------------------------
def test_environment_keys(tmp_path: Path) -> None:
    found = resolve(tmp_path, KEYS)
    assert found.credentials == S3Credentials("AKIAENVIRONMENT", SECRET, None,
                                              "environment (AWS_ACCESS_KEY_ID)")
    assert found.userpwd() == f"AKIAENVIRONMENT:{SECRET}"
    assert found.sigv4() == "aws:amz:us-east-1:s3"
    assert found.headers() == ["x-amz-content-sha256: UNSIGNED-PAYLOAD"]


def test_environment_session_token_and_its_older_name(tmp_path: Path) -> None:
    found = resolve(tmp_path, {**KEYS, "AWS_SESSION_TOKEN": TOKEN})
    assert found.credentials is not None and found.credentials.session_token == TOKEN
    assert found.headers() == ["x-amz-content-sha256: UNSIGNED-PAYLOAD",
                               f"x-amz-security-token: {TOKEN}"]
    older = resolve(tmp_path, {**KEYS, "AWS_SECURITY_TOKEN": "older"})
    assert older.credentials is not None and older.credentials.session_token == "older"
    both = resolve(tmp_path, {**KEYS, "AWS_SESSION_TOKEN": TOKEN, "AWS_SECURITY_TOKEN": "x"})
    assert both.credentials is not None and both.credentials.session_token == TOKEN


@pytest.mark.parametrize(("given", "missing"), [
    ({"AWS_ACCESS_KEY_ID": "AKIAONLY"}, "AWS_SECRET_ACCESS_KEY is not"),
    ({"AWS_SECRET_ACCESS_KEY": SECRET}, "AWS_ACCESS_KEY_ID is not"),
    ({"AWS_ACCESS_KEY_ID": "AKIAONLY", "AWS_SECRET_ACCESS_KEY": ""}, "AWS_SECRET_ACCESS_KEY"),
])
def test_one_environment_key_alone_names_the_missing_one(tmp_path: Path, given, missing) -> None:
    write(tmp_path, "credentials", "[default]\naws_access_key_id = AKIAFILE\n"
                                   f"aws_secret_access_key = {SECRET}\n")
    assert missing in usage_error(tmp_path, given)


def test_explicit_profile_beats_environment_keys(tmp_path: Path) -> None:
    write(tmp_path, "credentials", "[dev]\naws_access_key_id = AKIADEV\n"
                                   "aws_secret_access_key = devsecret\n")
    found = resolve(tmp_path, {**KEYS, "AWS_SESSION_TOKEN": TOKEN}, profile="dev")
    assert found.credentials is not None
    assert found.credentials.access_key == "AKIADEV"
    assert found.credentials.session_token is None  # the environment's token is not mixed in
    assert found.credentials.source == f"profile 'dev' in {tmp_path / '.aws/credentials'}"
    # half-set environment keys do not matter once --profile names the profile
    alone = resolve(tmp_path, {"AWS_ACCESS_KEY_ID": "AKIAONLY"}, profile="dev")
    assert alone.credentials is not None and alone.credentials.access_key == "AKIADEV"


def test_environment_keys_beat_aws_profile(tmp_path: Path) -> None:
    write(tmp_path, "credentials", "[dev]\naws_access_key_id = AKIADEV\n"
                                   "aws_secret_access_key = devsecret\n")
    found = resolve(tmp_path, {**KEYS, "AWS_PROFILE": "dev"})
    assert found.credentials is not None and found.credentials.access_key == "AKIAENVIRONMENT"


def test_aws_profile_then_aws_default_profile_then_default(tmp_path: Path) -> None:
    write(tmp_path, "credentials", "".join(
        f"[{name}]\naws_access_key_id = AKIA{name.upper()}\naws_secret_access_key = s\n"
        for name in ("default", "one", "two")))
    def key(env: dict[str, str]) -> str:
        found = resolve(tmp_path, env)
        assert found.credentials is not None
        return found.credentials.access_key
    assert key({}) == "AKIADEFAULT"
    assert key({"AWS_DEFAULT_PROFILE": "two"}) == "AKIATWO"
    assert key({"AWS_PROFILE": "one", "AWS_DEFAULT_PROFILE": "two"}) == "AKIAONE"
    assert key({"AWS_PROFILE": "", "AWS_DEFAULT_PROFILE": "two"}) == "AKIATWO"


def test_credentials_file_beats_config_file(tmp_path: Path) -> None:
    write(tmp_path, "credentials", "[dev]\naws_access_key_id = AKIACREDS\n"
                                   "aws_secret_access_key = a\n")
    write(tmp_path, "config", "[profile dev]\naws_access_key_id = AKIACONFIG\n"
                              "aws_secret_access_key = b\nregion = eu-west-1\n")
    found = resolve(tmp_path, {"AWS_PROFILE": "dev"})
    assert found.credentials is not None
    assert (found.credentials.access_key, found.credentials.secret_key) == ("AKIACREDS", "a")
    assert found.region == "eu-west-1"


def test_config_file_keys_and_its_section_names(tmp_path: Path) -> None:
    write(tmp_path, "config", "[default]\naws_access_key_id = AKIADEFAULT\n"
                              "aws_secret_access_key = d\n"
                              "[profile dev]\naws_access_key_id = AKIADEV\n"
                              "aws_secret_access_key = e\naws_session_token = t\n"
                              "[profile \"with space\"]\naws_access_key_id = AKIASPACE\n"
                              "aws_secret_access_key = f\n"
                              "[plain]\naws_access_key_id = AKIAPLAIN\n"
                              "aws_secret_access_key = g\n")
    config = tmp_path / ".aws/config"
    default = resolve(tmp_path).credentials
    assert default == S3Credentials("AKIADEFAULT", "d", None, f"profile 'default' in {config}")
    dev = resolve(tmp_path, profile="dev").credentials
    assert dev == S3Credentials("AKIADEV", "e", "t", f"profile 'dev' in {config}")
    spaced = resolve(tmp_path, profile="with space").credentials
    assert spaced is not None and spaced.access_key == "AKIASPACE"
    # "[plain]" in the config file is not a profile (only "[profile plain]" would be)
    assert "'plain', which is in neither" in usage_error(tmp_path, profile="plain")


def test_profile_default_section_in_config(tmp_path: Path) -> None:
    write(tmp_path, "config", "[profile default]\nregion = ap-south-1\n")
    assert resolve(tmp_path, KEYS).region == "ap-south-1"


def test_file_locations_from_the_environment_and_tilde(tmp_path: Path) -> None:
    write(tmp_path, "credentials", "[default]\naws_access_key_id = AKIAWRONG\n"
                                   "aws_secret_access_key = w\n")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere/creds").write_text("[default]\naws_access_key_id = AKIARIGHT\n"
                                              "aws_secret_access_key = r\n")
    (tmp_path / "elsewhere/conf").write_text("[default]\nregion = sa-east-1\n")
    env = {"AWS_SHARED_CREDENTIALS_FILE": "~/elsewhere/creds",
           "AWS_CONFIG_FILE": "${BASE}/conf", "BASE": str(tmp_path / "elsewhere")}
    found = resolve(tmp_path, env)
    assert found.credentials is not None and found.credentials.access_key == "AKIARIGHT"
    assert found.region == "sa-east-1"
    assert str(tmp_path / "elsewhere/creds") in found.credentials.source


def test_missing_profiles(tmp_path: Path) -> None:
    write(tmp_path, "credentials", "[other]\naws_access_key_id = A\naws_secret_access_key = B\n")
    message = usage_error(tmp_path, profile="dev")
    assert message.startswith("--profile names profile 'dev', which is in neither")
    assert str(tmp_path / ".aws/credentials") in message
    assert str(tmp_path / ".aws/config") in message
    # a profile the environment names must exist too (botocore: ProfileNotFound), even with
    # keys in the environment, and even for --no-sign-request
    assert usage_error(tmp_path, {**KEYS, "AWS_PROFILE": "dev"}).startswith("AWS_PROFILE names")
    assert "AWS_PROFILE names" in usage_error(tmp_path, {"AWS_PROFILE": "dev"},
                                              no_sign_request=True)
    assert "--profile: give a profile name" in usage_error(tmp_path, profile="")


def test_no_credentials_at_all(tmp_path: Path) -> None:
    message = usage_error(tmp_path)
    assert message.startswith("no AWS credentials found: set AWS_ACCESS_KEY_ID and "
                              "AWS_SECRET_ACCESS_KEY")
    assert "--profile NAME" in message and "--no-sign-request" in message
    container = usage_error(tmp_path, {"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "/v2/x"})
    assert "container credentials" in container and "export-credentials" in container
    # a named profile without keys says so
    write(tmp_path, "config", "[profile dev]\nregion = eu-west-1\n")
    assert "profile 'dev' (from --profile) has no aws_access_key_id" in usage_error(
        tmp_path, profile="dev")


@pytest.mark.parametrize("file", ["credentials", "config"])
@pytest.mark.parametrize(("lines", "missing"), [
    ("aws_access_key_id = AKIAHALF\n", "but no aws_secret_access_key"),
    (f"aws_secret_access_key = {SECRET}\n", "but no aws_access_key_id"),
])
def test_half_a_key_pair_in_a_file(tmp_path: Path, file: str, lines: str, missing: str) -> None:
    header = "[dev]" if file == "credentials" else "[profile dev]"
    path = write(tmp_path, file, f"{header}\n{lines}")
    message = usage_error(tmp_path, profile="dev")
    assert missing in message and str(path) in message


@pytest.mark.parametrize(("section", "what"), [
    ("credential_process = /usr/bin/get-keys --secret " + SECRET, "credential_process"),
    ("sso_session = corp\nsso_account_id = 1\nsso_role_name = r", "SSO"),
    ("sso_start_url = https://corp.awsapps.com/start\nsso_region = us-east-1", "SSO"),
    ("role_arn = arn:aws:iam::1:role/r\nsource_profile = base", "assumed role"),
    ("role_arn = arn:aws:iam::1:role/r\ncredential_source = Ec2InstanceMetadata",
     "assumed role (role_arn + credential_source)"),
    ("role_arn = arn:aws:iam::1:role/r\nweb_identity_token_file = /t", "web identity"),
    ("web_identity_token_file = /t", "web identity"),
    ("login_session = arn:aws:iam::1:user/u", "aws login"),
])
def test_profiles_that_need_aws_tooling_are_refused(tmp_path: Path, section: str,
                                                    what: str) -> None:
    write(tmp_path, "config", f"[profile dev]\n{section}\n")
    message = usage_error(tmp_path, profile="dev")
    assert "profile 'dev' (from --profile) gets its credentials through" in message
    assert what in message
    assert "aws configure export-credentials --profile dev --format env" in message
    assert "without --profile" in message
    # --no-sign-request looks for no credentials: nothing to refuse
    assert resolve(tmp_path, profile="dev", no_sign_request=True).credentials is None


def test_the_chain_order_around_unsupported_sources(tmp_path: Path) -> None:
    # keys in the credentials file come before credential_process (botocore's order) ...
    write(tmp_path, "credentials", "[dev]\naws_access_key_id = AKIACREDS\n"
                                   "aws_secret_access_key = s\n")
    write(tmp_path, "config", "[profile dev]\ncredential_process = run-me\n"
                              "[profile role]\nrole_arn = arn:aws:iam::1:role/r\n"
                              "source_profile = dev\naws_access_key_id = AKIAROLE\n"
                              "aws_secret_access_key = s\n"
                              "[profile proc]\ncredential_process = run-me\n"
                              "aws_access_key_id = AKIACONFIG\naws_secret_access_key = s\n")
    dev = resolve(tmp_path, profile="dev").credentials
    assert dev is not None and dev.access_key == "AKIACREDS"
    # ... an assumed role comes before any static key of the same profile ...
    assert "assumed role" in usage_error(tmp_path, profile="role")
    # ... and credential_process before the config file's keys
    assert "credential_process" in usage_error(tmp_path, profile="proc")
    # environment keys come before all of it when no --profile is given
    found = resolve(tmp_path, {**KEYS, "AWS_PROFILE": "proc"})
    assert found.credentials is not None and found.credentials.access_key == "AKIAENVIRONMENT"


def test_web_identity_from_the_environment(tmp_path: Path) -> None:
    env = {"AWS_WEB_IDENTITY_TOKEN_FILE": "/var/run/token", "AWS_ROLE_ARN": "arn:aws:iam::1:role/r"}
    message = usage_error(tmp_path, env)
    assert "the environment gets its credentials through web identity" in message
    assert "aws configure export-credentials --format env" in message
    found = resolve(tmp_path, {**env, **KEYS})  # exported keys come first
    assert found.credentials is not None and found.credentials.access_key == "AKIAENVIRONMENT"


def test_no_sign_request(tmp_path: Path) -> None:
    write(tmp_path, "config", "[default]\nregion = eu-north-1\ncredential_process = x\n")
    found = resolve(tmp_path, {"AWS_ACCESS_KEY_ID": "AKIAHALF"}, no_sign_request=True)
    assert found.credentials is None
    assert found.region == "eu-north-1"
    assert (found.sigv4(), found.userpwd(), found.headers()) == (None, None, [])
    assert "unsigned requests" in found.describe()


def test_bad_credential_values(tmp_path: Path) -> None:
    assert "access key is empty or holds ':'" in usage_error(
        tmp_path, {"AWS_ACCESS_KEY_ID": "AKIA:X", "AWS_SECRET_ACCESS_KEY": SECRET})
    assert "secret key is empty or holds a control" in usage_error(
        tmp_path, {"AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": SECRET + "\n"})
    assert "session token is empty or holds a control" in usage_error(
        tmp_path, {**KEYS, "AWS_SESSION_TOKEN": TOKEN + "\r\nx-evil: 1"})


def test_a_colon_in_the_secret_survives_userpwd(tmp_path: Path) -> None:
    found = resolve(tmp_path, {"AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": "se:cr:et"})
    userpwd = found.userpwd()
    assert userpwd == "AKIA:se:cr:et"
    # libcurl's split: the user ends at the first ':', the password is all the rest
    assert userpwd.partition(":")[::2] == ("AKIA", "se:cr:et")


# -- configuration-file syntax errors never quote a line --------------------------------
@pytest.mark.parametrize(("text", "expected"), [
    (f"aws_secret_access_key = {SECRET}\n[default]\n", "line 1 comes before the first"),
    (f"[default]\naws_access_key_id = A\n{BARE}\n", "line 3 is not 'name = value'"),
    ("[default]\nregion = a\n[default]\n", "section [default] appears twice"),
    (f"[default]\naws_secret_access_key = {SECRET}\naws_secret_access_key = x\n",
     "'aws_secret_access_key' appears twice in [default]"),
])
@pytest.mark.parametrize("file", ["credentials", "config"])
def test_syntax_errors_name_the_line_not_its_text(tmp_path: Path, file: str, text: str,
                                                  expected: str) -> None:
    path = write(tmp_path, file, text)
    message = usage_error(tmp_path, KEYS)
    assert message.startswith(f"cannot read {path}: ") and expected in message


def test_unreadable_and_non_utf8_files(tmp_path: Path) -> None:
    path = write(tmp_path, "config", "")
    path.write_bytes(b"[default]\nregion = \xff\n")
    assert "not UTF-8 text" in usage_error(tmp_path, KEYS)
    path.unlink()
    path.mkdir()  # a directory where the file would be is no file, as for botocore
    assert resolve(tmp_path, KEYS).region == "us-east-1"


def test_bad_nested_setting(tmp_path: Path) -> None:
    write(tmp_path, "config", f"[default]\ns3 =\n  addressing_style = path\n  {BARE}\n")
    assert "a nested line is not 'name = value'" in usage_error(tmp_path, KEYS)


# -- region -----------------------------------------------------------------------------
def test_region_precedence(tmp_path: Path) -> None:
    write(tmp_path, "config", "[default]\nregion = from-profile\n")
    env = {**KEYS, "AWS_REGION": "from-aws-region", "AWS_DEFAULT_REGION": "from-default"}
    assert resolve(tmp_path, env, region="from-flag").region == "from-flag"
    assert resolve(tmp_path, env).region == "from-aws-region"
    del env["AWS_REGION"]
    assert resolve(tmp_path, env).region == "from-default"
    del env["AWS_DEFAULT_REGION"]
    assert resolve(tmp_path, env).region == "from-profile"
    (tmp_path / ".aws/config").unlink()
    found = resolve(tmp_path, env)
    assert found.region == "us-east-1" and found.region_source == "default"
    assert resolve(tmp_path, {**env, "AWS_REGION": ""}).region == "us-east-1"


def test_region_from_the_credentials_file_section(tmp_path: Path) -> None:
    # botocore merges the credentials file's section over the config file's
    write(tmp_path, "config", "[profile dev]\nregion = config-region\n")
    write(tmp_path, "credentials", "[dev]\naws_access_key_id = A\naws_secret_access_key = B\n"
                                   "region = creds-region\n")
    found = resolve(tmp_path, profile="dev")
    assert found.region == "creds-region"
    assert found.region_source == f"profile 'dev' in {tmp_path / '.aws/credentials'}: region"


@pytest.mark.parametrize(("env", "flag", "where"), [
    ({"AWS_REGION": "us east"}, None, "AWS_REGION"),
    ({}, "us-east-1:s3", "--region"),
    ({"AWS_DEFAULT_REGION": "x" * 65}, None, "AWS_DEFAULT_REGION"),
])
def test_bad_regions_name_their_source(tmp_path: Path, env, flag, where) -> None:
    message = usage_error(tmp_path, {**KEYS, **env}, region=flag)
    assert message.startswith(f"{where}: ") and "is not a region name" in message


# -- endpoint ---------------------------------------------------------------------------
def test_endpoint_precedence(tmp_path: Path) -> None:
    write(tmp_path, "config", "[default]\nendpoint_url = http://profile-global:1\n"
                              "services = local\n"
                              "[services local]\ns3 =\n  endpoint_url = http://services-s3:2\n"
                              "dynamodb =\n  endpoint_url = http://not-s3:3\n")
    env = {**KEYS, "AWS_ENDPOINT_URL_S3": "http://env-s3:4",
           "AWS_ENDPOINT_URL": "http://env-global:5"}

    def endpoint(**kwargs) -> tuple[str, str]:
        found = resolve(tmp_path, env, **kwargs)
        return found.endpoint, found.endpoint_source

    assert endpoint(endpoint_url="http://flag:6") == ("http://flag:6", "--endpoint-url")
    assert endpoint() == ("http://env-s3:4", "AWS_ENDPOINT_URL_S3")
    del env["AWS_ENDPOINT_URL_S3"]
    assert endpoint() == ("http://env-global:5", "AWS_ENDPOINT_URL")
    env["AWS_ENDPOINT_URL"] = ""  # empty is unset
    config = tmp_path / ".aws/config"
    assert endpoint() == ("http://services-s3:2", f"[services local] in {config}: s3 endpoint_url")
    text = config.read_text().replace("services = local\n", "")
    config.write_text(text)
    assert endpoint() == ("http://profile-global:1", f"profile 'default' in {config}: endpoint_url")
    config.write_text("[default]\nregion = eu-west-3\n")
    assert endpoint() == ("https://s3.eu-west-3.amazonaws.com", "AWS's endpoint for eu-west-3")
    assert endpoint(region="cn-north-1")[0] == "https://s3.cn-north-1.amazonaws.com.cn"


def test_services_section_without_s3_falls_through(tmp_path: Path) -> None:
    write(tmp_path, "config", "[default]\nendpoint_url = http://global:1\nservices = only-ddb\n"
                              "[services only-ddb]\ndynamodb =\n  endpoint_url = http://ddb:2\n")
    assert resolve(tmp_path, KEYS).endpoint == "http://global:1"


def test_services_section_that_does_not_exist(tmp_path: Path) -> None:
    write(tmp_path, "config", "[default]\nservices = missing\n")
    message = usage_error(tmp_path, KEYS)
    assert "names 'missing'" in message and "no [services missing] section" in message
    # ignored endpoints are not looked up, so the dangling name does not matter then
    assert resolve(tmp_path, {**KEYS, "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "true"}).endpoint \
        == "https://s3.us-east-1.amazonaws.com"


def test_ignore_configured_endpoint_urls(tmp_path: Path) -> None:
    write(tmp_path, "config", "[default]\nendpoint_url = http://profile:1\n"
                              "[profile ignoring]\nendpoint_url = http://profile:1\n"
                              "ignore_configured_endpoint_urls = TRUE\n")
    env = {**KEYS, "AWS_ENDPOINT_URL_S3": "http://env:2",
           "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "true"}
    assert resolve(tmp_path, env).endpoint == "https://s3.us-east-1.amazonaws.com"
    # the flag is not "configured": it always wins
    assert resolve(tmp_path, env, endpoint_url="http://flag:3").endpoint == "http://flag:3"
    # from the profile's own setting too
    del env["AWS_IGNORE_CONFIGURED_ENDPOINT_URLS"]
    assert resolve(tmp_path, {**env, "AWS_PROFILE": "ignoring"}).endpoint \
        == "https://s3.us-east-1.amazonaws.com"
    # the environment variable, when set, decides over the profile (anything but "true"
    # is false)
    assert resolve(tmp_path, {**env, "AWS_PROFILE": "ignoring",
                              "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "no"}).endpoint \
        == "http://env:2"


@pytest.mark.parametrize(("value", "normalised"), [
    ("http://127.0.0.1:9000", "http://127.0.0.1:9000"),
    ("http://127.0.0.1:9000/", "http://127.0.0.1:9000"),
    ("HTTPS://Store.Example:443", "https://Store.Example:443"),
    ("http://[::1]:8333", "http://[::1]:8333"),
    ("https://gateway.example/s3/", "https://gateway.example/s3"),
    ("https://gateway.example/a%20b/s3", "https://gateway.example/a%20b/s3"),
])
def test_good_endpoints(tmp_path: Path, value: str, normalised: str) -> None:
    assert resolve(tmp_path, KEYS, endpoint_url=value).endpoint == normalised


@pytest.mark.parametrize(("value", "expected"), [
    ("ftp://store.example", "give http://HOST[:PORT]"),
    ("store.example:9000", "give http://HOST[:PORT]"),
    ("http://", "give http://HOST[:PORT]"),
    ("http://:9000", "give http://HOST[:PORT]"),
    ("http://store.example:port", "not a URL with a valid host and port"),
    ("http://store.example:99999", "not a URL with a valid host and port"),
    ("http://store.example:0", "port 0"),
    ("http://store.example/?x=1", "no query or fragment"),
    ("http://store.example/?", "no query or fragment"),
    ("http://store.example#frag", "no query or fragment"),
    ("http://store.example/a/../b", "no '.' or '..' segment"),
    ("http://store.example/a/%2E/b", "no '.' or '..' segment"),
    ("http://store.example/a b", "no spaces or control characters"),
    ("http://store.example/a\nb", "no spaces or control characters"),
    ("http://store.example/a?b", "no query"),
    ("http://store.example/{x}", "the path may hold only"),
])
def test_bad_endpoints_name_their_source(tmp_path: Path, value: str, expected: str) -> None:
    message = usage_error(tmp_path, KEYS, endpoint_url=value)
    assert message.startswith("--endpoint-url") and expected in message
    env_message = usage_error(tmp_path, {**KEYS, "AWS_ENDPOINT_URL_S3": value})
    assert env_message.startswith("AWS_ENDPOINT_URL_S3") and expected in env_message


def test_bad_endpoint_in_a_profile_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "config", "[profile dev]\nendpoint_url = ftp://x\n"
                                     "aws_access_key_id = A\naws_secret_access_key = B\n")
    message = usage_error(tmp_path, profile="dev")
    assert message.startswith(f"profile 'dev' in {path}: endpoint_url 'ftp://x'")


def test_endpoint_with_a_password_or_token_is_not_echoed(tmp_path: Path) -> None:
    for password in (SECRET, BARE):  # SECRET holds '/', which ends the URL's authority
        for url in (f"http://user:{password}@store:9000", f"http://user:{password}@store:x",
                    f"ftp://user:{password}@store", f"http://{password}@store/a b"):
            message = usage_error(tmp_path, KEYS, endpoint_url=url)
            assert "must not hold a user name or password" in message
    message = usage_error(tmp_path, KEYS,
                          endpoint_url=f"http://store:9000/?X-Amz-Security-Token={TOKEN}")
    assert "'http://store:9000/'" in message


# -- addressing -------------------------------------------------------------------------
def test_auto_addressing_on_aws(tmp_path: Path) -> None:
    found = resolve(tmp_path, KEYS, region="eu-west-1")
    assert found.addressing == "auto" and found.is_aws()
    assert found.addressing_for("my-bucket") == "virtual"
    assert found.bucket_url("my-bucket") == "https://my-bucket.s3.eu-west-1.amazonaws.com/"
    assert found.object_url("my-bucket", "a/b.txt") \
        == "https://my-bucket.s3.eu-west-1.amazonaws.com/a/b.txt"
    # a dotted name would break the *.s3 wildcard certificate
    bucket = "my.dotted.bucket"
    assert found.addressing_for(bucket) == "path"
    assert found.bucket_url(bucket) == f"https://s3.eu-west-1.amazonaws.com/{bucket}"
    assert found.object_url(bucket, "k") == f"https://s3.eu-west-1.amazonaws.com/{bucket}/k"
    # a name longer than a DNS label allows cannot occur: 63 is the most
    assert found.addressing_for("a" * 63) == "virtual"


def test_auto_addressing_elsewhere_is_path(tmp_path: Path) -> None:
    for endpoint in ("http://127.0.0.1:9000", "https://minio.example",
                     "http://s3.eu-west-1.amazonaws.com",  # AWS, but not https
                     "https://gateway.example/s3"):
        found = resolve(tmp_path, KEYS, endpoint_url=endpoint)
        assert not found.is_aws() and found.addressing_for("bucket") == "path"
        assert found.bucket_url("bucket") == f"{endpoint}/bucket"
        assert found.object_url("bucket", "k") == f"{endpoint}/bucket/k"
    # an AWS host given as a flag is still AWS (unlike botocore, which forces path style)
    aws = resolve(tmp_path, KEYS, endpoint_url="https://s3.dualstack.us-east-2.amazonaws.com")
    assert aws.addressing_for("bucket") == "virtual"


def test_forced_styles_and_the_profile_setting(tmp_path: Path) -> None:
    write(tmp_path, "config", "[default]\ns3 =\n  addressing_style = virtual\n"
                              "[profile pathy]\ns3 =\n  addressing_style = path\n")
    virtual = resolve(tmp_path, KEYS, endpoint_url="http://minio.local:9000")
    assert virtual.addressing == "virtual"
    assert virtual.bucket_url("b-1") == "http://b-1.minio.local:9000/"
    assert virtual.object_url("b-1", "x y") == "http://b-1.minio.local:9000/x%20y"
    # the flag beats the profile
    flagged = resolve(tmp_path, KEYS, endpoint_url="http://minio.local:9000", addressing="path")
    assert flagged.bucket_url("b-1") == "http://minio.local:9000/b-1"
    pathy = resolve(tmp_path, {**KEYS, "AWS_PROFILE": "pathy"})
    assert pathy.addressing == "path"
    assert pathy.bucket_url("my-bucket") == "https://s3.us-east-1.amazonaws.com/my-bucket"


def test_virtual_with_a_path_endpoint(tmp_path: Path) -> None:
    found = resolve(tmp_path, KEYS, endpoint_url="https://gw.example/s3", addressing="virtual")
    assert found.bucket_url("b-1") == "https://b-1.gw.example/s3/"
    assert found.object_url("b-1", "k") == "https://b-1.gw.example/s3/k"


def test_virtual_refusals(tmp_path: Path) -> None:
    assert "is an IP address" in usage_error(tmp_path, KEYS, addressing="virtual",
                                             endpoint_url="http://127.0.0.1:9000")
    assert "is an IP address" in usage_error(tmp_path, KEYS, addressing="virtual",
                                             endpoint_url="http://[::1]:9000")
    # a forced virtual style takes dotted names (the user asked for it)
    dotted = resolve(tmp_path, KEYS, addressing="virtual")
    assert dotted.bucket_url("a.b.c") == "https://a.b.c.s3.us-east-1.amazonaws.com/"


def test_bucket_names_are_checked_where_urls_are_made(tmp_path: Path) -> None:
    found = resolve(tmp_path, KEYS)
    for bad in ("UPPER_case", "a_b", "ab", "a..b", "10.0.0.1", "a/b", "b?x"):
        with pytest.raises(UsageError, match="is not a bucket name"):
            found.bucket_url(bad)
        with pytest.raises(UsageError, match="is not a bucket name"):
            found.object_url(bad, "k")
    assert "is not a bucket name" in usage_error(tmp_path, KEYS, bucket="Bad_Bucket")


def test_resolving_with_the_bucket_decides_auto(tmp_path: Path) -> None:
    assert resolve(tmp_path, KEYS, bucket="my-bucket").addressing == "virtual"
    assert resolve(tmp_path, KEYS, bucket="my.bucket").addressing == "path"
    assert resolve(tmp_path, KEYS, bucket="b-1", endpoint_url="http://h:1").addressing == "path"


def test_bad_addressing_styles(tmp_path: Path) -> None:
    assert "--addressing-style 'dns'" in usage_error(tmp_path, KEYS, addressing="dns")
    write(tmp_path, "config", "[default]\ns3 =\n  addressing_style = dns\n")
    assert "s3 addressing_style 'dns'" in usage_error(tmp_path, KEYS)
    with pytest.raises(UsageError):
        S3Settings("http://h:1", "us-east-1", None, "dns")


# -- object URLs: every key encoded exactly once ----------------------------------------
@pytest.mark.parametrize(("key", "encoded"), [
    ("plain/key-1_2.txt", "plain/key-1_2.txt"),
    ("with space", "with%20space"),
    ("a+b=c", "a%2Bb%3Dc"),
    ("100%", "100%25"),
    ("%2e%2E/x", "%252e%252E/x"),  # a literal %2e is not a dot to libcurl once encoded
    ("tilde~", "tilde~"),
    ("café/日本語", "caf%C3%A9/%E6%97%A5%E6%9C%AC%E8%AA%9E"),
    ("emoji-😀", "emoji-%F0%9F%98%80"),
    ("hash#frag", "hash%23frag"),
    ("what?x=1&y", "what%3Fx%3D1%26y"),
    ("colon:at@semi;comma,", "colon%3Aat%40semi%3Bcomma%2C"),
    ("quotes'\"<>", "quotes%27%22%3C%3E"),
    ("star*paren()!$", "star%2Aparen%28%29%21%24"),
    ("back\\slash|^`{}[]", "back%5Cslash%7C%5E%60%7B%7D%5B%5D"),
    ("tab\tnl\nnul\x00", "tab%09nl%0Anul%00"),
    ("a//b", "a//b"),
    ("/leading", "/leading"),
    ("trailing/", "trailing/"),
    ("...", "..."),
    (".hidden/..dots/x.", ".hidden/..dots/x."),
    ("raw\udcff\udcfe", "raw%FF%FE"),  # undecodable bytes of a listing, sent back as they came
])
def test_object_url_encoding(key: str, encoded: str) -> None:
    found = S3Settings("http://h:9000", "us-east-1", None, "path")
    url = found.object_url("bucket", key)
    assert url == f"http://h:9000/bucket/{encoded}"
    path = urlsplit(url).path
    assert unquote_to_bytes(path) == b"/bucket/" + key.encode("utf-8", "surrogateescape")
    assert set(path) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                            "0123456789-_.~/%")


@pytest.mark.parametrize("key", ["", ".", "..", "../x", "a/../x", "a/./b", "a/.", "a/..",
                                 "./x", "a/b/../../../etc/passwd"])
def test_object_url_refuses_dot_segments(key: str) -> None:
    found = S3Settings("http://h:9000", "us-east-1", None, "path")
    with pytest.raises(UnsendableKey):
        found.object_url("bucket", key)
    assert issubclass(UnsendableKey, ValueError)  # the fetcher's per-item refusal


# -- parse_s3_url -----------------------------------------------------------------------
@pytest.mark.parametrize(("url", "parsed"), [
    ("s3://bucket", ("bucket", "")),
    ("s3://bucket/", ("bucket", "")),
    ("s3://bucket/some/prefix", ("bucket", "some/prefix")),
    ("s3://bucket/some/prefix/", ("bucket", "some/prefix/")),
    ("S3://bucket/x", ("bucket", "x")),
    ("s3://my.dotted-bucket.1/x", ("my.dotted-bucket.1", "x")),
    ("s3://abc/k?x=1#y", ("abc", "k?x=1#y")),  # '?' and '#' are key characters here
    ("s3://abc//double", ("abc", "/double")),
    ("s3://abc/a b/ü", ("abc", "a b/ü")),
    ("s3://abc/...", ("abc", "...")),
    ("s3://" + "a" * 63, ("a" * 63, "")),
])
def test_parse_s3_url(url: str, parsed: tuple[str, str]) -> None:
    assert parse_s3_url(url) == parsed


@pytest.mark.parametrize(("url", "expected"), [
    ("http://bucket/x", "is not an s3://BUCKET[/PREFIX] URL"),
    ("s3:/bucket/x", "is not an s3://BUCKET[/PREFIX] URL"),
    ("bucket/x", "is not an s3://BUCKET[/PREFIX] URL"),
    ("gs://bucket", "is not an s3://BUCKET[/PREFIX] URL"),
    ("s3://", "no bucket"),
    ("s3:///prefix", "no bucket"),
    ("s3://ab", "is not a bucket name"),
    ("s3://" + "a" * 256, "is not a bucket name"),
    ("s3://-bucket", "is not a bucket name"),
    ("s3://bucket-", "is not a bucket name"),
    ("s3://.bucket", "is not a bucket name"),
    ("s3://buc..ket", "holds '..'"),
    ("s3://192.168.1.10", "is an IP address"),
    ("s3://buc ket", "is not a bucket name"),
    ("s3://UPPER_case", "is not a bucket name"),
    ("s3://under_score", "is not a bucket name"),
    ("s3://Upper", "is not a bucket name"),
    ("s3://user@bucket", "is not a bucket name"),
    ("s3://bucket:443/x", "is not a bucket name"),
    ("s3://bucket/a/../x", "'.' or '..' segment"),
    ("s3://bucket/./x", "'.' or '..' segment"),
    ("s3://bucket/..", "'.' or '..' segment"),
    ("s3://bucket/a/.", "'.' or '..' segment"),
])
def test_parse_s3_url_refusals(url: str, expected: str) -> None:
    with pytest.raises(UsageError, match=None) as caught:
        parse_s3_url(url)
    assert expected in str(caught.value)


# -- nothing secret in any text ---------------------------------------------------------
def test_no_secret_in_repr_str_or_describe(tmp_path: Path) -> None:
    found = resolve(tmp_path, {**KEYS, "AWS_SESSION_TOKEN": TOKEN, "AWS_REGION": "eu-west-1"})
    assert found.credentials is not None
    texts = [repr(found), str(found), found.describe(), repr(found.credentials),
             str(found.credentials), found.bucket_url("b-1"), found.object_url("b-1", "k"),
             found.sigv4() or ""]
    for text in texts:
        assert SECRET not in text and TOKEN not in text
    assert found.describe() == ("endpoint https://s3.eu-west-1.amazonaws.com (AWS's endpoint "
                                "for eu-west-1), region eu-west-1 (AWS_REGION), auto "
                                "addressing: virtual-hosted where the bucket name allows it, "
                                "signed with credentials from environment (AWS_ACCESS_KEY_ID)"
                                " with a session token")
    # they are where libcurl needs them, and only there
    assert SECRET in (found.userpwd() or "") and f"x-amz-security-token: {TOKEN}" in found.headers()


def test_describe_of_other_shapes(tmp_path: Path) -> None:
    write(tmp_path, "credentials", "[dev]\naws_access_key_id = A\naws_secret_access_key = B\n")
    found = resolve(tmp_path, profile="dev", endpoint_url="http://h:9", region="garage",
                    addressing="virtual")
    assert found.describe() == (
        "endpoint http://h:9 (--endpoint-url), region garage (--region), virtual-hosted "
        f"addressing, signed with credentials from profile 'dev' in "
        f"{tmp_path / '.aws/credentials'}")
    unsigned = resolve(tmp_path, endpoint_url="http://h:9", no_sign_request=True)
    assert unsigned.describe() == ("endpoint http://h:9 (--endpoint-url), region us-east-1 "
                                   "(default), path-style addressing (auto), unsigned requests")


def test_settings_pickle_and_compare(tmp_path: Path) -> None:
    found = resolve(tmp_path, {**KEYS, "AWS_SESSION_TOKEN": TOKEN})
    again = pickle.loads(pickle.dumps(found))
    assert again == found and again.credentials == found.credentials
    assert again.describe() == found.describe()
    with pytest.raises(AttributeError):
        found.region = "x"  # type: ignore[misc]


def test_aws_endpoint() -> None:
    assert aws_endpoint("us-east-1") == "https://s3.us-east-1.amazonaws.com"
    assert aws_endpoint("cn-northwest-1") == "https://s3.cn-northwest-1.amazonaws.com.cn"


def test_module_reads_only_what_it_is_given(tmp_path: Path, monkeypatch) -> None:
    """environ= and home= are the only sources: the process's are not consulted."""
    write(tmp_path / "real", "credentials", "[default]\naws_access_key_id = AKIAREAL\n"
                                            "aws_secret_access_key = r\n")
    monkeypatch.setenv("HOME", str(tmp_path / "real"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAPROCESS")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "p")
    assert "no AWS credentials found" in usage_error(tmp_path / "empty", {})
    assert settings_module.os.environ.get("AWS_ACCESS_KEY_ID") == "AKIAPROCESS"
