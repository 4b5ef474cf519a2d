"""Scripted multi-turn pydantic-ai agents whose tool fails and whose model reads the error and
tries again, exported to toolspan over OTLP/HTTP.

Three runs, each its own agent (so the test can tell their rows apart by `agent`), with a
scripted model (pydantic-ai's FunctionModel; no network LLM) and pydantic-ai's own
instrumentation (GenAI spans with `gen_ai.conversation.id` and its retry markers):

- ``recovering_agent``: the model calls ``update_ticket`` with a status the tool rejects
  (``ModelRetry``, pydantic-ai's way to send an error back to the model), reads the error and
  calls again with a valid status, which succeeds: one recovered failure, 2 calls to recovery;
- ``stuck_agent``: the model's one call of ``lookup_order`` fails and it gives up with a text
  answer: one unrecovered failure;
- ``hammering_agent``: the model sends ``fetch_report`` the same failing arguments three times,
  then gives up: one unrecovered streak of three failures, two identical retries (hammering).

Usage: recovery.py --endpoint http://127.0.0.1:4318
"""

from __future__ import annotations

import argparse
from typing import Any


def provider_for(endpoint: str) -> Any:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({
        "service.name": "recovery-demo", "service.version": "1.0.0"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces")))
    return provider


def run(provider: Any, agent_name: str, tool_name: str, script: list[dict], tool: Any, retries: int) -> str:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.models.instrumented import InstrumentationSettings

    calls = list(script)

    def model(messages: list, info: AgentInfo) -> ModelResponse:
        if calls:
            n = len(script) - len(calls) + 1
            return ModelResponse(parts=[ToolCallPart(tool_name, calls.pop(0), tool_call_id=f"{agent_name}_{n}")])
        return ModelResponse(parts=[TextPart("Done." if tool_name == "update_ticket" else "I could not do it.")])

    agent = Agent(FunctionModel(model), name=agent_name, retries=retries)
    agent.tool_plain(name=tool_name)(tool)
    agent.instrument = InstrumentationSettings(tracer_provider=provider)
    return agent.run_sync("Please help.").output


def main() -> None:
    from pydantic_ai import ModelRetry

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoint", required=True, help="toolspan's OTLP/HTTP base URL")
    args = ap.parse_args()
    provider = provider_for(args.endpoint)

    def update_ticket(ticket_id: str, status: str) -> dict:
        if status not in ("open", "pending", "closed"):
            raise ModelRetry(f"status must be one of open, pending, closed; got {status!r}")
        return {"ticket_id": ticket_id, "status": status}

    def lookup_order(order_id: str) -> dict:
        raise ModelRetry(f"order {order_id!r} does not exist")

    def fetch_report(name: str) -> dict:
        raise ModelRetry("the report service is unavailable")

    print(run(provider, "recovering_agent", "update_ticket",
              [{"ticket_id": "T-42", "status": "done"}, {"ticket_id": "T-42", "status": "closed"}],
              update_ticket, retries=2))
    print(run(provider, "stuck_agent", "lookup_order", [{"order_id": "O-1"}], lookup_order, retries=2))
    print(run(provider, "hammering_agent", "fetch_report", [{"name": "q3"}] * 3, fetch_report, retries=3))
    provider.shutdown()


if __name__ == "__main__":
    main()
