"""The installed package holds only what users run: nothing under fairseq_nat_ext/ imports the repository's
benchmark studies (top-level ``benchmarks/``, not installed), matplotlib, or the peer attention packages
the speed study compares against."""
import ast
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.attention_peers import PEERS

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "fairseq_nat_ext"
FORBIDDEN = {"benchmarks", "matplotlib"} | {module for module, _ in PEERS.values()}


def _imported_modules(tree):
    """(line, top-level module name) of every absolute import, and of importlib.import_module("x") /
    __import__("x") with a constant name."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module.split(".")[0]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in ("import_module", "__import__"):
                yield node.lineno, node.args[0].value.split(".")[0]


def test_forbidden_names_cover_every_peer():
    assert {"local_attention", "linformer", "performer_pytorch", "reformer_pytorch", "sinkhorn_transformer",
            "routing_transformer"} <= FORBIDDEN


def test_installed_package_imports_no_benchmark_plot_or_peer_module():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 50 and (PACKAGE / "evaluation" / "run.py") in files
    bad = []
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        bad += [f"{path.relative_to(REPO)}:{line}: imports {name}" for line, name in _imported_modules(tree)
                if name in FORBIDDEN]
    assert not bad, "\n".join(bad)


def test_no_benchmark_folder_inside_the_package():
    assert not (PACKAGE / "benchmark").exists()
    assert (REPO / "benchmarks" / "__init__.py").is_file()


def test_importing_the_package_and_its_evaluation_loads_no_matplotlib():
    evaluation = sorted(p.stem for p in (PACKAGE / "evaluation").glob("*.py") if p.stem != "__init__")
    code = (
        "import importlib, sys\n"
        "import fairseq_nat_ext\n"
        f"for m in {evaluation!r}:\n"
        "    importlib.import_module('fairseq_nat_ext.evaluation.' + m)\n"
        f"print(sorted(n for n in sys.modules if n.split('.')[0] in {sorted(FORBIDDEN)!r}))\n"
    )
    # run from the repository root, where `benchmarks` WOULD be importable: it must still not be imported
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout
