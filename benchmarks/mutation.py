"""Mutation testing of the safety modules: does a fast test notice a small planted mistake?

    python benchmarks/mutation.py                      # every listed module, every mutant
    python benchmarks/mutation.py --sample 20          # 20 mutants a module, chosen by seed
    python benchmarks/mutation.py --module sums -j 2   # modules whose name holds "sums"

For each module in SAFETY_MODULES it plants one mistake at a time in a copy of `src/` (a
flipped comparison, a negated condition, `return None`, a deleted call, `raise` -> `pass`,
`and` <-> `or`, `True` <-> `False`, an integer constant + 1) and runs the unit and contract
tests that import the module, and only those: its guarantees must not hang on an end-to-end
test passing by. A mutant is killed when a test fails or the run exceeds a few times the
tests' own time (a planted endless loop); it survived when every test passed.

Mutants that cannot change behaviour (a batch size, a buffer's length) are listed in
`mutation_equivalents.tsv` with one line of reason each, keyed by module, source line and
mutation, and kept out of the score. The table prints module, mutants, killed, survived,
equivalent and score (killed / non-equivalent); the survivors follow, one line each.

Not part of CI's time budget (a full run takes tens of minutes on 2 cores). Run it before
resolving an issue that touches a listed module, and kill or list every new survivor.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENTS = Path(__file__).resolve().parent / "mutation_equivalents.tsv"
FAST_TESTS = ("tests/unit", "tests/contract")

SAFETY_MODULES = (
    "bulkfetch.util.names",          # remote names -> local paths: no escape from DEST
    "bulkfetch.util.redact",         # secrets never printed
    "bulkfetch.sources.collisions",  # two URLs naming one file
    "bulkfetch.dest.sums",           # the recorded MD5s
    "bulkfetch.engine.transfers",    # retries, redirects, a host's in-flight slots
    "bulkfetch.sources.pagination",  # listing loop guards
    "bulkfetch.dest.journal",        # what is done, resumably
    "bulkfetch.util.atomic",         # no torn file
    "bulkfetch.dest.lock",           # one run a DEST
    "bulkfetch.oci.reference",       # digests as parsed
    "bulkfetch.oci.registry",        # manifests and blobs checked against their digests
    "bulkfetch.net.tls",             # certificate checks
    "bulkfetch.s3.signer",           # SigV4
)

FLIPPED = {ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.LtE: ast.Gt,
           ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In,
           ast.Is: ast.IsNot, ast.IsNot: ast.Is}


@dataclass(frozen=True)
class Mutant:
    module: str
    line: int  # 1-based
    start: int  # offsets into the module's text
    end: int
    replacement: str
    what: str  # e.g. "compare: a < b -> a >= b"

    def source_line(self, text: str) -> str:
        return text.splitlines()[self.line - 1].strip()


@dataclass
class Outcome:
    mutant: Mutant
    killed: bool
    equivalent: str | None  # the reason, when listed


def _offsets(text: str) -> list[int]:
    """Where each line starts in `text` (AST positions are line + UTF-8 byte column)."""
    starts, total = [0], 0
    for line in text.splitlines(keepends=True):
        total += len(line)
        starts.append(total)
    return starts


def _at(text: str, starts: list[int], line: int, byte_col: int) -> int:
    row = text[starts[line - 1]:starts[line]]
    return starts[line - 1] + len(row.encode()[:byte_col].decode())


def _skipped_lines(tree: ast.Module) -> set[int]:
    """Lines no mutant should touch: annotations, docstrings, `if TYPE_CHECKING:` blocks,
    `__all__`: no behaviour lives there."""
    skipped: set[int] = set()

    def cover(node: ast.AST) -> None:
        skipped.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))  # type: ignore[attr-defined]

    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            cover(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for arg in [*node.args.args, *node.args.kwonlyargs, *node.args.posonlyargs]:
                if arg.annotation is not None:
                    cover(arg.annotation)
            if node.returns is not None:
                cover(node.returns)
        elif isinstance(node, ast.AnnAssign):
            cover(node.annotation)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and node.body and isinstance(node.body[0], ast.Expr)
                and isinstance(node.body[0].value, ast.Constant)):
            cover(node.body[0])
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            cover(node)
    return skipped


def mutants_of(module: str, text: str) -> list[Mutant]:
    """Every mutant of one module's source, in source order."""
    tree = ast.parse(text)
    starts, skipped, found = _offsets(text), _skipped_lines(tree), []

    def span(node: ast.AST) -> tuple[int, int]:
        return (_at(text, starts, node.lineno, node.col_offset),  # type: ignore[attr-defined]
                _at(text, starts, node.end_lineno, node.end_col_offset))  # type: ignore[attr-defined]

    def add(node: ast.AST, replacement: str, what: str) -> None:
        if node.lineno in skipped:  # type: ignore[attr-defined]
            return
        start, end = span(node)
        found.append(Mutant(module, node.lineno, start, end, replacement, what))  # type: ignore[attr-defined]

    keywords = {id(kw.value): f"{kw.arg}=" for kw in ast.walk(tree)
                if isinstance(kw, ast.keyword) and kw.arg}  # names a constant's mutant
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                if type(op) in FLIPPED:
                    ops = list(node.ops)
                    ops[i] = FLIPPED[type(op)]()
                    new = ast.unparse(ast.Compare(node.left, ops, node.comparators))
                    add(node, f"({new})", f"compare: {ast.unparse(node)} -> {new}")
        elif isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)):
            test = node.test
            add(test, f"(not ({ast.get_source_segment(text, test)}))",
                f"negate: {ast.unparse(test)}")
        if isinstance(node, ast.BoolOp):
            other = "or" if isinstance(node.op, ast.And) else "and"
            parts = [f"({ast.get_source_segment(text, v)})" for v in node.values]
            add(node, f"({f' {other} '.join(parts)})", f"boolop: -> {other}")
        elif isinstance(node, ast.Return) and node.value is not None and not (
                isinstance(node.value, ast.Constant) and node.value.value is None):
            add(node, "return None", f"return None: {ast.unparse(node)[:60]}")
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            add(node, "pass", f"delete call: {ast.unparse(node.value)[:60]}")
        elif isinstance(node, ast.Raise):
            add(node, "pass", f"raise -> pass: {ast.unparse(node)[:60]}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
            add(node, str(not node.value),
                f"constant: {keywords.get(id(node), '')}{node.value} -> {not node.value}")
        elif (isinstance(node, ast.Constant) and type(node.value) is int):
            add(node, str(node.value + 1),
                f"constant: {keywords.get(id(node), '')}{node.value} -> {node.value + 1}")
    found.sort(key=lambda m: (m.start, m.end, m.what))
    return found


def _imports(path: Path, module: str) -> bool:
    """Whether the file at `path` imports `module` (as `import a.b.c`, `from a.b import c`
    or `from a.b.c import x`)."""
    package, _, leaf = module.rpartition(".")
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module == module or (
                node.module == package and any(a.name == leaf for a in node.names))):
            return True
        if isinstance(node, ast.Import) and any(a.name == module for a in node.names):
            return True
    return False


