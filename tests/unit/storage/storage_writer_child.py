"""Writes to an SQLiteStore until killed, printing "<key> <revision>" for each acknowledged write.

Usage: python storage_writer_child.py DATA_DIR [WRITERS]
"""

from __future__ import annotations

import asyncio
import sys

from kubeplane.storage import open_store


async def main(data_dir: str, writers: int) -> None:
    store = await open_store("sqlite", data_dir)
    out = sys.stdout

    async def writer(n: int) -> None:
        i = 0
        while True:
            key = f"/registry/core/pods/w{n}/p{i:06d}"
            kv = await store.create(key, {"metadata": {"name": f"p{i}"}, "spec": {"writer": n, "i": i}})
            if i % 4 == 3:
                kv = await store.update(key, {"metadata": {"name": f"p{i}"}, "spec": {"updated": True}})
            out.write(f"{key} {kv.mod_revision}\n")
            out.flush()
            i += 1

    print("ready", flush=True)
    await asyncio.gather(*(writer(n) for n in range(writers)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 8))
