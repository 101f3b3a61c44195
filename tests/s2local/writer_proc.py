"""A writer process for concurrency and crash tests: appends tagged batches, logs every ack it receives.

    python -m tests.s2local.writer_proc PORT BASIN STREAM WRITER_ID BATCHES BATCH_SIZE ACK_LOG
Body of record i of batch b: b"{writer}:{b}:{i}". Ack log line: "{b} {start} {end}", flushed per ack.
"""

import asyncio
import sys

import s2_sdk


async def main(port: int, basin: str, stream: str, writer: str, batches: int, size: int, log_path: str) -> None:
    url = f"http://127.0.0.1:{port}"
    retry = s2_sdk.Retry(append_retry_policy=s2_sdk.AppendRetryPolicy.NO_SIDE_EFFECTS)
    async with s2_sdk.S2("local", endpoints=s2_sdk.Endpoints(account=url, basin=url), retry=retry) as client:
        target = client.basin(basin).stream(stream)
        with open(log_path, "a", buffering=1) as log:
            async with target.append_session() as session:
                pending = []
                for b in range(batches):
                    records = [s2_sdk.Record(body=f"{writer}:{b}:{i}".encode()) for i in range(size)]
                    pending.append((b, await session.submit(s2_sdk.AppendInput(records=records))))
                    while pending and (len(pending) > 20 or b == batches - 1):
                        number, ticket = pending.pop(0)
                        ack = await ticket
                        log.write(f"{number} {ack.start.seq_num} {ack.end.seq_num}\n")


if __name__ == "__main__":
    port, basin, stream, writer, batches, size, log_path = sys.argv[1:]
    asyncio.run(main(int(port), basin, stream, writer, int(batches), int(size), log_path))