def tests_importing(module: str) -> list[str]:
    """The fast test files that import `module`, directly or through a helper module of
    their folder (the contract suites' harnesses, a conftest)."""
    chosen: set[Path] = set()
    for folder in FAST_TESTS:
        files = sorted((ROOT / folder).rglob("*.py"))
        tests = [f for f in files if f.name.startswith("test_")]
        for helper in (f for f in files if _imports(f, module)):
            if helper in tests:
                chosen.add(helper)
            elif helper.name == "conftest.py":  # every test under it uses it
                chosen.update(t for t in tests if helper.parent in t.parents)
            else:
                chosen.update(t for t in tests if _imports(t, helper.stem))
    return sorted(str(p.relative_to(ROOT)) for p in chosen)


def load_equivalents() -> dict[tuple[str, str, str], str]:
    """(module, stripped source line, mutation) -> reason, from mutation_equivalents.tsv."""
    listed = {}
    for number, raw in enumerate(EQUIVALENTS.read_text().splitlines(), 1):
        if not raw.strip() or raw.startswith("#"):
            continue
        fields = raw.split("\t")
        if len(fields) != 4 or not fields[3].strip():
            sys.exit(f"{EQUIVALENTS.name}:{number}: want module, source line, mutation and "
                     "reason, separated by tabs")
        listed[(fields[0], fields[1], fields[2])] = fields[3]
    return listed


def _module_path(tree: Path, module: str) -> Path:
    return tree / "src" / (module.replace(".", "/") + ".py")


def _copy_tree() -> Path:
    """A copy of src/ (with the built C extension, without bytecode) to mutate."""
    tree = Path(tempfile.mkdtemp(prefix="bulkfetch-mutants-"))
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__"))
    return tree


def _run_tests(tree: Path, tests: list[str], timeout: float) -> tuple[bool, float]:
    """(every test passed, seconds)."""
    env = dict(os.environ, PYTHONPATH=str(tree / "src"), PYTHONDONTWRITEBYTECODE="1")
    started = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
             "--timeout", str(int(timeout) + 1), *tests],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, time.monotonic() - started
    return proc.returncode == 0, time.monotonic() - started


