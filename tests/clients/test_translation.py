"""Any model from either official SDK: the OpenAI client calling a model served by an `anthropic`
credential, and the Anthropic client calling a model served by an OpenAI-family credential
(docs/translation.md), against a running aigw and the mock upstream."""

import json

import anthropic
import openai
import pytest

from gateway import running

KEY = "sk-aigw-TranslateSdkKey0123456789abcdefg"

RESOURCES = """
[[workspace]]
name = "acme"
[[member]]
workspace = "acme"
email = "sdk@acme.test"
role = "member"
[[api_key]]
member = "sdk@acme.test"
name = "sdk"
key = "{key}"
[[upstream]]
workspace = "acme"
name = "mock-openai"
provider = "openai"
base_url = "http://127.0.0.1:{mock}/v1"
api_key = "cred-openai"
models = ["gpt-4o"]
[[upstream]]
workspace = "acme"
name = "mock-anthropic"
provider = "anthropic"
base_url = "http://127.0.0.1:{mock}/v1"
api_key = "cred-anthropic"
models = ["claude-sonnet"]
"""

WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.fixture()
def gateway():
    with running(RESOURCES.replace("{key}", KEY)) as g:
        yield g


def oa(gateway):
    return openai.OpenAI(base_url=gateway.gw + "/v1", api_key=KEY, max_retries=0)


def an(gateway):
    return anthropic.Anthropic(base_url=gateway.gw, api_key=KEY, max_retries=0)


def test_openai_sdk_calls_a_claude_model(gateway):
    raw = oa(gateway).chat.completions.with_raw_response.create(
        model="claude-sonnet", messages=[{"role": "system", "content": "Be brief."},
                                         {"role": "user", "content": "three words here"}])
    assert raw.headers["x-aigw-provider"] == "anthropic"
    assert raw.headers["x-aigw-model"] == "claude-sonnet"
    r = raw.parse()
    assert r.choices[0].message.content.startswith("Hello")
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.completion_tokens == 5
    sent = gateway.mock_calls()["calls"][-1]
    assert sent["path"] == "/v1/messages" and sent["body"]["system"] == "Be brief."


def test_openai_sdk_streams_a_claude_model(gateway):
    chunks = list(oa(gateway).chat.completions.create(
        model="claude-sonnet", stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "hi"}]))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("Hello")
    assert any(c.choices and c.choices[0].finish_reason == "stop" for c in chunks)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5


