"""Word-level highlighting of changed outputs in the HTML replay report."""

import json

from flink_agents_replay.replay import word_diff
from flink_agents_replay.replay.diff import compare
from flink_agents_replay.replay.word_diff import highlight_words, tokenize
from flink_agents_replay.storage.capture.records import CapturedInput, CapturedOutput, CapturedRun

OLD = "Thank you for reaching out. We have noted the issue."
NEW = "Thank you for reaching out. We are sorry for the issue."


def test_tokens_join_back_to_the_text():
    text = 'a  b\n\t"c-d" <e>&f_1 ünï'
    tokens = tokenize(text)
    assert "".join(tokens) == text
    assert tokens[:4] == ["a", "  ", "b", "\n\t"]
    assert tokens[4:9] == ['"', "c", "-", "d", '"']
    assert "f_1" in tokens and "ünï" in tokens


def test_changed_words_are_marked_on_each_side():
    assert highlight_words(OLD, NEW) == (
        "Thank you for reaching out. We <del>have noted</del> the issue.",
        "Thank you for reaching out. We <ins>are sorry for</ins> the issue.",
    )


def test_pure_insertions_and_deletions():
    assert highlight_words("x y", "x y z") == ("x y", "x y<ins> z</ins>")
    assert highlight_words("x y z", "x z") == ("x <del>y </del>z", "x z")
    assert highlight_words("", "new") == ("", "<ins>new</ins>")


def test_changed_and_unchanged_words_are_escaped():
    old, new = highlight_words('<script> & "a" fine', '<script> & "b" fine')
    assert old == "&lt;script&gt; &amp; &quot;<del>a</del>&quot; fine"
    assert new == "&lt;script&gt; &amp; &quot;<ins>b</ins>&quot; fine"
    old, new = highlight_words("keep it", "keep <script>alert(1)</script> & it")
    assert old == "keep it"
    assert new == "keep <ins>&lt;script&gt;alert(1)&lt;/script&gt; &amp; </ins>it"


def test_identical_texts_are_only_escaped():
    assert highlight_words("same <b> & text", "same <b> & text") == ("same &lt;b&gt; &amp; text",) * 2
    assert highlight_words("", "") == ("", "")


def test_a_huge_differing_middle_is_one_change(monkeypatch):
    monkeypatch.setattr(word_diff, "MAX_TOKEN_PAIRS", 4)
    assert highlight_words("start a b c end", "start c b a end") == (
        "start <del>a b c</del> end", "start <ins>c b a</ins> end")


def test_html_report_marks_the_changed_words_of_a_changed_run():
    def run(output):
        return CapturedRun("k", 1, "d", outputs=[CapturedOutput("ev", output)])

    report = compare([run(OLD)], [run(NEW)], [CapturedInput("k", 1, None, {}, "d")])
    page = report.render_html()
    assert page.count("We <del>have noted</del> the issue.") == 2  # differing runs, and runs by key
    assert page.count("We <ins>are sorry for</ins> the issue.") == 2
    assert "del {" in page and "ins {" in page  # styled
    assert report.render_text().count("<del>") == 0  # the text report is unchanged


def test_html_report_leaves_equal_outputs_unmarked():
    run = CapturedRun("k", 1, "d", outputs=[CapturedOutput("ev", {"reply": OLD})])
    page = compare([run], [run], [CapturedInput("k", 1, None, {}, "d")]).render_html()
    assert "<del>" not in page and "<ins>" not in page
    assert json.dumps(OLD).replace('"', "&quot;") in page
