"""bench/compare_runs.py on hand-made records: the counts it reports per run and line."""

import json

import pytest


def _record(qid, method, ratio, kl, token_ids, greedy_em):
    return {"qid": qid, "method": method, "ratio": ratio, "kl": kl, "token_ids": token_ids, "greedy_em": greedy_em}


def _run(fusionrag_kls):
    """Two questions; Full Attention answers [1, 2, 3]; Full Reuse keeps q1's answer and loses q2's."""
    records = []
    for qid, fr_kl, fr_ids, kl in zip(("q1", "q2"), (0.2, 0.4), ([1, 2, 3], [1, 9, 9]), fusionrag_kls):
        records += [_record(qid, "full_attention", None, 0.0, [1, 2, 3], 1.0),
                    _record(qid, "full_reuse", None, fr_kl, fr_ids, float(fr_ids == [1, 2, 3])),
                    _record(qid, "fusionrag", 0.15, kl, [1, 2, 7], 0.0)]  # fmt: skip
    return records


@pytest.fixture
def compare_runs(load_script):
    return load_script("compare_runs.py")


def test_counts_harm_lost_answers_and_closer_further(compare_runs, tmp_path):
    base, other = tmp_path / "base", tmp_path / "other"
    for folder, kls in ((base, (0.1, 0.5)), (other, (0.05, 0.5))):
        folder.mkdir()
        (folder / "quality.json").write_text(json.dumps({"records": _run(kls)}))
    compare_runs.main([str(base), f"other={other}", "--lines", "fusionrag@0.15", "--out", str(tmp_path / "out")])
    rows = [line.split(" | ") for line in (tmp_path / "out" / "comparison.md").read_text().splitlines()
            if line.startswith("| run") or "fusionrag@0.15" in line]  # fmt: skip
    header, first, second = ([cell.strip("| ") for cell in row] for row in rows)
    first, second = dict(zip(header, first)), dict(zip(header, second))
    assert first["mean KL"] == "0.3000" and first["norm KL"] == "0.000"  # as far as Full Reuse on average
    assert first["> FR"] == "1" and first["FA answer lost vs FR"] == "1"  # q2 further; q1's answer lost
    assert first["first 1"] == "1.00" and first["first 4"] == "0.00" and first["greedy EM"] == "0.00"
    assert second["vs run 1: closer / further"] == "1 / 0" and first["vs run 1: closer / further"] == "-"


def test_a_partial_log_is_read_and_questions_missing_anywhere_are_left_out(compare_runs, tmp_path):
    lines = [json.dumps({"config": {}})] + [json.dumps(r) for r in _run((0.1, 0.5)) if r["qid"] == "q1"]
    (tmp_path / "quality.partial.jsonl").write_text("\n".join(lines) + '\n{"qid": "q2", "meth')  # a torn last line
    records = compare_runs.load(tmp_path)
    assert set(records[("fusionrag", 0.15)]) == {"q1"}
    assert compare_runs.common_questions({"a": records}, [("fusionrag", 0.15)]) == ["q1"]
