"""The docs and the committed results agree: every current table (top level of ``benchmarks/results/``)
and every study table (``benchmarks/results/studies/<study>/``) is cited by a page, every results file a
page cites exists, every generated section is what ``python -m benchmarks.tables --update-all`` would
write, and the pages name no internal tracker items."""
import glob
import os
import re

import pytest

from benchmarks import tables

from conftest import ROOT

RESULTS = os.path.join(ROOT, "benchmarks", "results")
STUDIES = os.path.join(RESULTS, "studies")
PAGES = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
GENERATED = re.compile(re.escape(tables.BEGIN_MARKER) + r"\n.*?^" + re.escape(tables.END_MARKER), re.S | re.M)
#: backquoted file names in the pages that are not results files (outputs a command writes, placeholders)
NOT_RESULTS = {"FLOPS.json", "FILE.json", "ratio.json", "profile.json", "penalties.json", "results.json",
               "speed_ratio_mask_predict.json", "valid_tune.json", "package.json"}


def _text(page, generated=False):
    with open(page, encoding="utf-8") as f:
        text = f.read()
    return text if generated else GENERATED.sub("", text)


def _cited_text():
    return "\n".join(_text(p) for p in PAGES)


def _all_results_files():
    return {os.path.basename(p) for p in glob.glob(os.path.join(RESULTS, "**", "*"), recursive=True)
            if os.path.isfile(p)}


def test_every_current_table_is_cited():
    text = _cited_text()
    entries = sorted(os.listdir(RESULTS))
    assert "mask_predict.json" in entries and "studies" in entries
    bad = []
    for name in entries:
        path = os.path.join(RESULTS, name)
        stem, ext = os.path.splitext(name)
        if os.path.isdir(path):
            if name != "studies" and not os.path.isfile(path + ".json"):
                bad.append(f"{name}/: neither a table's hypothesis folder nor studies/")
        elif ext == ".json":
            if name not in text:
                bad.append(f"{name}: no page cites it (move it to a study or remove it)")
        elif ext == ".png":
            if name not in text and stem + ".json" not in text:
                bad.append(f"{name}: neither it nor its table is cited")
        else:
            bad.append(f"{name}: unexpected file at the top level")
    assert not bad, "\n".join(bad)


def test_every_study_table_is_cited_and_has_its_page():
    text = _cited_text()
    folders = sorted(d for d in os.listdir(STUDIES) if os.path.isdir(os.path.join(STUDIES, d)))
    assert {"decoding_speed", "insertion_like_for_like"} <= set(folders)
    bad = []
    for study in folders:
        if not os.path.isfile(os.path.join(ROOT, "docs", "studies", study + ".md")):
            bad.append(f"studies/{study}/: no docs/studies/{study}.md")
        for path in glob.glob(os.path.join(STUDIES, study, "*.json")):
            if os.path.basename(path) not in text:
                bad.append(f"studies/{study}/{os.path.basename(path)}: no page cites it")
    assert not bad, "\n".join(bad)


def test_at_least_the_named_studies_have_a_dated_page():
    pages = {os.path.splitext(os.path.basename(p))[0]: p for p in glob.glob(os.path.join(ROOT, "docs", "studies", "*.md"))}
    for study in ("decoding_speed", "insertion_like_for_like", "fertility_aligner_leak", "cmlm_unk_loop",
                  "levt_rollin", "kermit_eos_penalty", "multilingual_kermit", "attention_speed_listops"):
        assert study in pages, study
        head = _text(pages[study]).splitlines()[0]
        assert head.startswith("# ") and re.search(r"\(20\d\d-\d\d-\d\d", head), head
        body = _text(pages[study])
        for part in ("**Question.**", "**Setup.**", "**Verdict.**", "**Reproduce.**"):
            assert part in body, f"{study}: {part}"


def test_every_cited_results_file_exists():
    known = _all_results_files()
    bad = []
    for page in PAGES:
        text = _text(page)
        rel = os.path.relpath(page, ROOT)
        for m in re.finditer(r"(?:\.\./)*(benchmarks/results/[\w./=,+-]*)", text):
            path = m.group(1).rstrip(".,")
            if re.search(r"[<*{$]|NAME|STUDY", text[m.start():m.end() + 1]):
                continue
            if not os.path.exists(os.path.join(ROOT, path)):
                bad.append(f"{rel}: {path} does not exist")
        for m in re.finditer(r"`([\w.-]+\.(?:json|png))`", text):
            name = m.group(1)
            if name not in known and name not in NOT_RESULTS:
                bad.append(f"{rel}: `{name}` is no committed results file")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("page,files,compact", tables.pages(), ids=lambda x: os.path.basename(x) if isinstance(x, str) else "")
def test_generated_results_sections_are_current(page, files, compact):
    text = _text(page, generated=True)
    expected = tables.replace_between_markers(
        text, tables.markdown_tables(files, link_dir=os.path.dirname(page), compact=compact))
    assert text == expected, f"{os.path.relpath(page, ROOT)}: run python -m benchmarks.tables --update-all"


def test_method_results_are_current():
    pages = tables.row_pages()
    assert os.path.join(ROOT, "docs", "nat.md") in pages
    for page in pages:
        text = _text(page, generated=True)
        assert tables.render_rows(text, os.path.dirname(page)) == text, \
            f"{os.path.relpath(page, ROOT)}: run python -m benchmarks.tables --update-all"


def test_pages_name_no_tracker_items_and_keep_their_sizes():
    bad = []
    for page in PAGES:
        text = _text(page, generated=True)
        for m in re.finditer(r"\bissues?[ -]?#?\d+|\bbars?\b|\bas asked\b|\bcourse notes\b", text, re.I):
            bad.append(f"{os.path.relpath(page, ROOT)}: {m.group(0)!r}")
    assert not bad, "\n".join(bad)
    size = {p: os.path.getsize(os.path.join(ROOT, p)) for p in ("docs/nat.md", "docs/benchmarks.md", "README.md")}
    assert size["docs/nat.md"] < 40_000 and size["docs/benchmarks.md"] < 30_000 and size["README.md"] < 15_000, size


def test_every_decoding_key_has_its_row_in_the_key_table():
    """Each key of ``evaluation/decoding.py`` (the ``decoding`` column of every table) is explained in
    docs/benchmarks.md's key table, and the table explains no key the parser does not know."""
    from fairseq_nat_ext.evaluation.decoding import KEYS

    text = _text(os.path.join(ROOT, "docs", "benchmarks.md"))
    section = text.split("## Decoding keys", 1)[1].split("\n## ", 1)[0]
    documented = set()
    for line in section.splitlines():
        m = re.match(r"\| ((?:`[a-z_]+=[^`]*`(?:, )?)+) \|", line)
        if m:
            documented |= set(re.findall(r"`([a-z_]+)=", m.group(1)))
    assert documented == set(KEYS), (sorted(set(KEYS) - documented), sorted(documented - set(KEYS)))