def _judge(tree: Path, mutant: Mutant, text: str, tests: list[str], timeout: float) -> bool:
    """Whether the tests kill `mutant` (planted in `tree`, then taken out again)."""
    path = _module_path(tree, mutant.module)
    mutated = text[:mutant.start] + mutant.replacement + text[mutant.end:]
    try:
        compile(mutated, str(path), "exec")
    except SyntaxError:
        return True  # not a program at all: nothing to learn, counted as killed
    path.write_text(mutated)
    try:
        passed, _ = _run_tests(tree, tests, timeout)
    finally:
        path.write_text(text)
    return not passed


def run_module(module: str, sample: int, seed: int, jobs: int, trees: list[Path],
               equivalents: dict[tuple[str, str, str], str]) -> list[Outcome]:
    text = _module_path(ROOT, module).read_text()
    tests = tests_importing(module)
    if not tests:
        sys.exit(f"{module}: no unit or contract test imports it; write one first")
    passed, seconds = _run_tests(trees[0], tests, timeout=600)
    if not passed:
        sys.exit(f"{module}: its tests fail before any mutation: {' '.join(tests)}")
    timeout = max(10.0, 4 * seconds)
    every = mutants_of(module, text)
    chosen = every if sample <= 0 or sample >= len(every) else sorted(
        random.Random(f"{seed}:{module}").sample(every, sample), key=lambda m: m.start)
    print(f"{module}: {len(chosen)} of {len(every)} mutants, {len(tests)} test files, "
          f"{seconds:.1f} s a run", file=sys.stderr, flush=True)
    outcomes: list[Outcome] = []
    listed = [equivalents.get((module, m.source_line(text), m.what)) for m in chosen]
    to_run = [m for m, reason in zip(chosen, listed, strict=True) if reason is None]
    free = list(trees)
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        def judge(mutant: Mutant) -> bool:
            tree = free.pop()
            try:
                return _judge(tree, mutant, text, tests, timeout)
            finally:
                free.append(tree)
        verdicts = dict(zip(to_run, pool.map(judge, to_run), strict=True))
    for mutant, reason in zip(chosen, listed, strict=True):
        outcomes.append(Outcome(mutant, verdicts.get(mutant, False), reason))
    return outcomes


def print_table(results: dict[str, list[Outcome]]) -> None:
    print("| module | mutants | killed | survived | equivalent | score |")
    print("|---|---:|---:|---:|---:|---:|")
    totals = [0, 0, 0, 0]
    for module, outcomes in results.items():
        equivalent = sum(o.equivalent is not None for o in outcomes)
        killed = sum(o.killed for o in outcomes)
        survived = len(outcomes) - killed - equivalent
        row = [len(outcomes), killed, survived, equivalent]
        totals = [a + b for a, b in zip(totals, row, strict=True)]
        print(_row(module.removeprefix("bulkfetch."), *row))
    print(_row("**total**", *totals))
    for module, outcomes in results.items():
        text = _module_path(ROOT, module).read_text()
        for o in outcomes:
            if not o.killed and o.equivalent is None:
                print(f"SURVIVED {module}:{o.mutant.line}  {o.mutant.what}\n"
                      f"    {o.mutant.source_line(text)}")


def _row(name: str, mutants: int, killed: int, survived: int, equivalent: int) -> str:
    judged = mutants - equivalent
    score = f"{100 * killed / judged:.0f}%" if judged else "-"
    return f"| {name} | {mutants} | {killed} | {survived} | {equivalent} | {score} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--module", action="append", default=[],
                        help="only the listed modules whose name contains this (repeatable)")
    parser.add_argument("--sample", type=int, default=0,
                        help="mutants a module, chosen by --seed (0: every mutant)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1,
                        help="mutants judged at once, each in its own copy of src/")
    parser.add_argument("--list", action="store_true",
                        help="print the mutants and the tests each module runs; judge none")
    args = parser.parse_args()
    modules = [m for m in SAFETY_MODULES
               if not args.module or any(part in m for part in args.module)]
    if not modules:
        parser.error(f"--module {args.module}: none of {', '.join(SAFETY_MODULES)}")
    if args.list:
        for module in modules:
            text = _module_path(ROOT, module).read_text()
            print(f"{module}: tests {' '.join(tests_importing(module)) or '(none)'}")
            for m in mutants_of(module, text):
                print(f"  {m.line}: {m.what}")
        return
    equivalents = load_equivalents()
    trees = [_copy_tree() for _ in range(max(1, args.jobs))]
    try:
        results = {m: run_module(m, args.sample, args.seed, len(trees), trees, equivalents)
                   for m in modules}
    finally:
        for tree in trees:
            shutil.rmtree(tree, ignore_errors=True)
    print_table(results)


if __name__ == "__main__":
    main()
