"""boto3's own `bedrock-runtime` client against the mock upstream directly (so the mock answers
in Bedrock's shape: SigV4-signed paths, Converse JSON, ConverseStream's event-stream frames, AWS
error types), and the official `openai` and `anthropic` clients reaching a `bedrock` credential
through aigw."""

import anthropic
import boto3
import botocore.exceptions
import openai
import pytest
from botocore import UNSIGNED
from botocore.config import Config

from gateway import running

KEY = "sk-aigw-BedrockSdkKey0123456789abcdefghi"
MODEL = "anthropic.claude-3-5-sonnet-20240620-v1:0"
ACCESS_KEY_ID = "AKIAMOCKBOTO300000001"

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
name = "bedrock-east"
provider = "bedrock"
base_url = "http://127.0.0.1:{mock}"
region = "us-east-1"
access_key_id = "AKIAMOCKGATEWAY000001"
secret_access_key = "gateway/Secret+Key0123456789"
models = [{ name = "claude-bedrock", upstream = "anthropic.claude-3-5-sonnet-20240620-v1:0" }]
"""


@pytest.fixture(scope="module")
def gateway():
    with running(RESOURCES.replace("{key}", KEY)) as g:
        yield g


def bedrock(gateway, **config):
    return boto3.client(
        "bedrock-runtime", region_name="us-east-1", endpoint_url=gateway.mock,
        aws_access_key_id=ACCESS_KEY_ID, aws_secret_access_key="dummy/Secret+Key",
        config=Config(retries={"total_max_attempts": 1, "mode": "standard"}, **config))


HELLO = [{"role": "user", "content": [{"text": "three words here"}]}]


def test_boto3_reads_the_mocks_converse_answer(gateway):
    gateway.reset_mock()
    r = bedrock(gateway).converse(modelId=MODEL, messages=HELLO, system=[{"text": "Be brief."}],
                                  inferenceConfig={"maxTokens": 50, "stopSequences": ["END"]})
    assert r["output"]["message"]["role"] == "assistant"
    assert r["output"]["message"]["content"][0]["text"].startswith("Hello")
    assert r["stopReason"] == "end_turn"
    assert r["usage"]["inputTokens"] == 5 and r["usage"]["outputTokens"] == 5
    call = gateway.mock_calls()["calls"][-1]
    # boto3 percent-encodes the model id's `:`; the mock reads it back.
    assert call["path"] == f"/model/{MODEL}/converse"
    assert call["credential"] == ACCESS_KEY_ID
    assert call["body"]["inferenceConfig"] == {"maxTokens": 50, "stopSequences": ["END"]}


def test_boto3_reads_the_mocks_event_stream(gateway):
    gateway.script(model=MODEL, times=1, tool_call={"name": "weather", "arguments": {"city": "Paris"}})
    r = bedrock(gateway).converse_stream(modelId=MODEL, messages=HELLO)
    events = list(r["stream"])
    kinds = [next(iter(e)) for e in events]
    assert kinds[0] == "messageStart" and kinds[-2:] == ["messageStop", "metadata"]
    text = "".join(e["contentBlockDelta"]["delta"].get("text", "") for e in events if "contentBlockDelta" in e)
    assert text.startswith("Hello")
    start = next(e["contentBlockStart"] for e in events if "contentBlockStart" in e)
    assert start["start"]["toolUse"]["name"] == "weather"
    args = "".join(e["contentBlockDelta"]["delta"]["toolUse"]["input"]
                   for e in events if "toolUse" in e.get("contentBlockDelta", {}).get("delta", {}))
    assert args == '{"city":"Paris"}'
    assert events[-2]["messageStop"]["stopReason"] == "tool_use"
    assert events[-1]["metadata"]["usage"]["outputTokens"] == 5


def test_boto3_sees_the_mocks_aws_errors(gateway):
    gateway.script(model=MODEL, times=1, status=429,
                   headers={"x-amzn-errortype": "ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/"},
                   body={"message": "Too many requests, please wait before trying again."})
    with pytest.raises(botocore.exceptions.ClientError) as e:
        bedrock(gateway).converse(modelId=MODEL, messages=HELLO)
    assert e.value.response["Error"]["Code"] == "ThrottlingException"
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 429
    # An unsigned call is refused as AWS refuses it.
    with pytest.raises(botocore.exceptions.ClientError) as e:
        bedrock(gateway, signature_version=UNSIGNED).converse(modelId=MODEL, messages=HELLO)
    assert e.value.response["Error"]["Code"] == "MissingAuthenticationTokenException"


def test_anthropic_client_reaches_bedrock_through_aigw(gateway):
    # Before the throttling test below, which rests the model for a minute.
    client = anthropic.Anthropic(base_url=gateway.gw, api_key=KEY, max_retries=0)
    m = client.messages.create(model="claude-bedrock", max_tokens=50, system="Be brief.",
                               messages=[{"role": "user", "content": "hi"}])
    assert m.content[0].text.startswith("Hello")
    assert m.stop_reason == "end_turn"
    with client.messages.stream(model="claude-bedrock", max_tokens=50,
                                messages=[{"role": "user", "content": "hi"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text.startswith("Hello")
    assert final.usage.output_tokens == 5


def test_openai_client_reaches_bedrock_through_aigw(gateway):
    gateway.reset_mock()
    client = openai.OpenAI(base_url=gateway.gw + "/v1", api_key=KEY, max_retries=0)
    r = client.chat.completions.create(model="claude-bedrock", max_tokens=50,
                                       messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content.startswith("Hello")
    assert r.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(
        model="claude-bedrock", messages=[{"role": "user", "content": "hi"}], stream=True,
        stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).startswith("Hello")
    assert chunks[-1].usage.completion_tokens == 5
    calls = gateway.mock_calls()["calls"]
    assert [c["path"] for c in calls] == [f"/model/{MODEL}/converse", f"/model/{MODEL}/converse-stream"]
    assert calls[0]["credential"] == "AKIAMOCKGATEWAY000001"
    # Bedrock's throttling comes back as OpenAI's RateLimitError, its AWS type kept.
    gateway.script(model=MODEL, times=1, status=429,
                   headers={"x-amzn-errortype": "ThrottlingException"},
                   body={"message": "Too many requests, please wait before trying again."})
    with pytest.raises(openai.RateLimitError) as e:
        client.chat.completions.create(model="claude-bedrock", messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["aws_error_type"] == "ThrottlingException"
