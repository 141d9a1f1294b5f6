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


# ---- file names say what they register (docs/layout.md) -------------------------------------------------

def _plugin_registries():
    """The plugin's entries of fairseq's registries: criterions, models, archs (arch -> model class), tasks."""
    import fairseq_nat_ext  # noqa: F401  (registers everything)
    from fairseq.criterions import CRITERION_REGISTRY
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY
    from fairseq.tasks import TASK_REGISTRY

    def ours(registry):
        return {name: cls for name, cls in registry.items() if cls.__module__.startswith("fairseq_nat_ext.")}

    return ours(CRITERION_REGISTRY), ours(MODEL_REGISTRY), ours(ARCH_MODEL_REGISTRY), ours(TASK_REGISTRY)


def _stem(module_name, package):
    prefix = f"fairseq_nat_ext.{package}."
    return module_name[len(prefix):] if module_name.startswith(prefix) and "." not in module_name[len(prefix):] \
        else None


def test_every_criterion_is_registered_in_the_file_of_its_name():
    criterions, _, _, _ = _plugin_registries()
    assert {"ctc_nat_loss", "nat_fertility_loss", "iterative_refinement_loss", "pointer_cross_entropy"} <= set(criterions)
    bad = [f"--criterion {name} is registered in {cls.__module__}, not fairseq_nat_ext.criterions.{name}"
           for name, cls in criterions.items() if cls.__module__ != f"fairseq_nat_ext.criterions.{name}"]
    assert not bad, "\n".join(bad)


def test_the_one_pass_nats_are_registered():
    criterions, models, archs, _ = _plugin_registries()
    assert {"dag_loss", "glat_loss", "ctc_nat_loss"} <= set(criterions)
    assert {"da_transformer", "glat", "ctc_nat"} <= set(models)
    assert {"da_transformer", "da_transformer_small", "da_transformer_tiny", "glat", "glat_small",
            "glat_tiny"} <= set(archs)
    from fairseq.criterions import CRITERION_DATACLASS_REGISTRY

    for name in ("ctc_nat_loss", "glat_loss", "dag_loss"):  # glancing: --glat-ratio-start/-end
        assert {"glat_ratio_start", "glat_ratio_end"} <= set(CRITERION_DATACLASS_REGISTRY[name].__dataclass_fields__)


def _generator_classes():
    """{module stem: [generator classes defined there]} for every module of fairseq_nat_ext/generators/
    (a generator: a class with ``generate``)."""
    import importlib
    import inspect

    found = {}
    for path in sorted((PACKAGE / "generators").glob("*.py")):
        if path.stem == "__init__":
            continue
        module = importlib.import_module(f"fairseq_nat_ext.generators.{path.stem}")
        found[path.stem] = [obj for obj in vars(module).values() if inspect.isclass(obj)
                            and obj.__module__ == module.__name__ and callable(getattr(obj, "generate", None))]
    return found


def test_every_generator_file_is_named_after_its_model_or_task():
    import inspect

    _, models, archs, tasks = _plugin_registries()
    names_of = {cls: {name} | {arch for arch, c in archs.items() if c is cls} for name, cls in models.items()}
    # the generator each model names (``generator_class`` is a property that only imports and returns a class)
    named_by_model = {}
    for cls, names in names_of.items():
        prop = inspect.getattr_static(cls, "generator_class", None)
        if prop is not None:
            gen = prop.fget(None) if isinstance(prop, property) else prop
            named_by_model.setdefault(gen, set()).update(names)
    assert len(named_by_model) >= 7, named_by_model
    bad = []
    for gen, names in named_by_model.items():
        stem = _stem(gen.__module__, "generators")
        if stem not in names | set(tasks):
            bad.append(f"{gen.__name__} (generator of {sorted(names)}) lives in {gen.__module__}")
    generators = _generator_classes()
    assert {"levenshtein", "insertion", "pointer_geometry", "kermit"} <= {s for s, g in generators.items() if g}
    for stem, classes in generators.items():
        for gen in classes:
            if stem in tasks and gen.__name__ in inspect.getsource(tasks[stem].build_generator):
                continue  # the generator the task builds (e.g. one shared by every arch of the task)
            if gen in named_by_model and stem in named_by_model[gen]:
                continue
            bad.append(f"generators/{stem}.py holds {gen.__name__}, which neither a model named {stem} names "
                       f"as generator_class nor a task named {stem} builds")
    assert not bad, "\n".join(bad)
