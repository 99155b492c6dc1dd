"""Google's official `google-genai` client against the mock upstream directly (so the mock
answers in the shapes of Gemini's own API: `generateContent`, `streamGenerateContent?alt=sse`,
`x-goog-api-key`, `usageMetadata`), and the official `openai` and `anthropic` clients reaching a
`google` credential through aigw."""

import anthropic
import openai
import pytest
from google import genai
from google.genai import errors, types

from gateway import running

KEY = "sk-aigw-GoogleSdkKey0123456789abcdefghij"

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
name = "gemini-direct"
provider = "google"
base_url = "http://127.0.0.1:{mock}/v1beta"
api_key = "cred-google"
models = [{ name = "flash", upstream = "gemini-2.5-flash" }]
"""


@pytest.fixture(scope="module")
def gateway():
    with running(RESOURCES.replace("{key}", KEY)) as g:
        yield g


@pytest.fixture()
def models(gateway):
    # The client is kept open while the test runs (its models handle does not hold it).
    client = genai.Client(api_key="cred-google",
                          http_options=types.HttpOptions(base_url=gateway.mock, api_version="v1beta"))
    yield client.models
    client.close()


def test_genai_client_reads_the_mocks_answer(gateway, models):
    gateway.reset_mock()
    r = models.generate_content(
        model="gemini-2.5-flash", contents="three words here",
        config=types.GenerateContentConfig(system_instruction="be brief", max_output_tokens=20,
                                           stop_sequences=["END"]))
    assert r.text.startswith("Hello")
    assert r.candidates[0].finish_reason == types.FinishReason.STOP
    assert r.usage_metadata.prompt_token_count >= 3
    assert r.usage_metadata.candidates_token_count == 5
    call = gateway.mock_calls()["calls"][-1]
    assert call["path"] == "/v1beta/models/gemini-2.5-flash:generateContent"
    assert call["credential"] == "cred-google"
    assert call["body"]["generationConfig"]["maxOutputTokens"] == 20


def test_genai_client_reads_the_mocks_stream(gateway, models):
    chunks = list(models.generate_content_stream(
        model="gemini-2.5-flash", contents="hi"))
    assert "".join(c.text or "" for c in chunks).startswith("Hello")
    assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    assert chunks[-1].usage_metadata.candidates_token_count == 5


def test_genai_client_reads_a_function_call(gateway, models):
    gateway.script(model="gemini-2.5-flash", times=1,
                   tool_call={"name": "lookup", "arguments": {"q": "x"}})
    r = models.generate_content(model="gemini-2.5-flash", contents="hi")
    assert r.function_calls[0].name == "lookup"
    assert r.function_calls[0].args == {"q": "x"}


def test_genai_client_sees_the_mocks_quota_error(gateway, models):
    gateway.script(model="gemini-2.5-flash", times=1, status=429, body={"error": {
        "code": 429, "message": "You exceeded your current quota.", "status": "RESOURCE_EXHAUSTED",
        "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "30s"}]}})
    with pytest.raises(errors.ClientError) as e:
        models.generate_content(model="gemini-2.5-flash", contents="hi")
    assert e.value.code == 429
    assert e.value.status == "RESOURCE_EXHAUSTED"


def test_openai_client_reaches_google_through_aigw(gateway):
    gateway.reset_mock()
    client = openai.OpenAI(base_url=gateway.gw + "/v1", api_key=KEY, max_retries=0)
    r = client.chat.completions.create(model="flash", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content.startswith("Hello")
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == 5
    chunks = list(client.chat.completions.create(
        model="flash", messages=[{"role": "user", "content": "hi"}], stream=True,
        stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).startswith("Hello")
    assert chunks[-1].usage.completion_tokens == 5
    paths = [c["path"] for c in gateway.mock_calls()["calls"]]
    assert "/v1beta/models/gemini-2.5-flash:generateContent" in paths
    assert "/v1beta/models/gemini-2.5-flash:streamGenerateContent" in paths


def test_anthropic_client_reaches_google_through_aigw(gateway):
    gateway.reset_mock()
    client = anthropic.Anthropic(base_url=gateway.gw, api_key=KEY, max_retries=0)
    m = client.messages.create(model="flash", max_tokens=50, system="Be brief.",
                               messages=[{"role": "user", "content": "hi"}])
    assert m.content[0].text.startswith("Hello")
    assert m.stop_reason == "end_turn"
    assert m.usage.output_tokens == 5
    with client.messages.stream(model="flash", max_tokens=50,
                                messages=[{"role": "user", "content": "hi"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text.startswith("Hello")
    assert final.usage.output_tokens == 5
    paths = [c["path"] for c in gateway.mock_calls()["calls"]]
    assert paths and all(p.startswith("/v1beta/models/gemini-2.5-flash:") for p in paths), paths
