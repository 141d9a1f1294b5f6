"""Every committed Multi30K results row: its sacreBLEU recomputes from its committed hypotheses.

The harness scores hypotheses against the raw human reference named in the table's ``data`` line
(``../shared/data/multi30k/test_2016_flickr.<tgt>.gz``, the target language from the row's ``dir=``
key, German otherwise).  Here every row of every table (the current ones at the top level of
``benchmarks/results/``, the studies' under ``benchmarks/results/studies/<study>/``) is scored again from the ``.txt`` file it names, with
sacreBLEU's defaults and nothing of the harness, so an edited number or a replaced hypothesis file
shows up.  Tables of other data (the quick-start's synthetic corpus, pointer and attention tables)
are not covered.
"""
import glob
import gzip
import json
import os
import re

import pytest
import sacrebleu

from conftest import ROOT

RESULTS = os.path.join(ROOT, "benchmarks", "results")
#: every results table: the current ones (top level) and the studies' own
ALL_JSON = sorted(glob.glob(os.path.join(RESULTS, "*.json")) + glob.glob(os.path.join(RESULTS, "studies", "*", "*.json")))
MULTI30K_REF = "../shared/data/multi30k/test_2016_flickr."


def _multi30k_tables():
    out = []
    for path in ALL_JSON:
        with open(path) as f:
            table = json.load(f)
        if isinstance(table, dict) and MULTI30K_REF in table.get("data", ""):
            out.append(path)
    return out


TABLES = _multi30k_tables()


#: BLEU tables of other data, not covered here (the quick start's synthetic corpus: its own test)
OTHER_DATA = {"quickstart.json"}


def test_every_bleu_table_is_covered():
    """A table with BLEU rows is either a Multi30K table checked below or named in OTHER_DATA."""
    names = {os.path.basename(p) for p in TABLES}
    assert {"mask_predict.json", "edit_based.json", "multilingual.json", "fertility_trainvalid.json"} <= names
    for path in ALL_JSON:
        with open(path) as f:
            table = json.load(f)
        if isinstance(table, dict) and "sacrebleu_signature" in table:
            name = os.path.basename(path)
            assert name in names or name in OTHER_DATA, f"{name}: BLEU table of unknown data {table.get('data')!r}"


@pytest.mark.parametrize("path", TABLES, ids=os.path.basename)
def test_every_rows_bleu_recomputes_from_its_hypotheses(path, shared_data):
    with open(path) as f:
        table = json.load(f)
    refs = {}
    checked = 0
    for row in table["rows"]:
        if row["system"] == "reference":
            continue
        m = re.search(r"(?:^|,)dir=([a-z]+)-([a-z]+)(?:,|$)", row["decoding"])
        tgt = m.group(2) if m else "de"
        if tgt not in refs:
            with gzip.open(os.path.join(shared_data, "multi30k", f"test_2016_flickr.{tgt}.gz"), "rt",
                           encoding="utf-8") as f:
                refs[tgt] = [line.rstrip("\n") for line in f]
        with open(os.path.join(ROOT, row["hyp"]), encoding="utf-8") as f:
            hyps = [line.rstrip("\n") for line in f]
        assert len(hyps) == len(refs[tgt]), f"{row['hyp']}: {len(hyps)} lines, reference {len(refs[tgt])}"
        bleu = sacrebleu.corpus_bleu(hyps, [refs[tgt]]).score
        assert bleu == pytest.approx(row["bleu"], abs=0.01), f"{row['system']} {row['decoding']}"
        checked += 1
    assert checked > 0


#: tables whose rows may differ in training budget, and why (docs/studies/decoding_speed.md says so)
MIXED_BUDGETS = {
    "nat_speed.json": "decoding-speed table: each row compares with the same checkpoint in nat_speed_before",
    "nat_speed_before.json": "decoding-speed table: the same checkpoints as nat_speed, decoded by older code",
}


@pytest.mark.parametrize("path", TABLES, ids=os.path.basename)
def test_every_table_holds_one_budget_and_one_data_condition(path):
    """Rows other than the teacher's and the reference were trained with one budget and on one kind of
    targets (distilled or raw), so that no reader compares unlike rows.  The Imputer continues its CTC
    model (its budget is that model's plus its own updates): its rows are checked among themselves."""
    with open(path) as f:
        rows = [r for r in json.load(f)["rows"] if r["system"] not in ("reference", "fairseq:transformer")]
    assert len({r["distilled"] for r in rows}) <= 1, "rows trained on distilled and on raw targets"
    if os.path.basename(path) in MIXED_BUDGETS:
        return
    budgets = {r["train_updates"] for r in rows if r["system"] != "imputer"}
    assert len(budgets) <= 1, f"rows of several budgets: {sorted(budgets)}"
    assert len({r["train_updates"] for r in rows if r["system"] == "imputer"}) <= 1


@pytest.mark.parametrize("script,systems,hint", [
    ("edit_based.sh", "ins_bt kermit", "BENCHMARK_NAME=edit_based_kermit"),
    ("ctc_imputer.sh", "teacher ctc mp", "BENCHMARK_NAME=ctc_imputer_mask_predict"),
    ("fertility_refinement.sh", "teacher fert_aligner fert_aligner_raw", "BENCHMARK_NAME=fertility_refinement_raw"),
])
def test_benchmark_scripts_refuse_to_mix_budgets_or_data_in_one_table(script, systems, hint, tmp_path):
    """The scripts whose systems span two budgets or data conditions measure them only in separate
    tables: asked for both at once they stop before loading anything, naming the separate run."""
    import subprocess

    env = dict(os.environ, SYSTEMS=systems, OUT=str(tmp_path / "t.json"))
    p = subprocess.run(["bash", os.path.join(ROOT, "examples", "benchmark", script)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "mixes" in p.stderr and hint in p.stderr, p.stderr
    assert not (tmp_path / "t.json").exists()
