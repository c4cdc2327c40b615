"""A bridge from the Rust tests to the official MCP Python SDK (`mcp` on PyPI).

Usage: mcp_bridge.py legacy|modern COMMAND [ARG...]

Starts COMMAND as a stdio MCP server through the SDK's stdio client, opens a session in the
given protocol revision (legacy: the 2025-11-25 `initialize` handshake; modern: 2026-07-28
`server/discover`), prints one JSON line {"ready": ..., "protocol_version": ...}, then answers
one JSON line per request line on stdin:
  {"op": "list"}                                -> {"tools": [{name, description, inputSchema}]}
  {"op": "call", "tool": T, "args": {...}, "progress": bool}
      -> {"is_error", "structured", "text": [...], "progress": [[p, total, message], ...]}
         or {"protocol_error": {"code", "message"}}
  {"op": "close"}                               -> closes the session and exits 0
The server's environment is this process's (the tests set it).
"""

import asyncio
import json
import os
import sys

import mcp
from mcp import ClientSession, StdioServerParameters, stdio_client


def out(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def main():
    mode, command, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    params = StdioServerParameters(command=command, args=args, env=dict(os.environ))
    loop = asyncio.get_running_loop()
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            if mode == "legacy":
                await session.initialize()
            else:
                await session.discover()
            out({"ready": True, "protocol_version": str(session.protocol_version)})
            while True:
                line = await loop.run_in_executor(None, sys.stdin.readline)
                if not line:
                    return
                req = json.loads(line)
                if req["op"] == "close":
                    return
                if req["op"] == "list":
                    tools = await session.list_tools()
                    out({"tools": [
                        {"name": t.name, "description": t.description,
                         "inputSchema": t.input_schema}
                        for t in tools.tools
                    ]})
                    continue
                events = []

                async def on_progress(progress, total, message):
                    events.append([progress, total, message])

                try:
                    res = await session.call_tool(
                        req["tool"], req.get("args", {}),
                        progress_callback=on_progress if req.get("progress") else None,
                    )
                except mcp.MCPError as e:
                    out({"protocol_error": {"code": e.error.code, "message": e.error.message}})
                    continue
                out({
                    "is_error": bool(res.is_error),
                    "structured": res.structured_content,
                    "text": [c.text for c in res.content if getattr(c, "type", "") == "text"],
                    "progress": events,
                })


asyncio.run(main())