def test_openai_sdk_tool_call_on_a_claude_model(gateway):
    gateway.script(model="claude-sonnet", tool_call={"name": "get_weather", "arguments": {"city": "Paris"}})
    r = oa(gateway).chat.completions.create(
        model="claude-sonnet", tools=WEATHER, tool_choice="auto",
        messages=[{"role": "user", "content": "weather in Paris?"}])
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    # Streamed, the SDK assembles the tool call from its deltas.
    with oa(gateway).chat.completions.stream(
            model="claude-sonnet", tools=WEATHER,
            messages=[{"role": "user", "content": "weather in Paris?"}]) as s:
        final = s.get_final_completion()
    streamed = final.choices[0].message.tool_calls[0]
    assert json.loads(streamed.function.arguments) == {"city": "Paris"}
    # The result goes back and the conversation goes on.
    r = oa(gateway).chat.completions.create(model="claude-sonnet", tools=WEATHER, messages=[
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "tool_calls": [{"id": call.id, "type": "function",
                                              "function": {"name": "get_weather", "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "18C"}])
    assert r.choices[0].message.content.startswith("Hello")


def test_openai_sdk_sees_a_refused_field_and_a_claude_error(gateway):
    with pytest.raises(openai.BadRequestError) as e:
        oa(gateway).chat.completions.create(model="claude-sonnet", n=2,
                                            messages=[{"role": "user", "content": "x"}])
    assert e.value.body["param"] == "n"
    gateway.script(model="claude-sonnet", status=529,
                   body={"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    with pytest.raises(openai.APIStatusError) as e:
        oa(gateway).chat.completions.create(model="claude-sonnet", messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 529
    assert e.value.message.endswith("Overloaded") or "Overloaded" in str(e.value)
    assert e.value.response.headers["x-aigw-error-source"] == "upstream"


def test_anthropic_sdk_calls_an_openai_model(gateway):
    m = an(gateway).messages.create(model="gpt-4o", max_tokens=32, system="Be brief.",
                                    messages=[{"role": "user", "content": "two words"}])
    assert m.content[0].text.startswith("Hello")
    assert m.stop_reason == "end_turn"
    assert (m.usage.input_tokens, m.usage.output_tokens) == (4, 5)
    with an(gateway).messages.stream(model="gpt-4o", max_tokens=32,
                                     messages=[{"role": "user", "content": "two words"}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text.startswith("Hello")
    assert final.usage.output_tokens == 5
    gateway.script(model="gpt-4o", tool_call={"name": "get_weather", "arguments": {"city": "Rome"}})
    m = an(gateway).messages.create(
        model="gpt-4o", max_tokens=32,
        tools=[{"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        messages=[{"role": "user", "content": "weather in Rome?"}])
    use = [b for b in m.content if b.type == "tool_use"][0]
    assert m.stop_reason == "tool_use"
    assert (use.name, use.input) == ("get_weather", {"city": "Rome"})


def _chunk(delta, finish=None):
    return "data: " + json.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                                  "model": "gpt-4o", "choices": [{"index": 0, "delta": delta,
                                                                  "finish_reason": finish}]}) + "\n\n"


def test_both_sdks_see_a_stream_cut_short_as_an_error(gateway):
    """An upstream whose stream ends inside the answer: each SDK raises, instead of reading a
    short answer as a whole one (docs/limits.md, "A stream ends at its end, or with an error")."""
    cut = _chunk({"role": "assistant", "content": ""}) + _chunk({"content": "Hel"}) + \
        'data: {"id":"chatcmpl-1","choices":[{"index":0,"delta":{"content":"lo wor'
    gateway.script(model="gpt-4o", raw_body=cut, content_type="text/event-stream")
    with pytest.raises(anthropic.APIError) as e:
        with an(gateway).messages.stream(model="gpt-4o", max_tokens=32,
                                         messages=[{"role": "user", "content": "hi"}]) as s:
            "".join(s.text_stream)
    assert "ended before the answer did" in str(e.value)
    with pytest.raises(openai.APIError) as e:
        list(oa(gateway).chat.completions.create(model="gpt-4o", stream=True,
                                                 messages=[{"role": "user", "content": "hi"}]))
    assert "ended before the answer did" in str(e.value)


def test_anthropic_sdk_reads_what_an_openai_stream_said(gateway):
    """The final message the Anthropic SDK assembles: the real input count, the stop sequence
    a provider named, a refusal as text; and the gateway's refusals in Anthropic's envelope."""
    body = ("data: " + json.dumps({"id": "chatcmpl-1", "model": "gpt-4o", "choices": [
        {"index": 0, "delta": {"role": "assistant", "content": "one two"}, "finish_reason": None}],
        "usage": {"prompt_tokens": 17, "completion_tokens": 0, "total_tokens": 17}}) + "\n\n"
        + "data: " + json.dumps({"id": "chatcmpl-1", "model": "gpt-4o", "choices": [
            {"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": "three"}]}) + "\n\n"
        + "data: " + json.dumps({"id": "chatcmpl-1", "model": "gpt-4o", "choices": [],
                                 "usage": {"prompt_tokens": 17, "completion_tokens": 2, "total_tokens": 19}}) + "\n\n"
        + "data: [DONE]\n\n")
    gateway.script(model="gpt-4o", raw_body=body, content_type="text/event-stream", times=1)
    with an(gateway).messages.stream(model="gpt-4o", max_tokens=32, stop_sequences=["three"],
                                     messages=[{"role": "user", "content": "count"}]) as s:
        final = s.get_final_message()
    assert final.content[0].text == "one two"
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "three")
    assert (final.usage.input_tokens, final.usage.output_tokens) == (17, 2)

    refusal = _chunk({"role": "assistant", "refusal": "I can't help."}) + _chunk({}, "content_filter") + \
        "data: [DONE]\n\n"
    gateway.script(model="gpt-4o", raw_body=refusal, content_type="text/event-stream", times=1)
    with an(gateway).messages.stream(model="gpt-4o", max_tokens=32,
                                     messages=[{"role": "user", "content": "x"}]) as s:
        final = s.get_final_message()
    assert (final.content[0].text, final.stop_reason) == ("I can't help.", "refusal")

    with pytest.raises(anthropic.NotFoundError) as e:
        an(gateway).messages.create(model="no-such-model", max_tokens=8,
                                    messages=[{"role": "user", "content": "x"}])
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "not_found_error"
    assert e.value.body["error"]["code"] == "model_not_found"
