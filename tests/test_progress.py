"""Progress lines of the long data steps (fairseq_nat_ext/data/progress.py and its users)."""
import io
import os
import subprocess
import sys

from conftest import PLUGIN_DIR, ROOT, cli_env


def test_progress_prints_tenths_interval_and_a_final_line_with_the_rate():
    from fairseq_nat_ext.data.progress import Progress

    out = io.StringIO()
    p = Progress("job", 50, stream=out, min_gap=0)
    for _ in range(50):
        p.update()
    p.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[job] 5 / 50 sentences (10%, ") and lines[0].endswith(" sent/s)")
    assert len(lines) == 10 and lines[-1].startswith("[job] 50 / 50 sentences in ")
    quick = io.StringIO()
    p = Progress("quick", 1000, stream=quick)  # a step done in well under 2 s prints its last line only
    p.update(1000)
    p.close()
    assert len(quick.getvalue().splitlines()) == 1
    slow = io.StringIO()
    p = Progress("slow", 10 ** 9, stream=slow, interval=0.0)  # PROGRESS_INTERVAL elapsed: a line each update
    p.update(1)
    p.update(1)
    assert len(slow.getvalue().splitlines()) == 2


def test_moses_tokenize_reports_sentences_done_total_and_rate(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("Hello, world!\nIt's a test.\n" * 1500)
    env = cli_env()
    env["PROGRESS_INTERVAL"] = "0.000001"
    proc = subprocess.run([sys.executable, os.path.join(PLUGIN_DIR, "data", "moses_tokenize.py"), "-j", "2",
                           "en", str(src), str(tmp_path / "a.tok"), "en", str(src), str(tmp_path / "b.tok")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "a.tok").read_text().splitlines()[:2] == ["Hello , world !", "It &apos;s a test ."]
    lines = [line for line in proc.stderr.splitlines() if " / 6000 sentences" in line]
    assert len(lines) >= 3 and lines[-1].startswith("[moses_tokenize] 6000 / 6000 sentences in "), proc.stderr


def test_progress_line_of_the_recipes():
    proc = subprocess.run(["bash", "-c", f"source {ROOT}/examples/lib/common.sh; progress_line distill 50 200 10; "
                           "progress_line distill 200 200 20 final; default_cores"],
                          capture_output=True, text=True, timeout=60)
    assert proc.stderr.splitlines() == ["[distill] 50 / 200 sentences (25%, 5.0 sent/s)",
                                        "[distill] 200 / 200 sentences in 20 s (100%, 10.0 sent/s)"]
    assert int(proc.stdout) == (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())


def test_synthetic_corpus_takes_the_directory_as_argument_or_option(tmp_path):
    from fairseq_nat_ext.data import synthetic_corpus

    assert synthetic_corpus.main([str(tmp_path / "a"), "--train", "5", "--valid", "2", "--test", "2"]) == 0
    assert synthetic_corpus.main(["--out", str(tmp_path / "b"), "--train", "5", "--valid", "2", "--test", "2"]) == 0
    for name in ("train.src", "test.tgt"):
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text()
