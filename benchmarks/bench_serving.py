"""Chapter 15's load test: `transformer-course serve` (continuous batching over a paged KV cache, chapter 15) against
the same server decoding one request at a time (`--max-batch 1`, as the server did before chapter 15), both started
here as processes on 127.0.0.1 (each level measured on one, then on the other) and driven by the official `openai`
async client with 1, 4, 16 and 64 concurrent streams of chat requests to the shipped chat model.

    python benchmarks/bench_serving.py            # both servers, 1, 4, 16 and 64 streams
    python benchmarks/bench_serving.py --quick    # fewer requests (a smoke run)

Writes benchmarks/results/serving.md (the table chapter 15 shows) and serving.json. Per level: total tokens
per second over the level's wall time, time to first token (TTFT: request sent to first streamed text) and
inter-token latency (ITL: between two streamed pieces of one reply), p50 and p99 over all requests. Every
request asks 40 tokens (`ignore_eos`, vLLM's extension: the chat model's own replies end after about 6
tokens, and a load test of 6-token replies measures HTTP rather than decoding) at temperature 1 with its own
seed, so both servers must write the same replies (checked). After the 64-stream level the batched server's
/metrics must show every KV cache block free.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import machine

RESULTS = Path(__file__).resolve().parent / "results" / "serving.md"
RESULTS_JSON = RESULTS.with_suffix(".json")
LEVELS = (1, 4, 16, 64)
WORDS = ["rose", "king", "night", "crown", "stars", "moon", "sword", "queen", "heart", "ghost", "blood", "time",
         "gentle", "sorrow", "honour", "summer"]
MODEL = "shakespeare_chat"
MAX_TOKENS = 40  # every reply this long (ignore_eos): the prompts are 17-20 tokens, the context 64


def start(max_batch: int) -> tuple[subprocess.Popen, str]:
    """`transformer-course serve` on a free port, one torch thread; its process and URL."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen([sys.executable, "-m", "transformer_course.cli", "serve", "--port", "0",
                                "--max-batch", str(max_batch)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env)
    first = process.stdout.readline()
    found = re.search(r"at (http://127\.0\.0\.1:\d+)/", first)
    if not found:
        process.kill()
        raise RuntimeError(f"the server did not start: {first} {process.stderr.read()}")
    return process, found.group(1)


def spec(i: int) -> dict:
    """Request i: a chat turn (upper-case or reverse a word), sampled at temperature 1 with seed i."""
    kind = ("upper", "reverse")[i % 2]
    return {"messages": [{"role": "user", "content": f"{kind}: {WORDS[i % len(WORDS)]}"}],
            "max_tokens": MAX_TOKENS, "temperature": 1.0, "seed": i, "extra_body": {"ignore_eos": True}}


async def one(client, i: int) -> dict:
    """One streamed request: its text, token count, TTFT and the gaps between its pieces (seconds)."""
    sent, times, text, tokens = time.perf_counter(), [], [], 0
    stream = await client.chat.completions.create(model=MODEL, stream=True, stream_options={"include_usage": True},
                                                  **spec(i))
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            times.append(time.perf_counter())
            text.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    ttft = (times[0] if times else time.perf_counter()) - sent
    return {"i": i, "text": "".join(text), "tokens": tokens, "ttft": ttft,
            "gaps": [b - a for a, b in zip(times, times[1:], strict=False)]}


async def level(url: str, streams: int, total: int) -> dict:
    """``streams`` concurrent clients sharing ``total`` requests (each client asks its next when one ends)."""
    import openai

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="-", max_retries=0, timeout=600)
    queue = list(range(total))
    records: list[dict] = []

    async def worker():
        while queue:
            records.append(await one(client, queue.pop(0)))

    start_time = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(streams)))
    seconds = time.perf_counter() - start_time
    await client.close()
    return {"streams": streams, "requests": total, "seconds": seconds, "records": sorted(records, key=lambda r: r["i"])}


def quantile(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def summarise(run: dict) -> dict:
    records = run["records"]
    tokens = sum(r["tokens"] for r in records)
    gaps = [g for r in records for g in r["gaps"]] or [0.0]
    ttft = [r["ttft"] for r in records]
    return {"streams": run["streams"], "requests": run["requests"], "tokens": tokens,
            "seconds": round(run["seconds"], 3), "tokens_per_s": round(tokens / run["seconds"], 1),
            "ttft_p50_ms": round(1000 * quantile(ttft, 0.5), 1), "ttft_p99_ms": round(1000 * quantile(ttft, 0.99), 1),
            "itl_p50_ms": round(1000 * quantile(gaps, 0.5), 2), "itl_p99_ms": round(1000 * quantile(gaps, 0.99), 2)}


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) the process ``pid`` has used so far: what the server spent, whatever else runs."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def metrics(url: str) -> dict[str, float]:
    import httpx

    text = httpx.get(url + "/metrics", timeout=60).text
    return {ln.split()[0].removeprefix("transformer_course_"): float(ln.split()[1])
            for ln in text.splitlines() if ln and not ln.startswith("#")}


