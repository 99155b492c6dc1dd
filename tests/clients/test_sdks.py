"""The official OpenAI and Anthropic Python clients against a running aigw and the mock upstream
(started by gateway.py: the binary from AIGW_BIN, default target/debug/aigw, on free ports with a
fresh SQLite database)."""

import anthropic
import openai
import pytest

from gateway import running

KEY = "sk-aigw-SdkTestKey0123456789abcdefghijkl"


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
provider = "openai-compatible"
base_url = "http://127.0.0.1:{mock}/v1"
api_key = "cred-openai"
models = ["gpt-4o-mini", "text-embedding-3-small", "limited"]
[[upstream]]
workspace = "acme"
name = "mock-anthropic"
provider = "anthropic"
base_url = "http://127.0.0.1:{mock}/v1"
api_key = "cred-anthropic"
models = ["claude-sonnet"]
"""


@pytest.fixture(scope="module")
def gateway():
    with running(RESOURCES.replace("{key}", KEY)) as g:
        yield g


def script(gateway, **rule):
    gateway.script(**rule)


def oa(gateway, key=KEY):
    return openai.OpenAI(base_url=gateway.gw + "/v1", api_key=key, max_retries=0)


def test_chat_not_streamed(gateway):
    r = oa(gateway).chat.completions.create(model="gpt-4o-mini",
                                            messages=[{"role": "user", "content": "three words here"}])
    assert r.choices[0].message.content.startswith("Hello")
    assert r.usage.prompt_tokens == 3
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_streamed_without_and_with_usage(gateway):
    chunks = list(oa(gateway).chat.completions.create(
        model="gpt-4o-mini", stream=True, messages=[{"role": "user", "content": "hi"}]))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("Hello")
    assert all(getattr(c, "usage", None) is None for c in chunks), "no usage chunk when not asked"
    chunks = list(oa(gateway).chat.completions.create(
        model="gpt-4o-mini", stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "hi"}]))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5


def test_embeddings(gateway):
    r = oa(gateway).embeddings.create(model="text-embedding-3-small", input=["a b", "c"])
    assert len(r.data) == 2 and len(r.data[0].embedding) == 8


def test_errors_surface_as_the_right_exception(gateway):
    with pytest.raises(openai.AuthenticationError):
        oa(gateway, key="sk-aigw-0000000000000000000000000000nope").models.list()
    with pytest.raises(openai.NotFoundError) as e:
        oa(gateway).chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        oa(gateway).chat.completions.create(model="gpt-4o-mini", messages="not a list")
    script(gateway, model="limited", status=429, headers={"retry-after": "3"},
           body={"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}})
    with pytest.raises(openai.RateLimitError) as e:
        oa(gateway).chat.completions.create(model="limited", messages=[{"role": "user", "content": "x"}])
    assert e.value.response.headers["x-aigw-error-source"] == "upstream"
    assert e.value.response.headers["retry-after"] == "3"


def test_models_list(gateway):
    ids = sorted(m.id for m in oa(gateway).models.list())
    assert ids == ["claude-sonnet", "gpt-4o-mini", "limited", "text-embedding-3-small"]


def test_anthropic_messages(gateway):
    client = anthropic.Anthropic(base_url=gateway.gw, api_key=KEY, max_retries=0)
    m = client.messages.create(model="claude-sonnet", max_tokens=32,
                               messages=[{"role": "user", "content": "two words"}])
    assert m.content[0].text.startswith("Hello")
    assert (m.usage.input_tokens, m.usage.output_tokens) == (2, 5)
    with client.messages.stream(model="claude-sonnet", max_tokens=32,
                                messages=[{"role": "user", "content": "two words"}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text.startswith("Hello")
    assert final.usage.output_tokens == 5
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=gateway.gw, api_key="sk-aigw-0000000000000000000000000000nope",
                            max_retries=0).messages.create(model="claude-sonnet", max_tokens=5,
                                                           messages=[{"role": "user", "content": "x"}])
