"""Packaging: metadata (version, runtime dependencies, extras, console scripts), the user directory from
anywhere (``python -m fairseq_nat_ext --user-dir``), and the one-line error without a usable fairseq."""
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, cli_env, run_cli

RUNTIME = ("torch", "numpy", "sacrebleu", "sacremoses", "omegaconf", "hydra-core", "regex", "tqdm")
EXTRAS = {"aligner": ("eflomal",), "pointer": ("elkai", "scipy"), "bpe": ("fastbpe",),
          "benchmarks": ("matplotlib",), "test": ("pytest", "hypothesis")}


def _version_tuple(text):
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def _distribution():
    import importlib.metadata as md

    try:
        return md.distribution("fairseq_nat_ext")
    except md.PackageNotFoundError:
        pytest.skip("fairseq_nat_ext is not installed (pip install -e .)")


def _req_name(req):
    return re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].strip().lower().replace("_", "-")


def test_setup_py_version_is_the_package_version():
    out = subprocess.run([sys.executable, "setup.py", "--version"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    version = out.stdout.strip().splitlines()[-1]
    from fairseq_nat_ext.version import __version__

    assert version == __version__
    assert _version_tuple(version) >= (0, 2, 0)


def test_installed_metadata_declares_dependencies_extras_and_scripts():
    dist = _distribution()
    assert _version_tuple(dist.version) >= (0, 2, 0)
    requires = dist.requires or []
    plain = {_req_name(r) for r in requires if "extra ==" not in r}
    assert set(RUNTIME) <= plain, f"missing runtime dependencies: {set(RUNTIME) - plain}"
    assert not {"fairseq", "fairseq-fixed"} & plain, "fairseq must be checked at import, not required"
    for extra, names in EXTRAS.items():
        declared = {_req_name(r) for r in requires if re.search(rf"extra == ['\"]{extra}['\"]", r)}
        assert set(names) <= declared, f"extra {extra}: {declared}"
    assert dist.metadata["License"] == "MIT"
    assert "fairseq_nat_ext" in (dist.metadata.get_payload() or dist.metadata["Description"] or "")
    scripts = {ep.name: ep.value for ep in dist.entry_points if ep.group == "console_scripts"}
    assert scripts.get("fairseq-nat-translate") == "fairseq_nat_ext.evaluation.translate:cli_main"
    assert scripts.get("fairseq-nat-ext") == "fairseq_nat_ext.__main__:main"
    assert os.path.isfile(os.path.join(ROOT, "LICENSE")) and os.path.isfile(os.path.join(ROOT, "CHANGELOG.md"))


def test_version_and_user_dir_from_anywhere_then_fairseq_accepts_it(tmp_path):
    env = cli_env()
    env.pop("PYTHONPATH", None)
    version = subprocess.run([sys.executable, "-m", "fairseq_nat_ext", "--version"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120)
    assert version.returncode == 0, version.stderr[-2000:]
    import fairseq_nat_ext

    assert version.stdout.strip() == fairseq_nat_ext.__version__
    proc = run_cli(["fairseq-nat-ext", "--user-dir"], cwd=tmp_path)
    user_dir = proc.stdout.strip()
    assert os.path.isabs(user_dir) and os.path.isfile(os.path.join(user_dir, "__init__.py")), proc.stdout
    assert os.path.samefile(user_dir, os.path.dirname(fairseq_nat_ext.__file__))
    # fairseq-train knows the plugin's task, arch and criterion only through --user-dir
    proc = run_cli(["fairseq-train", "--user-dir", user_dir, "--task", "nat_translation",
                    "--arch", "mask_predict_small", "--criterion", "mask_predict_loss", "--help"],
                   cwd=tmp_path, timeout=120)
    assert "--length-loss-factor" in proc.stdout or "mask_predict_loss" in proc.stdout
    bare = run_cli(["fairseq-train", "--task", "nat_translation", "--help"], cwd=tmp_path, check=False,
                   timeout=120)
    assert bare.returncode != 0  # the check above is not vacuous


def _import_with_fake_fairseq(tmp_path, init_text):
    fake = tmp_path / "fake"
    (fake / "fairseq" / "models").mkdir(parents=True)
    (fake / "fairseq" / "__init__.py").write_text(init_text)
    (fake / "fairseq" / "models" / "__init__.py").write_text("def register_model_architecture(*a): pass\n")
    env = cli_env()
    env["PYTHONPATH"] = os.pathsep.join([str(fake), ROOT])
    return subprocess.run([sys.executable, "-c", "import fairseq_nat_ext"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("init_text, found", [
    ('__version__ = "0.10.2"\n', "found fairseq 0.10.2"),
    ('raise ValueError("mutable default <class \'x\'> for field y is not allowed")\n', "found ValueError"),
])
def test_unusable_fairseq_is_one_line_naming_the_builds_that_work(tmp_path, init_text, found):
    proc = _import_with_fake_fairseq(tmp_path, init_text)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: fairseq_nat_ext needs fairseq 0.12.x"), proc.stderr[-2000:]
    assert "fairseq-fixed==0.12.3.1" in last and "fairseq==0.12.2" in last and found in last