def measure(quick: bool) -> tuple[dict[int, list], dict[int, dict], dict]:
    """Both servers started at once (one is idle while the other is measured), every level run against one
    then the other, so that a change in the machine's load falls on both: summaries and replies per server
    (max_batch), and the batched server's /metrics after the last level."""
    servers = {max_batch: start(max_batch) for max_batch in (1, 64)}
    rows: dict[int, list] = {1: [], 64: []}
    texts: dict[int, dict] = {1: {}, 64: {}}
    try:
        for _, url in servers.values():
            asyncio.run(level(url, 4, 8))  # warm-up, not counted
        for streams in LEVELS:
            total = max(16, streams) if quick else max(64, 2 * streams)
            for max_batch, (process, url) in servers.items():
                cpu, client = cpu_seconds(process.pid), cpu_seconds(os.getpid())
                run = asyncio.run(level(url, streams, total))
                rows[max_batch].append(summarise(run))
                spent = cpu_seconds(process.pid) - cpu
                rows[max_batch][-1]["server_cpu_s"] = round(spent, 2)
                rows[max_batch][-1]["client_cpu_s"] = round(cpu_seconds(os.getpid()) - client, 2)
                rows[max_batch][-1]["tokens_per_cpu_s"] = round(rows[max_batch][-1]["tokens"] / max(spent, 0.01), 1)
                texts[max_batch][streams] = [r["text"] for r in run["records"]]
                print(f"max_batch {max_batch:2}, {streams:2} streams: {rows[max_batch][-1]}", flush=True)
        after = metrics(servers[64][1])
    finally:
        for process, _ in servers.values():
            process.terminate()
            process.communicate(timeout=60)
    return rows, texts, after


def write(info: dict, load0: float, batched: list[dict], alone: list[dict], after: dict, same: bool,
          quick: bool) -> None:
    by = {r["streams"]: r for r in alone}
    lines = ["# Serving many users: continuous batching against one request at a time (chapter 15)", "",
             f"{machine.markdown_line(info)} Load average at start / end: {load0:.1f} / {os.getloadavg()[0]:.1f}.",
             "", f"Command: `python benchmarks/bench_serving.py{' --quick' if quick else ''}`", "",
             "Both servers are `transformer-course serve` of the shipped chat model (one torch thread) on 127.0.0.1, "
             "driven by the `openai` async client from another process; *one at a time* is `--max-batch 1`. Each "
             "request: a chat turn (17-20 tokens), "
             f"{MAX_TOKENS} tokens written (`ignore_eos`, as vLLM's benchmark does: the model's own replies end after "
             "about 6), temperature 1, its own seed, streamed. TTFT: request sent to "
             "first text; ITL: between two pieces of one reply.", "",
             "| server | streams | requests | tokens | tokens/s | vs one at a time | tokens per server CPU s "
             "| client CPU s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, rows in (("continuous batching", batched), ("one at a time", alone)):
        for r in rows:
            ratio = r["tokens_per_s"] / by[r["streams"]]["tokens_per_s"]
            lines.append(f"| {name} | {r['streams']} | {r['requests']} | {r['tokens']} | {r['tokens_per_s']:.0f} | "
                         f"**{ratio:.1f}x** | {r['tokens_per_cpu_s']:.0f} | {r['client_cpu_s']:.1f} | "
                         f"{r['ttft_p50_ms']:.0f} | "
                         f"{r['ttft_p99_ms']:.0f} | {r['itl_p50_ms']:.1f} | {r['itl_p99_ms']:.1f} |")
    b16, a16 = next(r for r in batched if r["streams"] == 16), by[16]
    ratio, per_cpu = b16["tokens_per_s"] / a16["tokens_per_s"], b16["tokens_per_cpu_s"] / a16["tokens_per_cpu_s"]
    lines += ["", "Goals (issue 54):", "",
              f"- 16 streams: {ratio:.1f}x the tokens/s of one at a time (goal: at least 5x): "
              f"{'met' if ratio >= 5 else f'missed by {5 - ratio:.1f}x'}; per second of the server's own CPU time "
              f"(what other work on the machine cannot take away): {per_cpu:.1f}x.",
              f"- 16 streams: TTFT p99 {b16['ttft_p99_ms']:.0f} ms against one at a time's p50 "
              f"{a16['ttft_p50_ms']:.0f} ms (goal: below): "
              f"{'met' if b16['ttft_p99_ms'] < a16['ttft_p50_ms'] else 'missed'}.",
              f"- every reply identical between the two servers (same seeds): {same}.",
              f"- after the 64-stream run: {after.get('kv_cache_blocks_used', -1):.0f} of "
              f"{after.get('kv_cache_blocks_total', -1):.0f} KV cache blocks in use, "
              f"{after.get('requests_running', -1):.0f} running, {after.get('requests_waiting', -1):.0f} waiting; "
              f"prefix cache: {after.get('prefix_cache_hits_total', 0):.0f} of "
              f"{after.get('prefix_cache_lookups_total', 0):.0f} prompt blocks reused.", ""]
    RESULTS.write_text("\n".join(lines))
    RESULTS_JSON.write_text(json.dumps({"meta": {"machine_info": info, "quick": quick}, "batched": batched,
                                        "one_at_a_time": alone, "metrics_after_64": after,
                                        "replies_identical": same}, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests per level (a smoke run)")
    args = parser.parse_args()
    info, load0 = machine.describe(), os.getloadavg()[0]
    rows, texts, after = measure(args.quick)
    write(info, load0, rows[64], rows[1], after, texts[1] == texts[64], args.quick)
    print(RESULTS.read_text())


if __name__ == "__main__":
    main()
