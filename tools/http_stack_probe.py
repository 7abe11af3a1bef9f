"""Per-core HTTP/1.1 throughput of candidate Python stacks (aiohttp, aiohttp on uvloop, a bare httptools protocol
on uvloop): each server pinned to core 0, an asyncio keep-alive client to core 1, 4 s per row.

    python tools/http_stack_probe.py aiohttp aiohttp-uvloop httptools        # needs uvloop and httptools
"""

import asyncio
import multiprocessing as mp
import os
import sys
import time

BODY = b"x" * 3200
RESP = b'{"model_name":"m","outputs":[{"name":"logits","datatype":"FP32","shape":[1,10],"data":[0,1,2,3,4,5,6,7,8,9]}]}'


def serve(kind, port, ready):
    os.sched_setaffinity(0, {0})
    if kind in ("aiohttp-uvloop", "httptools"):
        import uvloop

        uvloop.install()
    if kind.startswith("aiohttp"):
        from aiohttp import web

        async def h(req):
            await req.read()
            return web.Response(body=RESP, content_type="application/json")

        app = web.Application()
        app.router.add_post("/v2/models/m/infer", h)

        async def main():
            r = web.AppRunner(app, access_log=None)
            await r.setup()
            await web.TCPSite(r, "127.0.0.1", port).start()
            ready.set()
            await asyncio.Event().wait()

        asyncio.run(main())
    else:
        import httptools

        class P(asyncio.Protocol):
            def connection_made(self, t):
                self.t = t
                self.p = httptools.HttpRequestParser(self)
                self.body = []

            def data_received(self, d):
                self.p.feed_data(d)

            def on_url(self, u):
                self.url = u

            def on_body(self, b):
                self.body.append(b)

            def on_message_complete(self):
                self.body = []
                self.t.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(RESP)
                    + RESP
                )

        async def main():
            loop = asyncio.get_running_loop()
            await loop.create_server(P, "127.0.0.1", port)
            ready.set()
            await asyncio.Event().wait()

        asyncio.run(main())


def client(port, conns, seconds, out):
    os.sched_setaffinity(0, {1})
    import uvloop

    uvloop.install()
    req = (
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
        b"Content-Length: %d\r\n\r\n" % len(BODY)
    ) + BODY

    async def one(stop, counts):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        while time.monotonic() < stop:
            w.write(req)
            head = await r.readuntil(b"\r\n\r\n")
            n = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await r.readexactly(n)
            counts[0] += 1
        w.close()

    async def main():
        counts = [0]
        stop = time.monotonic() + seconds
        await asyncio.gather(*(one(stop, counts) for _ in range(conns)))
        return counts[0]

    t = time.monotonic()
    n = asyncio.run(main())
    out.put(n / (time.monotonic() - t))


if __name__ == "__main__":
    for kind in sys.argv[1:]:
        ready = mp.Event()
        port = 18000 + hash(kind) % 1000
        s = mp.Process(target=serve, args=(kind, port, ready), daemon=True)
        s.start()
        ready.wait(20)
        for conns in (1, 16):
            q = mp.Queue()
            c = mp.Process(target=client, args=(port, conns, 4, q))
            c.start()
            c.join()
            print(f"{kind:16s} conns={conns:3d} req/s={q.get():8.0f}", flush=True)
        s.kill()
