"""An agent framework nobody here wrote, unmodified, against `kore-launch serve`: the
`openai-agents` SDK (PyPI `openai-agents`, module `agents`) runs an agent with one function tool
through `OpenAIChatCompletionsModel` on an `AsyncOpenAI` client, natively and in the guest. The
first turn has `tool_choice` required (the SDK resets it to auto once the tool ran); the run must
complete: the tool ran with arguments that validate against its schema, a final output came
back."""

import json
import urllib.request
from typing import Literal

import agents
import jsonschema
import openai
import pytest

agents.set_tracing_disabled(True)


@pytest.fixture(scope="module")
def model(server):
    return json.loads(urllib.request.urlopen(server.url + "/v1/models").read())["data"][0]["id"]


def test_an_agent_run_with_a_required_tool_completes(server, model):
    calls = []

    @agents.function_tool
    def get_weather(city: Literal["Paris", "Oslo", "Lima"], days: int) -> str:
        """The weather of a city for the next days.

        Args:
            city: The city.
            days: How many days ahead.
        """
        calls.append({"city": city, "days": days})
        return f"sunny in {city} for {days} days"

    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                                timeout=300)
    settings = agents.ModelSettings(
        tool_choice="required", temperature=0, max_tokens=512, parallel_tool_calls=False,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    agent = agents.Agent(
        name="weather", instructions="Answer with the weather tool.", tools=[get_weather],
        model=agents.OpenAIChatCompletionsModel(model=model, openai_client=client),
        model_settings=settings)
    assert agent.reset_tool_choice  # the SDK's default: required for the first turn only
    result = agents.Runner.run_sync(agent, "What is the weather in Paris for 3 days?",
                                    max_turns=4)
    assert calls, "the tool never ran"
    schema = get_weather.params_json_schema
    for c in calls:
        jsonschema.validate(c, schema)
    assert isinstance(result.final_output, str)
    kinds = [item.type for item in result.new_items]
    assert kinds[0] == "tool_call_item" and "tool_call_output_item" in kinds, kinds
    assert kinds[-1] == "message_output_item", kinds
