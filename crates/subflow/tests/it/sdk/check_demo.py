"""Drives subflow with the official langgraph-sdk client and prints what it saw as JSON."""
import asyncio
import json
import sys

from langgraph_sdk import get_client


async def main(url: str) -> None:
    client = get_client(url=url)
    thread = await client.threads.create()
    thread_id = thread["thread_id"]
    frames: dict[str, int] = {}
    task_events: list[dict] = []
    async for part in client.runs.stream(
        thread_id,
        "lead_agent",
        input={"messages": [{"role": "user", "content": "Compare two message brokers"}]},
        stream_mode=["values", "custom"],
    ):
        frames[part.event] = frames.get(part.event, 0) + 1
        if part.event == "custom":
            task_events.append(part.data)
    state = await client.threads.get_state(thread_id)
    runs = await client.runs.list(thread_id)
    joined = await client.runs.join(thread_id, runs[0]["run_id"])
    # runs.cancel sends wait=1 / wait=0 as query booleans.
    cancelled = {}
    for wait in (True, False):
        run = await client.runs.create(
            thread_id,
            "lead_agent",
            input={"messages": [{"role": "user", "content": "Compare two caches"}]},
        )
        await client.runs.cancel(thread_id, run["run_id"], wait=wait)
        await client.runs.join(thread_id, run["run_id"])
        ended = await client.runs.get(thread_id, run["run_id"])
        cancelled[str(wait).lower()] = ended["status"]
    # The sidebar's search: sorted by id, only the selected fields.
    for name in ("sdk-b", "sdk-c", "sdk-a"):
        await client.threads.create(thread_id=name, metadata={"suite": "python"})
    searched = await client.threads.search(
        metadata={"suite": "python"},
        sort_by="thread_id",
        sort_order="asc",
        select=["thread_id", "metadata"],
    )
    print(json.dumps({
        "searched": [[t["thread_id"], sorted(t)] for t in searched],
        "frames": frames,
        "task_events": task_events,
        "state_messages": state["values"]["messages"],
        "run_status": runs[0]["status"],
        "joined_messages": len(joined["messages"]),
        "cancelled": cancelled,
    }))


asyncio.run(main(sys.argv[1]))
