"""The docs hold as written: every ```bash and ```python block of README.md and of each page
under docs/guide/ runs against servers on 127.0.0.1, page by page, twice in the same
directory (docskit.py gives the convention); the docs site builds with `mkdocs --strict`;
links resolve; a flag's default stated in the docs is the one `--help` states."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from docskit import Block, Failure, PageRun, mismatch, parse, port_of, run_twice

from bulkfetch.util.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
README = ROOT / "README.md"
GUIDES = sorted((ROOT / "docs" / "guide").glob("*.md"))
PAGES = [README, *GUIDES]
VERBS = ("get", "ls", "cat", "extract", "hash", "pull", "serve", "bench", "status", "demo")


# What a page's examples need beyond the test extra's Python packages; `bash .ci/run`
# installs it all, so in CI a missing one fails the page instead of skipping it.
NEEDS = {"README.md": ("docker-registry", "skopeo"),
         "containers.md": ("docker-registry", "skopeo", "umoci"),
         "benchmarks.md": ("nginx", "wrk")}
MODULES = {"many-machines.md": ("ray",), "tables-and-shards.md": ("pyarrow", "webdataset"),
           "small-files-api.md": ("prometheus_client",)}


def require(page: Path) -> None:
    missing = [tool for tool in NEEDS.get(page.name, ())
               if not (shutil.which(tool) or shutil.which(tool, path="/usr/sbin"))]
    missing += [module for module in MODULES.get(page.name, ())
                if importlib.util.find_spec(module) is None]
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{page.name} needs {', '.join(missing)}: .ci/run must install it")
        pytest.skip(f"{page.name} needs {', '.join(missing)} (bash .ci/run installs it)")


def page_blocks(page: Path) -> list[Block]:
    """The page's blocks; README.md's Quick start (installing, running the whole suite) is
    the set-up, held by test_quick_start_has_exactly_two_commands instead."""
    text = page.read_text()
    if page == README:
        start = text.index("## Quick start")
        end = text.index("\n## ", start + 1)
        text = text[:start] + "\n" * text[start:end].count("\n") + text[end:]
    return parse(text)


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_example_runs_twice(page: Path, tmp_path: Path) -> None:
    blocks = page_blocks(page)
    assert any(b.lang in ("bash", "python") for b in blocks), f"{page.name} has no example"
    require(page)
    for run in run_twice(page, blocks, tmp_path, SRC):
        print("\n".join(run.ran))  # where the time goes, with pytest -s


def test_quick_start_has_exactly_two_commands() -> None:
    text = README.read_text()
    start = text.index("## Quick start")
    quick = text[start:text.index("\n## ", start + 1)]
    commands = re.findall(r"```bash\n(.*?)```", quick, re.DOTALL)
    assert [c.strip() for c in commands] == ["pip install -e . && bulkfetch demo", "bash .ci/run"]


def test_readme_stays_a_front_page() -> None:
    assert len(README.read_text().splitlines()) <= 155


def test_the_docs_build_strict(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("mkdocs is missing: .ci/run must install .[docs]")
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                           "--config-file", str(ROOT / "mkdocs.yml"),
                           "--site-dir", str(tmp_path / "site")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr + done.stdout
    for page in ("index.html", "guide/s3/index.html", "architecture/index.html"):
        assert (tmp_path / "site" / page).is_file(), page


LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", [README, *sorted((ROOT / "docs").rglob("*.md"))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    """mkdocs checks the pages under docs/ too, but not README.md, nor links that leave
    docs/ (which it cannot serve: such a link would be broken on the site)."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        assert path.exists(), f"{page.name}: {target} does not exist"
        if page != README:
            assert (ROOT / "docs") in path.parents, f"{page.name}: {target} leaves docs/"


# -- a default the docs state is the one --help states ---------------------------------------
DEFAULT = re.compile(r"`(--[a-z][a-z0-9-]*)[^`]*`[^`(]{0,40}\(default:?\s+([^);]+)[);]")


@functools.cache
def help_text(verb: str) -> str:
    return subprocess.run([sys.executable, "-m", "bulkfetch", verb, "--help"],
                          capture_output=True, text=True, check=True,
                          env={**os.environ, "COLUMNS": "1000"}).stdout


def help_defaults() -> dict[str, set[str]]:
    """--flag -> the defaults `bulkfetch VERB --help` states for it, over all verbs."""
    found: dict[str, set[str]] = {}
    for verb in VERBS:
        text = help_text(verb)
        for entry in re.split(r"\n  (?=-)", text.split("\nOptions:\n", 1)[1]):
            flags = re.findall(r"(?:^|[ ,/])(--[a-z][a-z0-9-]*)", entry.split("  ")[0])
            stated = re.search(r"\[default: ([^\]]+)\]", " ".join(entry.split()))
            for flag in flags:
                if stated:
                    found.setdefault(flag, set()).add(stated[1].split(";")[0].strip())
    return found


