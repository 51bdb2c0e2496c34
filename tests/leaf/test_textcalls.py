"""Text tool calls in the qwen3_coder form, inline thinking, and broken blocks."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.doubles.openai_server import text_call
from worker.leaf.textcalls import ERROR_NAME, extract_text_calls, parse_tool_calls, split_think

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


def test_call_left_in_reasoning_content() -> None:
    parsed = extract_text_calls("", "I will read it.\n" + text_call("Read", file_path="b.py"))
    assert [(c.name, c.arguments) for c in parsed.calls] == [("Read", {"file_path": "b.py"})]


def test_content_calls_win_over_reasoning() -> None:
    parsed = extract_text_calls(text_call("Glob", pattern="**/*.py"), text_call("Read", file_path="b.py"))
    assert [c.name for c in parsed.calls] == ["Glob"]


def test_reasoning_that_mentions_tags_is_not_a_call() -> None:
    parsed = extract_text_calls("All done.", "I could write <function=Read> or a <tool_call> here, but no.")
    assert parsed.calls == []
    assert parsed.visible == "All done."


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


TAGS = st.sampled_from([
    "<tool_call>", "</tool_call>", "<function=", "<function=Read>", "</function>", "<parameter=",
    "<parameter=file_path>", "</parameter>", "<think>", "</think>", ">", "<", "\n", " ", "{", "}", '"',
    '{"name": "Read"}', "a.py", "=",
])


@settings(max_examples=400, deadline=None)
@given(st.text())
def test_never_raises_on_arbitrary_text(text: str) -> None:
    parsed = extract_text_calls(text, text)
    assert all(c.error is None or c.error.startswith(ERROR_NAME) for c in parsed.calls)


@settings(max_examples=600, deadline=None)
@given(st.lists(st.one_of(TAGS, st.text(max_size=5)), max_size=40).map("".join), st.booleans())
def test_never_raises_on_tag_soup(text: str, in_reasoning: bool) -> None:
    for call in parse_tool_calls(text, in_reasoning=in_reasoning):
        assert (call.error is None) == bool(call.name) or call.error is not None
        assert all(isinstance(k, str) for k in call.arguments)
