"""Text tool calls in the qwen3_coder form, inline thinking, and broken blocks."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.textcalls import ERROR_NAME, OPEN_PARAM, extract_text_calls, parse_tool_calls, split_think
from tests.conftest import sglang_case, sglang_case_names
from tests.doubles.openai_server import text_call
from worker.leaf.tools import coerce_arguments

EDIT = """<tool_call>
<function=Edit>
<parameter=file_path>
src/calc.py
</parameter>
<parameter=old_string>
return a - b
</parameter>
<parameter=new_string>
return a + b
</parameter>
</function>
</tool_call>"""


def test_leaf_example() -> None:
    [call] = parse_tool_calls(EDIT)
    assert call.error is None
    assert call.name == "Edit"
    assert call.arguments == {"file_path": "src/calc.py", "old_string": "return a - b", "new_string": "return a + b"}


def test_raw_values_lose_exactly_one_newline_each_side() -> None:
    text = (
        "<tool_call>\n<function=Write>\n<parameter=file_path>\na.py\n</parameter>\n"
        "<parameter=content>\n\n  x = 1\n\n\n</parameter>\n</function>\n</tool_call>"
    )
    [call] = parse_tool_calls(text)
    assert call.arguments["content"] == "\n  x = 1\n\n"
    inline = parse_tool_calls("<tool_call><function=Read><parameter=file_path>a.py</parameter></function></tool_call>")
    assert inline[0].arguments == {"file_path": "a.py"}


def test_several_blocks_and_surrounding_text() -> None:
    text = "Let me look.\n" + text_call("Read", file_path="a.py") + "\n"
    text += text_call("Bash", command="ls -la", timeout=30)
    calls = parse_tool_calls(text)
    assert [(c.name, c.arguments) for c in calls] == [
        ("Read", {"file_path": "a.py"}),
        ("Bash", {"command": "ls -la", "timeout": "30"}),
    ]


def test_value_may_contain_closing_tag_text() -> None:
    tricky = 'x = "</parameter>"\ny = "</function>"'
    text = text_call("Write", file_path="p.py", content=tricky)
    [call] = parse_tool_calls(text)
    assert call.error is None
    assert call.arguments["content"] == tricky


def test_think_split() -> None:
    assert split_think("<think>plan</think>answer") == ("plan", "answer")
    assert split_think("plan only</think>\nanswer") == ("plan only", "\nanswer")
    assert split_think("<think>cut short") == ("cut short", "")
    assert split_think("plain") == (None, "plain")


def test_inline_think_is_split_out_and_calls_found_after_it() -> None:
    parsed = extract_text_calls("<think>I should read a.py</think>\n" + text_call("Read", file_path="a.py"))
    assert parsed.inline_reasoning == "I should read a.py"
    assert [c.name for c in parsed.calls] == ["Read"]


def test_calls_are_read_from_the_visible_content_only() -> None:
    """A call written while thinking (inline <think>) is thought, not done: SGLang never runs it."""
    parsed = extract_text_calls("<think>Maybe " + text_call("Bash", command="rm -rf src") + "</think>\nAll done.")
    assert parsed.calls == []
    assert parsed.visible == "\nAll done."


def test_an_unclosed_think_ends_at_the_first_tool_call() -> None:
    # SGLang's qwen3 reasoning parser ends the thinking at <tool_call> when </think> is missing.
    parsed = extract_text_calls("<think>I need a.py\n" + text_call("Read", file_path="a.py"))
    assert parsed.inline_reasoning == "I need a.py\n"
    assert [(c.name, c.arguments) for c in parsed.calls] == [("Read", {"file_path": "a.py"})]
    assert split_think("<think>cut short, no call") == ("cut short, no call", "")


def test_prose_mentions_of_tags_are_not_calls() -> None:
    parsed = extract_text_calls("I could write <function=Read> or a <tool_call> here, but I am done.")
    assert parsed.calls == []


def test_a_real_call_after_prose_that_mentions_tool_call_is_found() -> None:
    text = "I will use <tool_call> tags now.\n" + text_call("Read", file_path="a.py")
    assert [(c.name, c.arguments, c.error) for c in parse_tool_calls(text)] == [("Read", {"file_path": "a.py"}, None)]
    bare = "Calling <function=Read> next.\n" + text_call("Glob", pattern="*.py")
    assert [(c.name, c.error) for c in parse_tool_calls(bare)] == [("Glob", None)]


def test_a_closed_prose_mention_beside_a_real_call_is_prose() -> None:
    """`Use <tool_call>...</tool_call> blocks.` once cost a spurious format error next to the call."""
    mention = "Use <tool_call>...</tool_call> blocks.\n"
    real = text_call("Read", file_path="a.py")
    for text in (mention + real, real + "\n" + mention, mention + mention + real):
        calls = parse_tool_calls(text)
        assert [(c.name, c.arguments, c.error) for c in calls] == [("Read", {"file_path": "a.py"}, None)]
    # A broken call the model meant is still answered, and the mention still adds nothing.
    broken = "<tool_call>\n<function=Read>\nfile_path=a.py\n</function>\n</tool_call>"
    [error] = parse_tool_calls(mention + broken)
    assert error.error is not None and "unexpected text" in error.error
    # Alone, the mention is all there is: answered, so an empty reply is never a final answer.
    [alone] = parse_tool_calls(mention)
    assert alone.error is not None and alone.error.startswith(f"{ERROR_NAME}: ")
    # A block with a <function= that is not at its start is a call gone wrong, not prose.
    [misplaced] = parse_tool_calls("<tool_call>\nnow <function=Read></function>\n</tool_call>\n" + real)[:1]
    assert misplaced.error is not None and "<function=NAME>" in misplaced.error


# textcalls.jsonl cases where SGLang's detector finds a <tool_call> and drops it whole: no
# <function= inside and no JSON (which this reader reads on purpose).
STRIPPED_BLOCKS = ["wrapper_without_function", "empty_tool_call_block"]


@pytest.mark.parametrize("stripped", STRIPPED_BLOCKS)
@pytest.mark.parametrize("real", ["read_simple", "two_calls", "text_before_after"])
def test_a_block_sglang_strips_adds_nothing_beside_real_calls(stripped: str, real: str) -> None:
    """Each <tool_call> block is read on its own, as SGLang reads it: a dropped one costs the
    reply's real calls nothing, before or after them."""
    dropped, kept = sglang_case("textcalls.jsonl", stripped), sglang_case("textcalls.jsonl", real)
    assert dropped["sglang"]["has_tool_call"] and dropped["sglang"]["calls"] == []
    assert "<function=" not in dropped["text"] and "{" not in dropped["text"]
    want = [(c["name"], c["arguments"]) for c in kept["sglang"]["calls"]]
    for text in (dropped["text"] + "\n" + kept["text"], kept["text"] + "\n" + dropped["text"]):
        calls = parse_tool_calls(text)
        assert [(c.name, coerce_arguments(c.name, c.arguments), c.error) for c in calls] == [
            (name, arguments, None) for name, arguments in want
        ]


