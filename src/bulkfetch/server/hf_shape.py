"""`bulkfetch serve --shape hf-tree`: the Hugging Face Hub's repository tree
(HfApi.list_repo_tree in huggingface_hub,
https://huggingface.co/docs/huggingface_hub/package_reference/hf_api, and
https://huggingface.co/docs/hub/api), as server/shapes.py's other shapes:

    GET /api/models/bulkfetch/synthetic/tree/main[/][?recursive=true][&cursor=C]
    (and /api/datasets/...)
    -> [{"type": "file", "oid": OID, "size": 100, "path": NAME,
         "lfs": {"oid": "SHA-256 HEX", "size": 100, "pointerSize": P}}, ...]
    Link: <http://HOST/api/models/bulkfetch/synthetic/tree/main?...&cursor=C2>; rel="next"
    GET /bulkfetch/synthetic/resolve/main/PATH   the bytes (/datasets/bulkfetch/synthetic/...)
    Every file is stored in LFS: "oid" is the git blob id of its LFS pointer (P bytes),
    lfs.oid its SHA-256. Every file is listed, at any depth (as recursive=true lists them;
    no directory entries); listing a folder under the revision is refused (400); only the
    revision "main" exists.
"""

from __future__ import annotations

import hashlib
from urllib.parse import parse_qsl, urlencode

from bulkfetch.server.app import Response, json_response
from bulkfetch.server.shapes import HF_REPO, HF_REVISION, ShapeApp, Stated
from bulkfetch.server.tokens import BadToken

LFS_SPEC = "https://git-lfs.github.com/spec/v1"


def lfs_pointer(sha256: bytes, size: int) -> bytes:
    """The Git LFS pointer file of a body (https://github.com/git-lfs/git-lfs/blob/main/
    docs/spec.md): what git stores in the body's place."""
    return f"version {LFS_SPEC}\noid sha256:{sha256.hex()}\nsize {size}\n".encode("ascii")


def git_blob_id(content: bytes) -> str:
    """The git object id (SHA-1) of a blob: what the Hub states as a file's "oid"."""
    return hashlib.sha1(b"blob %d\x00" % len(content) + content).hexdigest()


class HfTreeApp(ShapeApp):
    shape = "hf-tree"
    needs_sha256 = True
    CONTENT_TYPE = "application/json; charset=utf-8"
    _KINDS = ("models", "datasets")

    def file_target(self, target: str) -> bool:
        path = target.partition("?")[0]
        return path.startswith(f"/{HF_REPO}/resolve/") or \
            path.startswith(f"/datasets/{HF_REPO}/resolve/")

    def error(self, status: int, message: str,
              extra: list[tuple[str, str]] | None = None) -> Response:
        return json_response(status, {"error": message}, self.CONTENT_TYPE, extra)

    def _hub_error(self, status: int, message: str, code: str) -> Response:
        return self.error(status, message, [("X-Error-Code", code)])

    def route(self, method: str, target: str, headers: dict[str, str]) -> Response:
        path, _, query = target.partition("?")
        for kind in self._KINDS:
            tree = f"/api/{kind}/"
            if path.startswith(tree):
                return self._tree(path[len(tree):], method, target, query, headers, kind)
        rest = path.removeprefix("/datasets/") if path.startswith("/datasets/") else path[1:]
        quoted, refused = self._in_revision(rest, "/resolve/")
        if refused is not None:
            return refused
        if not quoted:
            return self._hub_error(404, "Entry not found", "EntryNotFound")
        return self.file(quoted, method, target, headers)

    def _in_revision(self, rest: str, verb: str) -> tuple[str, Response | None]:
        """What follows REPO{verb}REVISION/ in `rest`, or the Hub's 404 when the repository
        or the revision is not the one served."""
        repo, found, after = rest.partition(verb)
        if not found or repo != HF_REPO:
            return "", self._hub_error(404, "Repository not found", "RepoNotFound")
        revision, _, inner = after.partition("/")
        if revision != HF_REVISION:
            return "", self._hub_error(404, "Revision Not Found", "RevisionNotFound")
        return inner, None

    def _tree(self, rest: str, method: str, target: str, query: str,
              headers: dict[str, str], kind: str) -> Response:
        folder, refused = self._in_revision(rest, "/tree/")
        if refused is not None:
            return refused
        if folder:
            return self.error(400, "bulkfetch serve lists the whole tree only (every file, "
                                   "as recursive=true); no folder paths")
        return self.list_page(method, target, headers,
                              lambda: self._list(query, self.origin(headers), kind))

    def _list(self, query: str, origin: str, kind: str) -> Response:
        start = 0
        token = dict(parse_qsl(query, keep_blank_values=True)).get("cursor")
        if token:
            try:
                start = self.position(token)
            except BadToken:
                return self.error(400, "Invalid cursor")
        stop = start + self.app.dataset.page_size
        items = [self._item(item) for item in self.stated(start, stop)]
        following = self.token(stop)
        extra = []
        if following is not None:  # the next URL keeps the request's other parameters
            kept = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True)
                    if k != "cursor"]
            next_query = urlencode([*kept, ("cursor", following)])
            extra.append(("Link", f"<{origin}/api/{kind}/{HF_REPO}/tree/{HF_REVISION}"
                                  f"?{next_query}>; rel=\"next\""))
        return json_response(200, items, self.CONTENT_TYPE, extra)

    @staticmethod
    def _item(item: Stated) -> dict[str, object]:
        assert item.sha256 is not None
        pointer = lfs_pointer(item.sha256, item.size)
        return {"type": "file", "oid": git_blob_id(pointer), "size": item.size,
                "path": item.name,
                "lfs": {"oid": item.sha256.hex(), "size": item.size,
                        "pointerSize": len(pointer)}}


HF_APPS: dict[str, type[ShapeApp]] = {"hf-tree": HfTreeApp}
