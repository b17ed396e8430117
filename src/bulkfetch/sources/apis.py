"""Listing shapes as data: `--api NAME` loads a built-in TOML file (sources/apis/NAME.toml),
`--api-file FILE.toml` a user's own; flags given explicitly override either.

Keys (all optional; README.md, "Other listing APIs"):
  list_path, get_template                 as --list-path, --get-template
  names_key, next_key, marker_param       the seed API's (--names-key ...), which alone keep
                                          the seed API's fast path
  items, name, size, md5, sha256, url,    JMESPath expressions, as --items, --name ...
  total, next
  paginate                                token | url | link | offset | page | none
  next_param, page_param, limit_param     query parameter names
  page_size, first_page                   integers
  allow_cross_host_pages                  true | false
  description                             text, ignored
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from importlib import resources
from typing import Any

from bulkfetch.config import PAGINATION_STYLES, ApiShape, SourceShape
from bulkfetch.errors import UsageError

PRESETS = ("seed", "gcs", "github-releases", "drf", "hf-tree")
SEED_KEYS = ("names_key", "next_key", "marker_param")
PATH_KEYS = ("items", "name", "size", "md5", "sha256", "url", "total", "next")
TEXT_KEYS = (*SEED_KEYS, *PATH_KEYS, "list_path", "get_template", "paginate", "next_param",
             "page_param", "limit_param", "description")
INT_KEYS = ("page_size", "first_page")
BOOL_KEYS = ("allow_cross_host_pages",)
KEYS = (*TEXT_KEYS, *INT_KEYS, *BOOL_KEYS)
# Keys that make a shape the generic JSON source's rather than the seed API's
JSON_KEYS = frozenset(KEYS) - {*SEED_KEYS, "list_path", "get_template", "description"}


def load_preset(name: str) -> dict[str, Any]:
    if name not in PRESETS:
        raise UsageError(f"--api {name!r}: choose one of {', '.join(PRESETS)}, or describe "
                         "the API in a file for --api-file")
    text = resources.files("bulkfetch.sources").joinpath("apis", f"{name}.toml").read_text(
        encoding="utf-8")
    return checked(tomllib.loads(text), f"--api {name}")


def load_api_file(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except OSError as exc:
        raise UsageError(f"--api-file {path}: cannot be read ({exc.strerror or exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"--api-file {path}: not TOML: {exc}") from None
    return checked(data, f"--api-file {path}")


def checked(data: Mapping[str, Any], where: str) -> dict[str, Any]:
    """`data` if every key is known and of its type; UsageError naming the key if not."""
    for key, value in data.items():
        if key not in KEYS:
            raise UsageError(f"{where}: unknown key {key!r}; the keys are {', '.join(KEYS)}")
        if key in TEXT_KEYS and not isinstance(value, str):
            raise UsageError(f"{where}: {key} must be a string, not {value!r}")
        if key in INT_KEYS and (not isinstance(value, int) or isinstance(value, bool)):
            raise UsageError(f"{where}: {key} must be an integer, not {value!r}")
        if key in BOOL_KEYS and not isinstance(value, bool):
            raise UsageError(f"{where}: {key} must be true or false, not {value!r}")
    return dict(data)


def resolve_shape(api: str | None, api_file: str | None, given: Mapping[str, Any],
                  generic: bool = False) -> tuple[SourceShape, ApiShape | None]:
    """The run's listing shape: the preset, then the file, then the flags `given` (keys as
    in the TOML files; only flags the user gave). ApiShape None: the seed API's shape, for
    the seed fast path, unless `generic` (headers to send: only the JSON source sends
    them), which asks for the seed shape as an ApiShape."""
    merged: dict[str, Any] = {}
    if api is not None:
        merged |= load_preset(api)
    if api_file is not None:
        merged |= load_api_file(api_file)
    merged |= {key: value for key, value in given.items() if value is not None}
    merged.pop("description", None)
    seed = SourceShape()
    json_mode = bool(JSON_KEYS & merged.keys())
    shape = SourceShape(
        list_path=merged.get("list_path", "" if json_mode else seed.list_path),
        names_key=merged.get("names_key", seed.names_key),
        next_key=merged.get("next_key", seed.next_key),
        marker_param=merged.get("marker_param", seed.marker_param),
        get_template=merged.get("get_template", seed.get_template))
    if not json_mode and not generic:
        return shape, None
    if not json_mode:  # the seed shape, spelled as the JSON source's
        merged |= {"items": shape.names_key, "next": shape.next_key,
                   "next_param": shape.marker_param}
    else:  # a seed key given beside JSON keys stands for its JSON key
        for seed_key, key in zip(SEED_KEYS, ("items", "next", "next_param"), strict=True):
            if seed_key in merged:
                merged.setdefault(key, merged[seed_key])
    paginate = merged.get("paginate") or _inferred_style(merged)
    if paginate not in PAGINATION_STYLES:
        raise UsageError(f"--paginate {paginate!r}: choose one of {', '.join(PAGINATION_STYLES)}")
    fields = {key: merged[key] for key in (*PATH_KEYS, "next_param", "page_param",
                                           "limit_param", *INT_KEYS, *BOOL_KEYS)
              if key in merged}
    api_shape = ApiShape(paginate=paginate, **fields)
    check_paths(api_shape)
    return shape, api_shape


def _inferred_style(merged: Mapping[str, Any]) -> str:
    """--paginate when not given: a token with --next and --next-param, a URL with --next
    alone, page numbers with --page-param, else the Link header (one page without one)."""
    if merged.get("next"):
        return "token" if merged.get("next_param") else "url"
    if merged.get("page_param"):
        return "page"
    return "link"


def check_paths(api: ApiShape) -> None:
    """Every JMESPath expression compiles (a UsageError naming the flag, at the start)."""
    from bulkfetch.sources.jsonpaths import compile_path

    for key in PATH_KEYS:
        expression = getattr(api, key)
        if expression is not None:
            compile_path(expression, f"--{key}")
