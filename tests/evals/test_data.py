"""The shipped task data is well-formed and the task YAML renders with absolute, existing data paths."""

import json

import yaml

from kvbench.evals import build_data
from kvbench.evals.tasks import DATA_DIR, TASKS, corpus_text, render_tasks


def _jsonl(name):
    return [json.loads(line) for line in (DATA_DIR / name).read_text(encoding="utf-8").splitlines() if line.strip()]


def test_multiple_choice_items_have_four_distinct_choices_and_a_valid_label():
    items = _jsonl("plays_mc.jsonl")
    assert len(items) >= 100
    for item in items:
        assert len(set(item["choices"])) == 4
        assert 0 <= item["label"] < 4
        assert item["context"].count("\n") == 3


def test_cloze_targets_are_single_words_cut_from_the_end_of_the_context():
    items = _jsonl("britannica_cloze.jsonl")
    assert len(items) >= 100
    assert all(item["target"].isalpha() and len(item["target"]) >= 4 for item in items)
    assert all(not item["context"].endswith(item["target"]) for item in items)


def test_perplexity_corpus_is_the_britannica_article():
    text = corpus_text()
    assert text.startswith("Shakespeare, William (1564\u20131616), English poet")
    assert len(text) > 100_000


def test_rendered_tasks_point_at_the_shipped_files(tmp_path):
    folder = render_tasks(list(TASKS), tmp_path)
    for name in TASKS:
        config = yaml.safe_load((folder / f"{name}.yaml").read_text())
        assert config["task"] == name
        for path in config["dataset_kwargs"]["data_files"].values():
            assert path.startswith("/") and (DATA_DIR / path.rsplit("/", 1)[1]).is_file()


def test_britannica_cleaning_drops_scan_markers_and_joins_hyphenated_words():
    raw = "### START: x ###\n#### Source: y\n\np.772:0\n\nShakespeare was baptized in the parish of Strat-\nford and was a glover--so to speak--of renown in the town of his birth.\n"
    [paragraph] = build_data.clean_britannica(raw)
    assert paragraph == (
        "Shakespeare was baptized in the parish of Stratford and was a glover\u2013so to "
        "speak\u2013of renown in the town of his birth."
    )


def test_play_lines_drop_directions_and_speaker_tags():
    text = "ACT I. SCENE 1.\nHam.\nTo be, or not to be, that is the question:\n[Exit Ghost and all the rest.]\nEnter Horatio and Marcellus now.\nHam. Whether 'tis nobler in the mind to suffer\n"
    assert build_data.play_lines(text) == [
        "To be, or not to be, that is the question:",
        "Whether 'tis nobler in the mind to suffer",
    ]
