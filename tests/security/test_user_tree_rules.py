"""The user-file boundary stays in one module: an AST check over mtc's own code (no
services). Outside mtc/userfs.py nothing chowns, and no file operation takes a path
built from a user's tree (a job's folders, a run's or a replica's directory): such a
path goes to mtc.userfs, which never follows a link a user left there. The audit hook
(tests/fsaudit.py) checks the same at run time over the whole suite."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ..apps import DJANGO_APPS

pytestmark = pytest.mark.security
REPO = Path(__file__).resolve().parents[2]
USERFS = REPO / "mtc" / "userfs.py"

CHOWNS = {("os", "chown"), ("os", "lchown"), ("os", "fchown"), ("shutil", "chown")}
# Where a path in a user's tree comes from: the functions that build one, the fields
# that store one, and the names mtc's code gives such paths.
SOURCE_CALLS = {
    "job_root",
    "cluster_job_dirs",
    "job_output_path",
    "replica_run_dir",
    "new_run_dir",
    "stacks_path",
    "own_dir",
}
SOURCE_ATTRS = {"checkpoint_dir", "run_dir", "metrics_path", "checkpoint_path"}
SOURCE_NAMES = {"run_dir", "checkpoint_dir", "work_dir", "output_dir", "step_dir", "own"}
# File operations: a call of these on (or with) such a path is the violation.
PATH_METHODS = {
    "open",
    "read_text",
    "write_text",
    "read_bytes",
    "write_bytes",
    "mkdir",
    "unlink",
    "rmdir",
    "rename",
    "replace",
    "touch",
    "chmod",
    "chown",
    "iterdir",
    "glob",
    "rglob",
    "stat",
    "lstat",
    "exists",
    "is_dir",
    "is_file",
    "symlink_to",
    "hardlink_to",
}
MODULE_FUNCS = {"os", "shutil", "os.path", "io", "tempfile"}
# os functions that take a descriptor, not a path.
FD_FUNCS = {"close", "read", "write", "fstat", "fchmod", "fdopen", "lseek", "fsync", "dup"}


def app_files() -> list[Path]:
    files = []
    for app in DJANGO_APPS:
        files += [p for p in (REPO / app).rglob("*.py") if "migrations" not in p.parts]
    return sorted(files)


def dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    return ""


def mentions(node: ast.AST, tainted: set[str]) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and (sub.id in tainted or sub.id in SOURCE_NAMES):
            return True
        if isinstance(sub, ast.Attribute) and sub.attr in SOURCE_ATTRS:
            return True
        if isinstance(sub, ast.Call):
            name = dotted(sub.func).rsplit(".", 1)[-1]
            if name in SOURCE_CALLS:
                return True
    return False


def targets(node: ast.AST) -> list[str]:
    return [n.id for n in ast.walk(node) if isinstance(n, ast.Name)]


def tainted_names(func: ast.AST) -> set[str]:
    """Names assigned (anywhere in the function) from a user-tree path, to a fixpoint."""
    tainted: set[str] = set()
    while True:
        before = len(tainted)
        for node in ast.walk(func):
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
                value = node.value
                if value is not None and mentions(value, tainted):
                    for target in getattr(node, "targets", None) or [node.target]:
                        tainted.update(targets(target))
            elif isinstance(node, (ast.For, ast.comprehension)) and mentions(node.iter, tainted):
                tainted.update(targets(node.target))
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                if mentions(node.context_expr, tainted):
                    tainted.update(targets(node.optional_vars))
        if len(tainted) == before:
            return tainted


def file_operation_on_user_path(call: ast.Call, tainted: set[str]) -> bool:
    func = call.func
    name = dotted(func)
    if name.startswith("userfs.") or name.startswith("mtc.userfs."):
        return False
    args = [*call.args, *(k.value for k in call.keywords)]
    if name == "open":
        return bool(call.args) and mentions(call.args[0], tainted)
    if isinstance(func, ast.Attribute):
        module = dotted(func.value)
        if module == "os" and func.attr in FD_FUNCS:
            return False
        if module in MODULE_FUNCS:
            return any(mentions(a, tainted) for a in args)
        if func.attr in PATH_METHODS:
            return mentions(func.value, tainted)
    return False


def violations(path: Path, source: str | None = None) -> list[str]:
    tree = ast.parse(path.read_text() if source is None else source, filename=str(path))
    rel = path.relative_to(REPO)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            pair = (dotted(node.func.value), node.func.attr)
            if pair in CHOWNS and path != USERFS:
                found.append(f"{rel}:{node.lineno}: {'.'.join(pair)}")
    if path == USERFS:
        return found
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        tainted = tainted_names(func)
        for node in ast.walk(func):
            if isinstance(node, ast.Call) and file_operation_on_user_path(node, tainted):
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)[:100]} in {func.name}()")
    return sorted(set(found))


def test_nothing_outside_userfs_chowns_or_opens_a_path_in_a_users_tree():
    found = [v for path in app_files() for v in violations(path)]
    assert not found, "go through mtc.userfs instead:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "code",
    [
        "def f(job):\n    open(job.metrics_path)\n",
        "def f(job):\n    d = Path(job.checkpoint_dir).parent\n    (d / 'x').write_text('1')\n",
        "def f(c, a):\n    root = job_root(c, a)\n    for p in root.iterdir():\n        p.stat()\n",
        "def f(run_dir):\n    os.chmod(run_dir, 0o700)\n",
        "def f(p):\n    os.chown(p, 1, 1)\n",
        "def f(e, n):\n    with open(replica_run_dir(e, n) / 'token', 'w') as fh:\n        pass\n",
    ],
)
def test_the_check_catches_each_way_a_path_reaches_a_file_operation(code):
    assert violations(REPO / "jobs" / "probe.py", code), code  # judged as app code


def test_userfs_calls_and_descriptors_are_not_violations():
    code = (
        "def f(job, run_dir):\n"
        "    userfs.read_at(job.metrics_path, offset=0, limit=1)\n"
        "    fd = userfs.create(run_dir / 'log', account=None)\n"
        "    os.close(fd)\n"
    )
    assert not violations(REPO / "jobs" / "probe.py", code)