def test_defaults_in_the_docs_are_the_help_defaults() -> None:
    stated = help_defaults()
    checked = 0
    for page in [README, *sorted((ROOT / "docs" / "guide").glob("*.md"))]:
        for flag, value in DEFAULT.findall(page.read_text()):
            if flag not in stated:
                continue  # a flag of another tool (benchmarks/*.py, the test registry)
            checked += 1
            said = " ".join(value.split())  # "16m", or "16m for `pull`": a default, a remark
            assert any(said == d or said.startswith(d + " ") for d in stated[flag]), (
                f"{page.name}: {flag} (default {value}) but --help says {stated[flag]}")
    assert checked >= 10  # the pattern still finds what the guides state


COMMAND = re.compile(rf"bulkfetch ({'|'.join(VERBS)})\b([^`|;&#)\n]*)")


def test_commands_in_the_docs_use_flags_their_verb_has() -> None:
    """Every `bulkfetch VERB ... --flag` written anywhere in the docs (blocks that are not
    run, and prose, too) names a flag of that verb's --help."""
    checked = 0
    for page in [README, *sorted((ROOT / "docs").rglob("*.md"))]:
        text = re.sub(r"\\\n\s*", " ", page.read_text())  # a command's continued lines
        for verb, rest in COMMAND.findall(text):
            options = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", help_text(verb)))
            for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest):
                checked += 1
                assert flag in options, f"{page.name}: bulkfetch {verb} has no {flag}"
    assert checked >= 100


# -- the runner itself ---------------------------------------------------------------------
def run_page(tmp_path: Path, markdown: str) -> list[PageRun]:
    page = tmp_path / "page.md"
    page.write_text(markdown)
    return list(run_twice(page, parse(markdown), tmp_path / "root", SRC))


def test_blocks_and_their_outputs_are_parsed() -> None:
    blocks = parse("x\n\n```bash\necho hi\n```\n\n```text\nhi\n```\n\nprose\n\n```text\n"
                   "not an output\n```\n  ```python\n  print(1)\n  ```\n")
    assert [(b.lang, b.code, b.expect) for b in blocks] == [
        ("bash", "echo hi\n", "hi\n"), ("text", "not an output\n", None),
        ("python", "print(1)\n", None)]
    assert port_of("# in another terminal:\nbulkfetch serve --files 9\n") == 8000
    assert port_of("# in another terminal:\nbulkfetch serve --port 8123\n") == 8123


def test_expected_lines_must_come_in_order() -> None:
    output = "a: 1\nb: 2 files\nc\n"
    assert mismatch("a: ...\n...\nc\n", output) is None
    assert mismatch("b: 2 ...\n", output) is None
    assert mismatch("c\na: 1\n", output) == "a: 1"
    assert mismatch("b: 3 files\n", output) == "b: 3 files"


def test_state_carries_from_block_to_block_and_into_the_second_run(tmp_path: Path) -> None:
    runs = run_page(tmp_path, "```bash\nexport N=7\necho $N >> seen\n```\n\n"
                              "```bash\necho \"N is $N\"; wc -l < seen\n```\n")
    assert len(runs) == 2
    assert (tmp_path / "root" / "work" / "seen").read_text() == "7\n7\n"


def test_a_failing_block_fails_the_page(tmp_path: Path) -> None:
    with pytest.raises(Failure, match=r"page.md:5 \(bash\) exited with status 3"):
        run_page(tmp_path, "```bash\ntrue\n```\n\n```bash\necho before\n(exit 3)\n"
                           "echo never\n```\n")


def test_a_wrong_output_fails_the_page(tmp_path: Path) -> None:
    with pytest.raises(Failure, match="did not print the line 'two'"):
        run_page(tmp_path, "```python\nprint('one')\n```\n\n```text\ntwo\n```\n")


def test_a_failure_in_the_second_run_only_fails_the_page(tmp_path: Path) -> None:
    with pytest.raises(Failure, match=r"run 2 of page\.md"):
        run_page(tmp_path, "```bash\nmkdir made-once\n```\n")


def test_servers_start_answer_and_stop(tmp_path: Path) -> None:
    port = free_port()
    runs = run_page(tmp_path, f"```bash\n# in another terminal:\nbulkfetch serve --files 5 "
                              f"--port {port} --processes 1\n```\n\n```text\nserving http://"
                              f"127.0.0.1:{port} (5 files...\n```\n\n```bash\npython3 -c 'import "
                              f"urllib.request as u; print(u.urlopen(\"http://127.0.0.1:"
                              f"{port}/list\").read().decode())' > list.json\n```\n")
    assert all(run.servers[port].process.poll() is not None for run in runs)  # stopped
    assert "f0000000004" in (tmp_path / "root" / "work" / "list.json").read_text()
