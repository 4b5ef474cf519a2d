"""Each adapter against the framework's released package, driven by a scripted model (no
network LLM): one wrapper call, and the model gets envelopes while the spans follow §2."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

from opentelemetry.trace import StatusCode

import toolspan
from conftest import Spans, assert_clean


def update_ticket(ticket_id: int, status: Literal["open", "pending", "closed"]) -> dict:
    """Set a ticket's status."""
    if ticket_id == 13:
        raise RuntimeError("deadlock detected in /srv/tickets/store.py line 88: UPDATE tickets SET ... (psycopg)")
    return {"ticket_id": ticket_id, "status": status}


BAD = {"ticket_id": 7, "status": "resolved"}
FAILS = {"ticket_id": 13, "status": "closed"}
GOOD = {"ticket_id": 7, "status": "closed"}


def check_spans_and_envelopes(
    spans: Spans, answers: dict[str, Any], ids: tuple[str, str, str], fail_code: str = "internal_error"
) -> None:
    """Three calls: bad arguments, the tool's own error, success; ``answers`` maps call id to
    what the model got back (decoded JSON)."""
    bad, fails, good = ids
    by_id = {c.attributes.get("gen_ai.tool.call.id"): c for c in spans.calls("update_ticket")}
    assert set(by_id) == set(ids), by_id.keys()
    assert by_id[bad].attributes["error.type"] == "PREPARE"
    assert by_id[fails].attributes["error.type"] == "TOOL_ERROR"
    assert by_id[good].status.status_code is StatusCode.OK
    assert [s.attributes["toolspan.stage"] for s in spans.stages(by_id[bad])] == ["prepare"]

    e = answers[bad]["error"]
    assert (e["code"], e["field"], e["received"]) == ("invalid_argument", "status", "resolved")
    assert e["permitted"] == ["open", "pending", "closed"]
    e = answers[fails]["error"]
    assert (e["code"], e["class"]) == (fail_code, "internal")
    assert e["reference"] == by_id[fails].attributes["toolspan.error.reference"]
    assert answers[good] == GOOD
    for a in answers.values():
        assert_clean(json.dumps(a))