def test_an_unclosed_parameter_ends_where_the_next_tag_starts_a_line() -> None:
    """The issue's case: without the rule Bash ran `ls\n<parameter=timeout>\n5`."""
    text = "<tool_call>\n<function=Bash>\n<parameter=command>\nls\n<parameter=timeout>\n5\n</parameter>\n" \
        "</function>\n</tool_call>"
    [call] = parse_tool_calls(text)
    assert (call.name, call.arguments, call.error) == ("Bash", {"command": "ls", "timeout": "5"}, None)
    last = "<tool_call>\n<function=Read>\n<parameter=file_path>\na.py\n</function>\n</tool_call>"
    assert parse_tool_calls(last)[0].arguments == {"file_path": "a.py"}


def test_tag_text_never_folds_into_a_value() -> None:
    """A <parameter= inside a value either ends an open parameter at a line start or makes the
    call a format error; it never reaches a command, a path or file content."""
    inline = "<tool_call>\n<function=Bash>\n<parameter=command>\nls <parameter=timeout>5</parameter>\n" \
        "</function>\n</tool_call>"
    code = '<tool_call>\n<function=Write>\n<parameter=file_path>\np.py\n</parameter>\n<parameter=content>\n' \
        'TAG = "<parameter=x>"\n</parameter>\n</function>\n</tool_call>'
    for text in (inline, code):
        [call] = parse_tool_calls(text)
        assert call.error is not None and "not closed" in call.error, call


