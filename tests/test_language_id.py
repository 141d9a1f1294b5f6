"""Language identification of outputs (fairseq_nat_ext.evaluation.language_id), the harness option
``--language-check`` and the table columns.  Hand-written Multi30K-like captions; needs py3langid."""
import json
import os
import shutil

import pytest

pytest.importorskip("py3langid")

from fairseq_nat_ext.evaluation import language_id as li  # noqa: E402
from fairseq_nat_ext.evaluation import results as res  # noqa: E402
from fairseq_nat_ext.evaluation import run  # noqa: E402

from benchmarks import tables  # noqa: E402

LANGS = ["en", "de", "fr"]
CAPTIONS = {
    "en": [
        "A man in a blue shirt is standing on a ladder.",
        "Two young children are playing with a dog in the park.",
        "A woman with a red umbrella walks down a busy street.",
        "A group of people are sitting around a table outside a restaurant.",
        "A little girl in a pink dress is jumping on the grass.",
    ],
    "de": [
        "Ein Mann in einem blauen Hemd steht auf einer Leiter.",
        "Zwei kleine Kinder spielen mit einem Hund im Park.",
        "Eine Frau mit einem roten Regenschirm geht eine belebte Straße entlang.",
        "Eine Gruppe von Menschen sitzt an einem Tisch vor einem Restaurant.",
        "Ein kleines Mädchen in einem rosa Kleid springt auf dem Rasen.",
    ],
    "fr": [
        "Un homme en chemise bleue se tient sur une échelle.",
        "Deux jeunes enfants jouent avec un chien dans le parc.",
        "Une femme avec un parapluie rouge marche dans une rue animée.",
        "Un groupe de personnes est assis autour d'une table devant un restaurant.",
        "Une petite fille en robe rose saute sur la pelouse.",
    ],
}
MIXED_DE_FR = "Ein Mann in einem blauen Hemd steht se tient sur une échelle dans le parc."
MIXED = [
    MIXED_DE_FR,
    "Zwei kleine Kinder spielen mit einem Hund avec un chien dans le parc.",
    "Une femme avec un parapluie rouge geht eine belebte Straße entlang.",
    "A woman with a red umbrella geht eine belebte Straße entlang.",
]


@pytest.mark.parametrize("lang", LANGS)
def test_pure_captions_identified_and_not_mixed(lang):
    ids = li.identify(CAPTIONS[lang], LANGS)
    assert [lang_ for lang_, _ in ids] == [lang] * len(CAPTIONS[lang])
    assert all(0.5 < p <= 1.0 for _, p in ids)
    rates = li.language_rates(CAPTIONS[lang], lang, LANGS)
    assert rates["wrong_language_rate"] == 0.0 and rates["mixed_language_rate"] == 0.0
    assert rates["languages"][lang] == len(CAPTIONS[lang]) and rates["unidentified"] == 0


def test_mixed_sentences_are_flagged():
    analysed = li.analyse(MIXED, LANGS)
    assert all(a.mixed for a in analysed), analysed
    first = analysed[0]
    assert first.window_langs == ("de", "fr")
    rates = li.language_rates(MIXED + CAPTIONS["de"][:4], "de", LANGS)
    assert rates["mixed_language"] == 4 and rates["mixed_language_rate"] == pytest.approx(0.5)


def test_wrong_language_rate_of_a_known_mixture():
    lines = CAPTIONS["de"] + CAPTIONS["fr"][:3] + CAPTIONS["en"][:2]  # 5 right, 5 wrong
    rates = li.language_rates(lines, "de", LANGS)
    assert rates["wrong_language"] == 5 and rates["wrong_language_rate"] == pytest.approx(0.5)
    assert rates["mixed_language_rate"] == 0.0
    assert rates["languages"] == {"en": 2, "de": 5, "fr": 3}
    fr = li.language_rates(lines, "fr", LANGS)
    assert fr["wrong_language_rate"] == pytest.approx(0.7)


def test_unidentified_lines_count_in_the_denominator_only():
    lines = CAPTIONS["de"][:2] + ["", "12 , 3 ."] + CAPTIONS["fr"][:1] + ["Hund"]
    assert li.identify(["", "..."], LANGS) == [(None, 0.0), (None, 0.0)]
    rates = li.language_rates(lines, "de", LANGS)
    assert rates["sentences"] == 6 and rates["unidentified"] == 2
    assert rates["wrong_language"] == 1 and rates["wrong_language_rate"] == pytest.approx(1 / 6)
    assert not li.analyse(["Hund Katze Maus"], LANGS)[0].mixed  # shorter than a window: never mixed
    assert li.language_rates([], "de", LANGS)["wrong_language_rate"] == 0.0


