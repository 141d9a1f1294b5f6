"""fairseq's own ``tests/test_reproducibility.py`` and ``tests/test_checkpoint_utils.py`` (MIT, the shared
unchanged copies in ``../shared/peer-tests/fairseq/``) pass with the plugin imported: each file in a
pytest process of its own and both in one (their outcome must not depend on what else is collected).
Laid out as fairseq does (a ``tests`` package holding them, ``utils.py`` and ``test_binaries.py``), with
a conftest that imports the plugin as ``--user-dir`` does.  Only fairseq's own GPU skips are accepted.
"""
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow  # three pytest processes of tiny fairseq trainings: about a minute

PEER_DIR = os.path.join(os.path.dirname(ROOT), "shared", "peer-tests", "fairseq")
FILES = ("test_reproducibility.py", "test_checkpoint_utils.py")
GPU_SKIP = "test requires a GPU"
CONFTEST = "import sys\nsys.path.insert(0, {root!r})\nimport fairseq_nat_ext  # noqa: E402,F401\n"


def _run(work, files, name):
    junit = work / f"{name}.xml"
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *[f"tests/{f}" for f in files], "--junitxml", str(junit)],
                          cwd=work, env=env, capture_output=True, text=True, timeout=1200)
    assert junit.is_file(), f"fairseq's tests did not run ({proc.returncode}):\n{proc.stdout[-3000:]}"
    results = {}
    for case in ET.parse(junit).iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome, message = child.tag, (child.get("message") or child.text or "").strip()
        results[f"{case.get('classname')}::{case.get('name')}"] = (outcome, message)
    return results


@pytest.fixture(scope="module")
def peer_work(tmp_path_factory):
    if not all(os.path.isfile(os.path.join(PEER_DIR, f)) for f in FILES + ("test_binaries.py", "utils.py")):
        pytest.skip(f"fairseq's own tests are not here ({PEER_DIR} absent: a clone without ../shared)")
    work = tmp_path_factory.mktemp("fairseq_peer_resume")
    (work / "tests").mkdir()
    (work / "tests" / "__init__.py").write_text("")
    for f in FILES + ("test_binaries.py", "utils.py"):
        shutil.copy(os.path.join(PEER_DIR, f), work / "tests" / f)
    (work / "conftest.py").write_text(CONFTEST.format(root=ROOT))
    return work


@pytest.mark.parametrize("files", [(FILES[0],), (FILES[1],), FILES], ids=["reproducibility", "checkpoint_utils", "both"])
def test_fairseq_resume_tests_pass_with_the_plugin(peer_work, files):
    results = _run(peer_work, files, "_".join(f[:-3] for f in files))
    for f in files:
        assert any(name.startswith(f"tests.{f[:-3]}.") for name in results), f"{f}: nothing collected"
    bad = {n: r for n, r in results.items() if r[0] != "passed" and not (r[0] == "skipped" and GPU_SKIP in r[1])}
    assert not bad, {n: (o, m[:1500]) for n, (o, m) in bad.items()}
    assert any(n.endswith("::test_reproducibility") and r[0] == "passed" for n, r in results.items()) \
        or FILES[0] not in files