def test_half_closed_blocks_become_errors_and_scanning_goes_on() -> None:
    broken = "<tool_call>\n<function=Read>\n<parameter=file_path>\na.py\n</tool_call>"
    calls = parse_tool_calls(broken + "\n" + text_call("Bash", command="ls"))
    assert calls[0].error is not None and calls[0].error.startswith(f"{ERROR_NAME}: ")
    assert "not closed" in calls[0].error
    assert (calls[1].name, calls[1].error) == ("Bash", None)


def test_missing_function_close_and_stray_text() -> None:
    [missing] = parse_tool_calls("<tool_call>\n<function=Read>\n<parameter=file_path>\na\n</parameter>\n")
    assert missing.error and "</function>" in missing.error
    [stray] = parse_tool_calls("<tool_call>\n<function=Read>\nfile_path=a\n</function>\n</tool_call>")
    assert stray.error and "unexpected text" in stray.error
    [nameless] = parse_tool_calls("<tool_call>\n<function=>\n</function>\n</tool_call>")
    assert nameless.error and "without a tool name" in nameless.error
    doubled = "<parameter=file_path>\nb\n</parameter>\n</function>"
    [twice] = parse_tool_calls(text_call("Read", file_path="a").replace("</function>", doubled))
    assert twice.error and "twice" in twice.error
    [bad_body] = parse_tool_calls("<tool_call>\nRead a.py please\n</tool_call>")
    assert bad_body.error and "<function=NAME>" in bad_body.error


def test_missing_tool_call_close_is_tolerated_when_the_function_is_whole() -> None:
    [call] = parse_tool_calls("<tool_call>\n<function=Read>\n<parameter=file_path>\na\n</parameter>\n</function>")
    assert (call.name, call.error) == ("Read", None)


def test_json_form_in_a_tool_call_block() -> None:
    json_call = '{"name": "Read", "arguments": {"file_path": "a.py", "limit": 3}}'
    [call] = parse_tool_calls(f"<tool_call>\n{json_call}\n</tool_call>")
    assert (call.name, call.arguments, call.typed) == ("Read", {"file_path": "a.py", "limit": 3}, True)
    [bad] = parse_tool_calls("<tool_call>\n{not json}\n</tool_call>")
    assert bad.error and "invalid" in bad.error


def test_prose_mention_of_tool_call_tag_is_not_a_call() -> None:
    assert parse_tool_calls("The model writes <tool_call> blocks when the parser is off.") == []


# Where this reader and SGLang's qwen3_coder detector part ways, on purpose; every other case of
# ../shared/fixtures/sglang/textcalls.jsonl must read exactly as SGLang reads it.
OURS_WHERE_SGLANG_DIFFERS: dict[str, list[tuple[str, Any]]] = {
    # Schema typing is tools.coerce_value's: yes/1/padded booleans, 3.0 as an integer, "null" kept.
    "bool_yes": [("Edit", {"file_path": "a", "old_string": "x", "new_string": "y", "replace_all": True})],
    "bool_1": [("Edit", {"file_path": "a", "old_string": "x", "new_string": "y", "replace_all": True})],
    "bool_spaced": [("Edit", {"file_path": "a", "old_string": "x", "new_string": "y", "replace_all": True})],
    "int_given_3_0": [("Read", {"file_path": "a", "offset": 3})],
    "null_string_param": [("Bash", {"command": "null"})],
    "null_int_param": [("Read", {"file_path": "a", "limit": "null"})],
    "unlisted_timeout_ms": [("Bash", {"command": "ls", "timeout_ms": 5000})],
    "inf_nan_numbers": [("Bash", {"command": "ls", "timeout": "-inf"})],  # the runner refuses it
    # A value may hold closing-tag text when its own </parameter> follows (SGLang cuts it short).
    "close_param_in_code": [("Write", {"file_path": "p.py", "content": 'END = "</parameter>"\nprint(END)'})],
    "close_param_at_line_end_in_code": [
        ("Write", {"file_path": "p.py", "content": 'END = """\n</parameter>\n"""\nx = 1'})],
    "close_function_in_code": [("Write", {"file_path": "p.py", "content": 'S = "</function>"\n'})],
    "close_toolcall_in_code": [("Write", {"file_path": "p.py", "content": 'S = "</tool_call>"\nT = 1'})],
    "tool_call_in_value_then_more": [("Write", {
        "file_path": "doc.md", "content": "Example:\n<tool_call>\n<function=Read>\n</function>\n</tool_call>\nend"})],
    # Open parameters: mid-line tag text or a text that just stops is a format error, not a cut value.
    "param_tag_in_code": [("error", "parameter 'content' of Write is not closed")],
    "truncated_mid_value": [("error", "parameter 'content' of Write is not closed")],
    # Names are stripped; a name given twice is an error; the JSON form is read; a bare whole
    # function is a call; a <tool_call> that holds no call is answered, so the model hears of it.
    "spaces_in_function_name": [("Read", {"file_path": "a"})],
    "spaces_in_param_name": [("Read", {"file_path": "a"})],
    "duplicate_param": [("error", "parameter 'file_path' of Read is given twice")],
    "hermes_json": [("Read", {"file_path": "calc.py", "limit": 3})],
    "bare_function": [("Read", {"file_path": "a.py"})],
    "wrapper_without_function": [("error", "must start with <function=NAME>")],
    "empty_tool_call_block": [("error", "must start with <function=NAME>")],
    "function_name_with_newline_junk": [("error", "unreadable function tag")],
}


