"""Framework adapters: one wrapper call makes an existing tool traced and enveloped.

Each lives in its own module and imports its framework only when used:

- :mod:`toolspan.adapters.langchain` — LangChain / LangGraph tools (``langchain-core``);
- :mod:`toolspan.adapters.pydantic_ai` — pydantic-ai tools;
- :mod:`toolspan.adapters.openai_agents` — OpenAI Agents SDK function tools;
- :mod:`toolspan.adapters.mcp` — MCP client tool calls (``mcp``).
"""