def test_restricted_identifier_leaves_the_global_one_alone():
    import py3langid

    assert li.identifier(LANGS).nb_classes == ["de", "en", "fr"]
    assert li.identifier(["fr", "de", "en"]) is li.identifier(LANGS)  # cached per language set
    assert len(py3langid.langid._get_identifier().nb_classes) > 50


@pytest.mark.parametrize("text, message", [("en", "at least two"), ("en,,de", "commas"),
                                           ("en,de,en", "twice")])
def test_parse_langs_rejects(text, message):
    with pytest.raises(ValueError, match=message):
        li.parse_langs(text)


def test_unknown_language_and_target_outside_candidates():
    with pytest.raises(ValueError, match="xx unknown to py3langid"):
        li.identifier(["en", "xx"])
    with pytest.raises(ValueError, match="not among the candidates"):
        li.language_rates(["a"], "cs", LANGS)


def test_cli_prints_rates_as_json(tmp_path, capsys):
    path = tmp_path / "hyps.de"
    path.write_text("\n".join(CAPTIONS["de"] + [CAPTIONS["fr"][0], MIXED_DE_FR]) + "\n", encoding="utf-8")
    assert li.main(["--langs", "en,de,fr", "--target", "de", "--flagged", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    # the mixed line has more French than German: it is wrong-language too
    assert out["sentences"] == 7 and out["wrong_language"] == 2 and out["mixed_language"] == 1
    assert out["wrong_language_rate"] == pytest.approx(2 / 7)
    assert out["flagged"][1]["window_langs"] == ["de", "fr"]
    assert [f["line"] for f in out["flagged"]] == [6, 7]
    assert li.main(["--langs", "en,fr", "--target", "de", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--target de" in err


def test_a_thousand_sentences_of_three_languages():
    """A benchmark-sized input (no timing here: tests are not benchmarks): 334 German of 1,000 lines,
    so 666 are in the wrong language for target de."""
    lines = [CAPTIONS[lang][i % 5].replace(".", f" {i}.") for i in range(334) for lang in LANGS][:1000]
    rates = li.language_rates(lines, "de", LANGS)
    assert rates["sentences"] == 1000
    n_de = sum(1 for i in range(1000) if LANGS[i % len(LANGS)] == "de")
    assert rates["wrong_language"] == 1000 - n_de


# ---- schema, harness, tables -------------------------------------------------------------------
def _row(**kw):
    row = res.make_row("mask_predict", "iter=10", False, 30, 30, 1, 1, 1, 0.01, 1, 1, "x.txt",
                       language_rates={"wrong_language_rate": 0.0125, "mixed_language_rate": 0.003})
    row.update(kw)
    return row


def test_schema_accepts_both_rates_or_neither():
    row = _row()
    assert row["wrong_language_rate"] == 0.0125 and res.validate_row(row) == []
    plain = {k: v for k, v in row.items() if k not in res.OPTIONAL_ROW_FIELDS}
    assert res.validate_row(plain) == []
    one = dict(plain, wrong_language_rate=0.1)
    assert any("without 'mixed_language_rate'" in e for e in res.validate_row(one))
    assert any("outside" in e for e in res.validate_row(_row(mixed_language_rate=1.5)))
    assert any("expected float" in e for e in res.validate_row(_row(wrong_language_rate="0.1")))
    with pytest.raises(res.ResultsSchemaError):
        res.make_row("m", "beam=5", False, 1, 1, 1, 1, 1, 0, 0, 0, "x.txt",
                     language_rates={"wrong_language_rate": 2.0, "mixed_language_rate": 0.0})


def _results(rows):
    r = res.new_results("multi", "data", "cpu", 2, "cmd", "sig")
    r["rows"] = rows
    return r


def test_tables_show_language_columns_only_when_a_row_has_them(tmp_path):
    ref = res.make_row(res.REFERENCE_SYSTEM, res.REFERENCE_DECODING, False, 100, 100, 0, 0, 0, 0.002, 0, 0,
                       "ref.de", language_rates={"wrong_language_rate": 0.001, "mixed_language_rate": 0.0})
    plain = {k: v for k, v in _row(decoding="iter=4").items() if k not in res.OPTIONAL_ROW_FIELDS}
    text = tables.markdown_table(_results([_row(), plain, ref]))
    header = [line for line in text.splitlines() if line.startswith("| system")][0]
    assert "| repeat rate (%) | wrong language (%) | mixed language (%) | train updates |" in header
    rule = [line for line in text.splitlines() if line.startswith("| ---")][0]
    assert rule.count("|") == header.count("|")
    assert "| 1.00 | 1.25 | 0.30 | 1 |" in text
    assert "| 1.00 | – | – | 1 |" in text  # a row measured without --language-check
    assert "| `reference` | – | no | – | – | – | – | – | 0.20 | 0.10 | 0.00 | – |" in text
    without = tables.markdown_table(_results([plain]))
    assert "language" not in without and without.count("|") == 3 * (len(tables.COLUMNS) + 1)


def test_reference_row_gets_language_rates(tmp_path, capsys):
    ref = tmp_path / "ref.de"
    ref.write_text("\n".join(CAPTIONS["de"] + [CAPTIONS["en"][0]]) + "\n", encoding="utf-8")
    out = tmp_path / "results" / "multi.json"
    base = ["--benchmark", "multi", "--raw-ref", str(ref), "--tgt-lang", "de", "--out", str(out),
            "--reference-row"]
    assert run.main(base + ["--language-check", "en,de,fr"]) == 0
    row = res.load_results(out)["rows"][0]
    assert row["wrong_language_rate"] == pytest.approx(1 / 6, abs=1e-6) and row["mixed_language_rate"] == 0.0
    assert run.main(base) == 0  # without the option the row is replaced by one without the rates
    assert "wrong_language_rate" not in res.load_results(out)["rows"][0]
    for bad, message in (("en,fr", "--tgt-lang de is not among"), ("en,de,xx", "xx unknown"), ("de", "two")):
        with pytest.raises(SystemExit):
            run.main(base + ["--language-check", bad])
        assert message in capsys.readouterr().err


def _as_en_de(toy_bin, dest):
    """The toy data-bin (src -> tgt) under the language names en -> de (same dictionaries)."""
    dest.mkdir()
    for name in os.listdir(toy_bin):
        if not os.path.isfile(os.path.join(toy_bin, name)):
            continue  # other tests add folders (e.g. fertility/) to the shared toy data-bin
        new = name.replace("src-tgt", "en-de").replace(".src.", ".en.").replace(".tgt.", ".de.")
        shutil.copy(os.path.join(toy_bin, name), dest / new)
    return dest


def test_harness_writes_language_rates_into_system_rows(tiny_checkpoints, toy_databin, tmp_path):
    """A tiny toy model (its outputs are no language): the row holds language_rates of its hypothesis file."""
    data_bin = _as_en_de(toy_databin[0], tmp_path / "bin")
    ref = tmp_path / "ref.de"
    ref.write_text("\n".join(CAPTIONS["de"]) + "\n", encoding="utf-8")
    out = tmp_path / "results" / "multi.json"
    ckpt = tiny_checkpoints("mask_predict")
    assert run.main(["--benchmark", "multi", "--data-bin", str(data_bin), "--raw-ref", str(ref),
                     "--src-lang", "en", "--tgt-lang", "de", "--system-ckpt", str(ckpt),
                     "--decoding", "iter=2", "--train-wall-s", "1", "--threads", "2", "--limit", "5",
                     "--latency-sentences", "2", "--warmup-sentences", "0", "--reference-row",
                     "--language-check", "en,de,fr", "--out", str(out)]) == 0
    rows = {r["system"]: r for r in res.load_results(out)["rows"]}
    assert set(rows) == {"mask_predict_tiny", "reference"}
    system = rows["mask_predict_tiny"]
    hyp_file = res.hyp_path(str(out), "multi", "mask_predict_tiny", "iter=2", False)
    hyps = open(hyp_file, encoding="utf-8").read().splitlines()
    assert len(hyps) == 5
    expected = li.language_rates(hyps, "de", LANGS)
    assert system["wrong_language_rate"] == pytest.approx(expected["wrong_language_rate"], abs=1e-6)
    assert system["mixed_language_rate"] == pytest.approx(expected["mixed_language_rate"], abs=1e-6)
    assert rows["reference"]["wrong_language_rate"] == 0.0