@pytest.mark.parametrize("name", sglang_case_names("textcalls.jsonl"))
def test_text_calls_read_as_sglang_reads_them(name: str) -> None:
    case = sglang_case("textcalls.jsonl", name)
    parsed = extract_text_calls(case["text"])
    ours: list[tuple[str, Any]] = []
    for call in parsed.calls:
        if call.error is not None:
            ours.append(("error", call.error))
        else:
            ours.append((call.name, call.arguments if call.typed else coerce_arguments(call.name, call.arguments)))
    expected = OURS_WHERE_SGLANG_DIFFERS.get(name)
    if expected is None:
        assert ours == [(c["name"], c["arguments"]) for c in case["sglang"]["calls"]]
        return
    assert len(ours) == len(expected)
    for (kind, value), (want_kind, want) in zip(ours, expected, strict=True):
        assert kind == want_kind
        if kind == "error":
            assert want in value and value.startswith(f"{ERROR_NAME}: ")
        else:
            assert value == want


TAGS = st.sampled_from([
    "<tool_call>", "</tool_call>", "<function=", "<function=Read>", "</function>", "<parameter=",
    "<parameter=file_path>", "</parameter>", "<think>", "</think>", ">", "<", "\n", " ", "{", "}", '"',
    '{"name": "Read"}', "a.py", "=",
])


@settings(max_examples=400, deadline=None)
@given(st.text())
def test_never_raises_on_arbitrary_text(text: str) -> None:
    parsed = extract_text_calls(text)
    assert all(c.error is None or c.error.startswith(ERROR_NAME) for c in parsed.calls)


@settings(max_examples=600, deadline=None)
@given(st.lists(st.one_of(TAGS, st.text(max_size=5)), max_size=40).map("".join))
def test_never_raises_on_tag_soup(text: str) -> None:
    for call in parse_tool_calls(text):
        assert (call.error is None) == bool(call.name) or call.error is not None
        assert all(isinstance(k, str) for k in call.arguments)
        if not call.typed:  # a parameter tag never folds into a value
            assert not any(OPEN_PARAM in value for value in call.arguments.values()), call


def test_prose_is_the_visible_text_without_the_blocks_of_the_calls_read() -> None:
    """What the dashboard shows beside the calls (issue 26): each call's block is cut out once, a mere
    mention of a tag stays, and a reply without calls is its visible text, as the loop's final answer."""
    parsed = extract_text_calls(f"<think>hm</think>Fixing it.\n\n{EDIT}\n\nThen the tests.\n{EDIT}")
    assert [c.name for c in parsed.calls] == ["Edit", "Edit"] and len(parsed.spans) == 2
    assert [parsed.visible[a:b] for a, b in parsed.spans] == [EDIT, EDIT]
    assert parsed.prose == "Fixing it.\n\nThen the tests."
    mention = extract_text_calls(f"Use <tool_call>...</tool_call> blocks.\n{EDIT}")
    assert mention.prose == "Use <tool_call>...</tool_call> blocks."
    assert extract_text_calls("  Done.\n\n\nAll green.  ").prose == "Done.\n\n\nAll green."


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(TAGS, st.text(max_size=5)), max_size=40).map("".join))
def test_spans_match_the_calls_and_lie_in_the_visible_text(text: str) -> None:
    parsed = extract_text_calls(text)
    assert len(parsed.spans) == len(parsed.calls)
    assert all(0 <= a < b <= len(parsed.visible) for a, b in parsed.spans)
    assert parsed.spans == sorted(parsed.spans)
