"""The checkout the benchmarks run from, another commit's tree beside it (`--before REV`), and a benchmark module run
in a child process against either one's sluice."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worktree(rev: str) -> tuple[Path, Path]:
    """A git worktree of `rev` in a fresh folder, and the folder its sluice imports from (its src/, or the tree
    itself when `rev` predates the src/ layout). Remove it with `remove_worktree`."""
    tree = Path(tempfile.mkdtemp(prefix="sluice-before-"))
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), rev], check=True)
    importable = tree / "src" if (tree / "src").is_dir() else tree
    # Spark's Python workers import every top-level pyspark_* module on their path to find data sources, and one
    # failed import fails them all. The checkout stays on that path (the editable install), and its modules for
    # connectors `rev` lacks would import them from `rev`'s sluice: an empty module of the same name in the tree,
    # which comes first on the path, is found instead.
    for module in (ROOT / "src").glob("pyspark_*.py"):
        if not (importable / module.name).exists():
            (importable / module.name).write_text(f"# {module.stem} does not exist at {rev}: this stands in for the "
                                                  "checkout's module.\n")
    return tree, importable


def remove_worktree(tree: Path) -> None:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=True)


def module_command(module: str, *args: str, python: str = sys.executable) -> list[str]:
    """`python -m module args`: run with cwd=ROOT (the `bench` package is found from the checkout's root)."""
    return [python, "-m", module, *args]


def child_env(sluice_from: Path | None = None, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a benchmark's child process: with `sluice_from`, that folder's sluice is imported (by the
    child and its Spark workers, which inherit PYTHONPATH) instead of the installed one."""
    out = dict(os.environ if env is None else env)
    if sluice_from is not None:
        out["PYTHONPATH"] = str(sluice_from)
    return out
