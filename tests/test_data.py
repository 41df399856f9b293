"""The dataset readers (``elastic_reset.data``): they import no model, and each split they cut is disjoint,
seeded and the size asked for. Synthetic files in a temporary folder, so these run without ../shared/data."""

from __future__ import annotations

import ast
import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from elastic_reset.data import imdb, preferences, translation
from elastic_reset.errors import ConfigError, DataFileError

DATA_PACKAGE = Path(imdb.__file__).parent
# Besides the standard library: the project's errors, numpy, and `datasets` (the online IMDB fallback, lazily).
ALLOWED = {"elastic_reset.errors", "numpy", "datasets"}
"""What a reader may import besides the standard library and the other readers of data/."""


def test_readers_import_only_the_standard_library_and_errors():
    wrong = []
    for path in sorted(DATA_PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            for name in names:
                if name.split(".")[0] not in sys.stdlib_module_names and name not in ALLOWED \
                        and name.split(".")[0] not in ALLOWED and name != "__future__" \
                        and not name.startswith("elastic_reset.data."):
                    wrong.append(f"{path.name} imports {name}")
    assert not wrong, "\n".join(wrong)


def test_importing_the_readers_loads_no_model_library():
    code = ("import sys; import elastic_reset.data.imdb, elastic_reset.data.translation, "
            "elastic_reset.data.preferences; "
            "print(sorted(m for m in ('transformers', 'tokenizers', 'peft', 'sacrebleu') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ------------------------------------------------------------------------------------------------------ IMDB
def write_imdb(folder: Path, n_train: int = 300, n_test: int = 700) -> Path:
    """Synthetic IMDB files as the real ones are laid out: all negative, then all positive, with ``<br />``."""
    (folder / "imdb").mkdir(parents=True)
    for split, n in (("train", n_train), ("test", n_test)):
        rows = [{"text": f"{split} review {i} was<br /><br />{'good' if i >= n // 2 else 'bad'}  and then some "
                         f"more words {i}", "label": int(i >= n // 2)} for i in range(n)]
        with gzip.open(folder / "imdb" / f"{split}.jsonl.gz", "wt", encoding="utf-8") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_reviews_are_cleaned_and_prompts_are_first_halves(tmp_path):
    rows = imdb.load_imdb(write_imdb(tmp_path), "train")
    assert rows[0] == ("train review 0 was bad and then some more words 0", 0)
    assert imdb.clean_review("a<br/>b <BR />  c\n d") == "a b c d"
    assert imdb.prompt_of("one two three four five") == "one two"
    assert imdb.prompt_of("one two three four five six seven eight", max_words=2) == "three four"


def test_task_splits_are_disjoint_seeded_and_sized(tmp_path):
    data_dir = write_imdb(tmp_path)
    a = imdb.task_splits(data_dir, seed=3, n_train=50, n_eval=40, n_reference=30, n_pretrain=20)
    assert (len(a.train_prompts), len(a.eval_prompts), len(a.reference_texts), len(a.pretrain_texts)) == \
        (50, 40, 30, 20)
    assert a == imdb.task_splits(data_dir, seed=3, n_train=50, n_eval=40, n_reference=30, n_pretrain=20)
    assert a != imdb.task_splits(data_dir, seed=4, n_train=50, n_eval=40, n_reference=30, n_pretrain=20)
    assert all(p.startswith("train ") for p in a.train_prompts)
    assert all(t.startswith("train ") for t in a.pretrain_texts)
    assert all(p.startswith("test ") for p in a.eval_prompts) and all(t.startswith("test ") for t in a.reference_texts)
    ids = {p.split(" ")[2] for p in a.eval_prompts}
    assert not ids & {t.split(" ")[2] for t in a.reference_texts}
    with pytest.raises(ConfigError, match=r"task.options.n_eval"):
        imdb.task_splits(data_dir, n_eval=0)
    with pytest.raises(ConfigError, match=r"task.options.max_prompt_words"):
        imdb.task_splits(data_dir, max_prompt_words=0)


def test_the_classifier_and_the_policy_read_their_own_parts(tmp_path):
    data_dir = write_imdb(tmp_path)
    train, test = imdb.classifier_split(data_dir, seed=0, n_train=100, n_test=50)
    assert (len(train), len(test)) == (100, 50) and 0.3 < sum(y for _, y in train) / 100 < 0.7
    assert (train, test) == imdb.classifier_split(data_dir, seed=0, n_train=100, n_test=50)
    texts, held_out = imdb.policy_texts(data_dir)
    assert texts == [t for t, _ in imdb.load_imdb(data_dir, "train")] and len(held_out) == imdb.POLICY_HELD_OUT
    # The held-out reviews are the end of the task's test shuffle: never a prompt or a reference text.
    task = imdb.task_splits(data_dir, n_eval=100, n_reference=100)
    used = {t.split(" ")[2] for t in task.eval_prompts + task.reference_texts}
    assert not used & {t.split(" ")[2] for t in held_out} and task.test_prompts == []  # no test prompts unless asked
    # Test prompts never reach into the held-out reviews: of 700, 500 are held out and 200 used above.
    assert imdb.task_splits(data_dir, n_eval=100, n_reference=100, n_test=50).test_prompts == []
    more = write_imdb(tmp_path / "more", n_test=900)
    task = imdb.task_splits(more, n_eval=100, n_reference=100, n_test=60)
    used = [t.split(" ")[2] for t in task.eval_prompts + task.reference_texts + task.test_prompts]
    assert len(task.test_prompts) == 60 and len(set(used)) == len(used) == 260  # three disjoint parts
    assert not set(used) & {t.split(" ")[2] for t in imdb.policy_texts(more)[1]}
    # A report set comes after the others, so adding it moves none of theirs.
    with_report = imdb.task_splits(more, n_eval=100, n_reference=100, n_test=60, n_report=40)
    assert (with_report.eval_prompts, with_report.reference_texts, with_report.test_prompts) == \
        (task.eval_prompts, task.reference_texts, task.test_prompts)
    used = [t.split(" ")[2] for t in with_report.eval_prompts + with_report.reference_texts
            + with_report.test_prompts + with_report.report_prompts + with_report.report_texts]
    assert len(with_report.report_prompts) == len(with_report.report_texts) == 40 and len(set(used)) == 340
    assert not set(used) & {t.split(" ")[2] for t in imdb.policy_texts(more)[1]}


def test_a_bad_imdb_file_is_named_with_its_line(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "imdb" / "test.jsonl.gz")):
        imdb.load_imdb(tmp_path, "test")
    (tmp_path / "imdb").mkdir()
    with gzip.open(tmp_path / "imdb" / "test.jsonl.gz", "wt") as f:
        f.write('{"text": "fine", "label": 1}\n{"text": "no label"}\n')
    with pytest.raises(DataFileError, match=r"test.jsonl.gz:2: expected a JSON object"):
        imdb.load_imdb(tmp_path, "test")
    with pytest.raises(ConfigError, match="split"):
        imdb.load_imdb(tmp_path, "val")


def test_labelled_texts_are_checked():
    imdb.check_labelled(["a", "b"], [0, 1], "x")
    with pytest.raises(ValueError, match="x: 2 texts but 1 labels"):
        imdb.check_labelled(["a", "b"], [0], "x")
    with pytest.raises(ValueError, match="labels must be 0"):
        imdb.check_labelled(["a"], [2], "x")
    with pytest.raises(ValueError, match="no examples"):
        imdb.check_labelled([], [], "x")


# --------------------------------------------------------------------------------------------------- Multi30k
def write_multi30k(folder: Path, n: int = 40, broken: dict[str, list[str]] | None = None) -> Path:
    (folder / "multi30k").mkdir(parents=True, exist_ok=True)
    for lang in translation.LANGS:
        lines = (broken or {}).get(lang, [f"{lang.upper()} Sentence {i}" for i in range(n)])
        with gzip.open(folder / "multi30k" / f"train.{lang}.gz", "wt", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    return folder


def test_multi30k_is_lowercased_aligned_and_split_in_two_disjoint_parts(tmp_path):
    train = translation.load_multi30k(write_multi30k(tmp_path), "train")
    assert train["fr"][:2] == ["fr sentence 0", "fr sentence 1"] and len(train["de"]) == 40
    part = translation.pretrain_part(train)
    pairs = translation.game_pairs(train)
    assert len(part["en"]) == len(pairs) == 20
    assert not {fr for fr, _ in pairs} & set(part["fr"])
    assert all(fr.split()[-1] == de.split()[-1] for fr, de in pairs)  # French and German of the same line


def test_a_broken_multi30k_file_is_named(tmp_path):
    lines = {lang: ["a", "b"] for lang in translation.LANGS}
    with pytest.raises(DataFileError, match="not aligned"):
        translation.load_multi30k(write_multi30k(tmp_path, broken={**lines, "de": ["a"]}), "train")
    with pytest.raises(DataFileError, match=r"train.en.gz:2: empty line"):
        translation.load_multi30k(write_multi30k(tmp_path, broken={**lines, "en": ["a", ""]}), "train")


# ------------------------------------------------------------------------------------------ preference pairs
def test_load_preferences_reads_files_and_named_sets(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"prompt": "p", "chosen": "a", "rejected": "b"}) + "\n")
    assert preferences.load_preferences([str(path), str(path)], None) == [preferences.PreferencePair("p", "a", "b")] * 2
    with pytest.raises(ConfigError, match="data_dir: 'hh-rlhf' is read from a data folder"):
        preferences.load_preferences(["hh-rlhf"], None)
    with pytest.raises(DataFileError, match="stack-exchange-paired"):
        preferences.load_preferences(["stack-exchange"], tmp_path)


def test_json_lines_name_the_file_and_line_of_a_bad_one():
    from elastic_reset.data.jsonl import json_objects
    from elastic_reset.errors import DataFileError

    assert list(json_objects(['{"a": 1}', "", '{"b": 2}'], "f.jsonl")) == [("f.jsonl:1", {"a": 1}),
                                                                           ("f.jsonl:3", {"b": 2})]
    with pytest.raises(DataFileError, match=r"^f\.jsonl:2: not valid JSON"):
        list(json_objects(['{"a": 1}', "{oops"], "f.jsonl"))
    with pytest.raises(DataFileError, match=r"^f\.jsonl:1: expected a JSON object, got list$"):
        list(json_objects(["[1, 2]"], "f.jsonl"))


def test_a_preference_file_that_is_not_utf8_or_not_gzip_is_one_line_naming_it(tmp_path):
    good = '{"prompt": "p", "chosen": "a", "rejected": "b"}\n'
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes((good * 3).encode() + '{"prompt": "café", "chosen": "a", "rejected": "b"}\n'.encode("latin-1"))
    with pytest.raises(DataFileError, match=r"latin.jsonl: not UTF-8 text after line \d+ .*save the file as UTF-8"):
        preferences.read_pairs(latin)
    fake = tmp_path / "pairs.jsonl.gz"
    fake.write_text(good)
    with pytest.raises(DataFileError, match=r"pairs.jsonl.gz: not a readable gzip file"):
        preferences.read_pairs(fake)
