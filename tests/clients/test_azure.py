"""The official `openai` package's AzureOpenAI client against the mock upstream directly (so the
mock answers in Azure's shape: paths, `api-version`, `api-key`, content-filter results), and the
plain OpenAI and Anthropic clients reaching an `azure` credential through aigw."""

import anthropic
import openai
import pytest

from gateway import running

KEY = "sk-aigw-AzureSdkKey0123456789abcdefghijk"

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
name = "azure-east"
provider = "azure"
base_url = "http://127.0.0.1:{mock}"
api_version = "2024-10-21"
api_key = "cred-azure"
models = [{ name = "gpt-4o", upstream = "gpt4o-prod" }, { name = "embed", upstream = "emb-small" }]
"""


@pytest.fixture(scope="module")
def gateway():
    with running(RESOURCES.replace("{key}", KEY)) as g:
        yield g


def azure(gateway, **kw):
    return openai.AzureOpenAI(azure_endpoint=gateway.mock, api_key="cred-azure",
                              api_version="2024-10-21", max_retries=0, **kw)


def test_azure_client_reads_the_mocks_chat_answer(gateway):
    gateway.reset_mock()
    r = azure(gateway).chat.completions.create(
        model="gpt4o-prod", messages=[{"role": "user", "content": "three words here"}])
    assert r.choices[0].message.content.startswith("Hello")
    assert r.usage.prompt_tokens == 3
    assert r.model_extra["prompt_filter_results"][0]["prompt_index"] == 0
    call = gateway.mock_calls()["calls"][-1]
    assert call["path"] == "/openai/deployments/gpt4o-prod/chat/completions"
    assert call["credential"] == "cred-azure"


def test_azure_client_reads_the_mocks_stream(gateway):
    stream = azure(gateway).chat.completions.create(
        model="gpt4o-prod", messages=[{"role": "user", "content": "hi"}], stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices == []  # Azure's prompt-filter chunk
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("Hello")
    assert chunks[-1].usage.completion_tokens == 5


def test_azure_client_reads_the_mocks_embeddings(gateway):
    r = azure(gateway).embeddings.create(model="emb-small", input=["a b", "c"])
    assert len(r.data) == 2 and r.usage.prompt_tokens == 3


def test_azure_client_v1_api(gateway):
    client = openai.OpenAI(base_url=gateway.mock + "/openai/v1", api_key="unused", max_retries=0,
                           default_headers={"api-key": "cred-azure"})
    r = client.chat.completions.create(model="gpt4o-prod", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content.startswith("Hello")


def test_azure_client_sees_the_mocks_refusals(gateway):
    # Azure answers a deployments call without `api-version` "Resource not found".
    with pytest.raises(openai.NotFoundError):
        openai.OpenAI(base_url=gateway.mock + "/openai/deployments/gpt4o-prod", api_key="x",
                      max_retries=0, default_headers={"api-key": "cred-azure"}).chat.completions.create(
            model="gpt4o-prod", messages=[{"role": "user", "content": "hi"}])
    gateway.script(model="gpt4o-prod", times=1, status=400, body={"error": {
        "message": "The response was filtered due to the prompt triggering Azure OpenAI's content management policy.",
        "type": None, "param": "prompt", "code": "content_filter", "status": 400,
        "innererror": {"code": "ResponsibleAIPolicyViolation"}}})
    with pytest.raises(openai.BadRequestError) as e:
        azure(gateway).chat.completions.create(model="gpt4o-prod",
                                               messages=[{"role": "user", "content": "hi"}])
    assert e.value.code == "content_filter"


def test_openai_client_reaches_azure_through_aigw(gateway):
    client = openai.OpenAI(base_url=gateway.gw + "/v1", api_key=KEY, max_retries=0)
    r = client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content.startswith("Hello")
    chunks = list(client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}], stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).startswith("Hello")
    e = client.embeddings.create(model="embed", input="a b c")
    assert len(e.data) == 1
    paths = [c["path"] for c in gateway.mock_calls()["calls"]]
    assert "/openai/deployments/gpt4o-prod/chat/completions" in paths
    assert "/openai/deployments/emb-small/embeddings" in paths


def test_anthropic_client_reaches_azure_through_aigw(gateway):
    gateway.reset_mock()
    client = anthropic.Anthropic(base_url=gateway.gw, api_key=KEY, max_retries=0)
    m = client.messages.create(model="gpt-4o", max_tokens=50, system="Be brief.",
                               messages=[{"role": "user", "content": "hi"}])
    assert m.content[0].text.startswith("Hello")
    assert m.stop_reason == "end_turn"
    assert m.usage.output_tokens == 5
    with client.messages.stream(model="gpt-4o", max_tokens=50,
                                messages=[{"role": "user", "content": "hi"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text.startswith("Hello")
    assert final.usage.output_tokens == 5
    paths = [c["path"] for c in gateway.mock_calls()["calls"]]
    assert paths and all(p.startswith("/openai/deployments/gpt4o-prod/") for p in paths), paths
