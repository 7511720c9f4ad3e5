"""Rules of the code that a reader can rely on (docs/ARCHITECTURE.md): no function over 80
lines and no class over 400 in the packages, and no reference to an issue tracker's number
(the tracker is not in the repository; the history is in git); and each rule of the product
written in one module, its home."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("pathmaster", "qos", "services")
GENERATED = REPO / "services" / "pb"  # protoc's output
MAX_FUNCTION_LINES = 80
MAX_CLASS_LINES = 400
ISSUE_NUMBER = re.compile(r"\bissues? #?\d+", re.IGNORECASE)


def package_files():
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if GENERATED not in path.parents:
                yield path


def oversized(source: str, path: str = "<source>") -> list[str]:
    """'path:line name (n lines)' of each function over MAX_FUNCTION_LINES and class over
    MAX_CLASS_LINES in `source`, counted from its `def` or `class` line to its last."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            lines = node.end_lineno - node.lineno + 1
            limit = MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES
            if lines > limit:
                found.append(f"{path}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_over_80_lines_and_no_class_over_400():
    found = [hit for path in package_files() for hit in oversized(path.read_text(), str(path.relative_to(REPO)))]
    assert not found, "too long:\n" + "\n".join(found)


def test_the_size_check_counts_a_function_and_a_class_from_first_line_to_last():
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES - 1))
    assert oversized(f"def f():\n{body}") == []
    assert oversized(f"def f():\n{body}    return 0\n") == [f"<source>:1 f ({MAX_FUNCTION_LINES + 1} lines)"]
    methods = "".join(f"    def m{i}(self):\n        return {i}\n\n" for i in range(MAX_CLASS_LINES // 3 + 1))
    assert [hit.split(" (")[0] for hit in oversized(f"class C:\n{methods}")] == ["<source>:1 C"]


def test_no_issue_numbers_in_code_tests_or_benchmarks():
    found = []
    for folder in (*PACKAGES, "tests", "benchmarks"):
        for path in sorted(p for pattern in ("*.py", "*.toml") for p in (REPO / folder).rglob(pattern)):
            if path == Path(__file__).resolve():
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if ISSUE_NUMBER.search(line):
                    found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not found, "issue numbers (the history is in git):\n" + "\n".join(found)


def test_the_issue_check_sees_the_usual_spellings():
    assert all(ISSUE_NUMBER.search(text) for text in ("(issue 10)", "Issue 13 item 2", "issues 4", "issue #7"))
    assert not any(ISSUE_NUMBER.search(text) for text in ("an issue", "issued 10 tokens", "tissue 5"))


# A rule and the one module that may write it (the others call it there).
RULE_HOMES = {
    "folds split by slide image": (re.compile(r"\bStratified(Group)?KFold\("), {"pathmaster/learning/folds.py"}),
    "the operating point's threshold": (re.compile(r"^def operating_point\(", re.M), {"pathmaster/learning/thresholds.py"}),
    "a vote's winner and its ties": (re.compile(r"^def majority\(", re.M), {"pathmaster/vocabulary.py"}),
    "the neighbours' abnormal share": (re.compile(r"^def neighbour_shares?\(|abnormal[^\n=]*\]\.mean\(axis=1\)", re.M),
                                       {"pathmaster/learning/neighbours.py"}),
    "a match's weight in a vote": (re.compile(r"^def match_weights\(|1\.0 / \(", re.M), {"pathmaster/conclusion.py"}),
    "a site's stored vocabulary": (re.compile(r"Vocabulary\.from_dict\("), {"pathmaster/vocabulary.py"}),
    "the coordinator's port": (re.compile(r"^COORDINATOR_PORT\s*=", re.M), {"services/shared.py"}),
}


def rule_writers(pattern: re.Pattern) -> set[str]:
    return {str(path.relative_to(REPO)) for path in package_files() if pattern.search(path.read_text())}


def test_each_rule_is_written_in_its_home_alone():
    strays = {rule: sorted(rule_writers(pattern) - home) for rule, (pattern, home) in RULE_HOMES.items()}
    assert not any(strays.values()), f"written outside its home: {strays}"
    assert all(rule_writers(pattern) == home for pattern, home in RULE_HOMES.values())  # the homes hold them


def test_the_rule_check_sees_a_second_writer(tmp_path):
    pattern, _ = RULE_HOMES["the neighbours' abnormal share"]
    assert pattern.search("share[test] = abnormal[train][nearest].mean(axis=1)\n")
    assert not pattern.search("share = neighbour_shares(abnormal[train], rows)\n")