def test_langgraph_tool_node_with_a_langchain_tool(ts, spans: Spans) -> None:
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_core.tools import tool as lc_tool
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode

    from toolspan.adapters.langchain import traced

    tool = traced(lc_tool(update_ticket), toolspan=ts)
    assert tool.name == "update_ticket" and "status" in json.dumps(tool.tool_call_schema.model_json_schema())

    script = [
        AIMessage(content="", tool_calls=[{"name": "update_ticket", "args": BAD, "id": "lc_1"}]),
        AIMessage(content="", tool_calls=[{"name": "update_ticket", "args": FAILS, "id": "lc_2"}]),
        AIMessage(content="", tool_calls=[{"name": "update_ticket", "args": GOOD, "id": "lc_3"}]),
        AIMessage(content="ticket 7 is closed"),
    ]

    def model(state):  # noqa: ANN001 - langgraph reads annotations at run time
        return {"messages": [script.pop(0)]}

    def route(state):  # noqa: ANN001
        return "tools" if state["messages"][-1].tool_calls else END

    g = StateGraph(MessagesState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([tool]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, ["tools", END])
    g.add_edge("tools", "model")
    out = g.compile().invoke({"messages": [HumanMessage("close ticket 7")]})

    msgs = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert [m.status for m in msgs] == ["error", "error", "success"]
    check_spans_and_envelopes(spans, {m.tool_call_id: json.loads(m.content) for m in msgs}, ("lc_1", "lc_2", "lc_3"))
    # Plain-argument invocation gives the content string.
    assert json.loads(tool.invoke(GOOD)) == GOOD


def test_pydantic_ai_agent_with_a_function_model(ts, spans: Spans) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from toolspan.adapters.pydantic_ai import traced

    calls = [("pa_1", BAD), ("pa_2", FAILS), ("pa_3", GOOD)]
    seen_tools: list[str] = []

    def script(messages: list, info: AgentInfo) -> ModelResponse:
        seen_tools[:] = [t.name for t in info.function_tools]
        if calls:
            cid, args = calls.pop(0)
            return ModelResponse(parts=[ToolCallPart(tool_name="update_ticket", args=args, tool_call_id=cid)])
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(FunctionModel(script), tools=[traced(update_ticket, toolspan=ts)])
    result = agent.run_sync("close ticket 7")
    assert result.output == "done" and seen_tools == ["update_ticket"]
    returns = {
        p.tool_call_id: p.content
        for m in result.all_messages()
        for p in getattr(m, "parts", [])
        if isinstance(p, ToolReturnPart)
    }
    check_spans_and_envelopes(spans, returns, ("pa_1", "pa_2", "pa_3"))


def test_openai_agents_runner_with_a_scripted_model(ts, spans: Spans) -> None:
    from agents import Agent, RunConfig, Runner
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

    from toolspan.adapters.openai_agents import traced

    calls = [("oa_1", BAD), ("oa_2", FAILS), ("oa_3", GOOD)]
    outputs: dict[str, Any] = {}

    class Scripted(Model):
        async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> ModelResponse:
            for item in input if isinstance(input, list) else []:
                if isinstance(item, dict) and item.get("type") == "function_call_output":
                    outputs[item["call_id"]] = json.loads(item["output"])
            if calls:
                cid, a = calls.pop(0)
                out: list[Any] = [
                    ResponseFunctionToolCall(
                        arguments=json.dumps(a), call_id=cid, name="update_ticket", type="function_call", id=f"fc_{cid}", status="completed"
                    )
                ]
            else:
                out = [
                    ResponseOutputMessage(
                        id="msg_1",
                        content=[ResponseOutputText(annotations=[], text="done", type="output_text")],
                        role="assistant",
                        status="completed",
                        type="message",
                    )
                ]
            return ModelResponse(output=out, usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    agent = Agent(name="support", model=Scripted(), tools=[traced(update_ticket, toolspan=ts)])
    result = asyncio.run(Runner.run(agent, "close ticket 7", run_config=RunConfig(tracing_disabled=True)))
    assert result.final_output == "done"
    check_spans_and_envelopes(spans, outputs, ("oa_1", "oa_2", "oa_3"))


def test_mcp_client_tool_calls(ts, spans: Spans, logs) -> None:
    from mcp import Client
    from mcp.server.mcpserver import MCPServer

    from toolspan.adapters.mcp import traced

    server = MCPServer("tickets")
    server.tool()(update_ticket)

    async def run() -> dict[str, Any]:
        async with Client(server) as client:
            tc = traced(client, toolspan=ts)
            out = {}
            for cid, args in [("mcp_1", BAD), ("mcp_2", FAILS), ("mcp_3", GOOD)]:
                out[cid] = (await tc.call_tool("update_ticket", args, call_id=cid)).to_dict()
            return out

    answers = asyncio.run(run())
    # MCP reports the tool's own failure as a result (isError), found in execute; jsonschema
    # gives the permitted values of the enum.
    check_spans_and_envelopes(spans, answers, ("mcp_1", "mcp_2", "mcp_3"), fail_code="tool_reported_error")
    fails = [c for c in spans.calls() if c.attributes["gen_ai.tool.call.id"] == "mcp_2"][0]
    assert [s.attributes["toolspan.stage"] for s in spans.stages(fails)] == ["prepare", "send", "execute"]
    assert fails.attributes["toolspan.error.code"] == "tool_reported_error"
    (logged,) = logs.by_reference(fails.attributes["toolspan.error.reference"])
    # The server's own text goes to the log (with the traceback), not to the model.
    assert "Error executing tool update_ticket" in logged and "Traceback" in logged
    assert "Error executing" not in json.dumps(answers["mcp_2"])
