"""Real agents with two instrumentations active at once, exported to toolspan over OTLP/HTTP:
every tool call is described by two spans, which toolspan must count as one call.

- ``langgraph_agent``: a LangGraph ``StateGraph`` with a ``ToolNode`` and a scripted model
  (``GenericFakeChatModel``), instrumented by OpenInference's *and* OpenLLMetry's LangChain
  instrumentors: each tool call gets OpenInference's ``TOOL`` span and OpenLLMetry's
  ``execute_tool`` span, overlapping, under different parents. The model calls
  ``search_docs`` twice: the first call's backend refuses the connection (the error goes back
  to the model as a ToolMessage), the second succeeds.
- ``pydantic_agent``: a pydantic-ai agent with its own instrumentation (``execute_tool`` spans)
  whose tool is wrapped by toolspan's SDK adapter (``toolspan.adapters.pydantic_ai.traced``):
  each call gets pydantic-ai's span and, inside it, toolspan's call span with its attempts and
  stages. The model calls ``update_ticket`` with a status the tool's signature does not allow
  (toolspan's prepare stage rejects it: ``PREPARE``, an envelope goes back to the model), then
  with a valid one.

Every span goes out as it ends (a SimpleSpanProcessor: one request per span, children first).

Usage: two_instrumentations.py --endpoint http://127.0.0.1:4318
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from typing import Any, Literal


def provider_for(endpoint: str) -> Any:
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({
        "service.name": "two-instrumentations", "service.version": "1.0.0"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces")))
    trace.set_tracer_provider(provider)
    return provider


def run_langgraph(provider: Any) -> None:
    from openinference.instrumentation.langchain import LangChainInstrumentor
    from opentelemetry.instrumentation.langchain import LangchainInstrumentor

    LangChainInstrumentor().instrument(tracer_provider=provider)
    LangchainInstrumentor().instrument(tracer_provider=provider)

    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.tools import StructuredTool
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode

    def search_docs(query: str, limit: int = 5) -> list[str]:
        """Search the product documentation."""
        if query == "install":
            raise ConnectionRefusedError("[Errno 111] Connection refused")
        return ["Install guide", "Upgrade notes"][:limit]

    tool = StructuredTool.from_function(func=search_docs, name="search_docs")
    script = [
        AIMessage(content="", tool_calls=[{"name": "search_docs", "args": {"query": "install"}, "id": "lc_1"}]),
        AIMessage(content="", tool_calls=[{"name": "search_docs", "args": {"query": "install guide"},
                                           "id": "lc_2"}]),
        AIMessage(content="Here is what I found."),
    ]
    llm = GenericFakeChatModel(messages=iter(script))

    async def model(state):  # noqa: ANN001 - langgraph reads annotations at run time
        return {"messages": [await llm.ainvoke(state["messages"])]}

    def route(state):  # noqa: ANN001
        return "tools" if state["messages"][-1].tool_calls else END

    g = StateGraph(MessagesState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([tool], handle_tool_errors=True))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, ["tools", END])
    g.add_edge("tools", "model")
    asyncio.run(g.compile(name="langgraph_agent").ainvoke({"messages": [HumanMessage("How do I install it?")]}))


def run_pydantic_ai(provider: Any) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.models.instrumented import InstrumentationSettings

    from toolspan.adapters.pydantic_ai import traced

    def update_ticket(ticket_id: str, status: Literal["open", "pending", "closed"]) -> dict:
        """Set a ticket's status."""
        return {"ticket_id": ticket_id, "status": status}

    script = [{"ticket_id": "T-42", "status": "done"}, {"ticket_id": "T-42", "status": "closed"}]

    def model(messages: list, info: AgentInfo) -> ModelResponse:
        if script:
            n = 3 - len(script)
            return ModelResponse(parts=[ToolCallPart("update_ticket", script.pop(0), tool_call_id=f"pa_{n}")])
        return ModelResponse(parts=[TextPart("Done.")])

    agent = Agent(FunctionModel(model), name="pydantic_agent", tools=[traced(update_ticket)])
    agent.instrument = InstrumentationSettings(tracer_provider=provider)
    agent.run_sync("Close ticket T-42.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoint", required=True, help="toolspan's OTLP/HTTP base URL")
    args = ap.parse_args()
    logging.basicConfig(level=logging.CRITICAL)
    provider = provider_for(args.endpoint)
    run_langgraph(provider)
    run_pydantic_ai(provider)
    with contextlib.suppress(Exception):
        provider.shutdown()


if __name__ == "__main__":
    main()
