"""A client connection's line to the aiohttp app, for the routes the HTTP front does not answer itself: an
in-process socket pair whose far end the app's server accepts as if a client had connected, one request at a
time, its whole answer read back (http_front.py copies it to the client unchanged).
"""

from __future__ import annotations

import asyncio
import socket

try:
    import httptools
except ImportError as e:  # the serve extra
    raise ImportError(f'resnet_native.serve: the HTTP server needs httptools ({e.name} is not installed): '
                      f'pip install "resnet_native[serve]"') from e


class AppRelay(asyncio.Protocol):
    """The client connection's line to the aiohttp app: one request at a time, its whole answer back."""

    @classmethod
    async def open(cls, app_server) -> AppRelay:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        try:
            await loop.connect_accepted_socket(app_server, theirs)
            _, relay = await loop.create_unix_connection(cls, sock=ours)
        except BaseException:
            ours.close()
            theirs.close()
            raise
        return relay

    def connection_made(self, transport) -> None:
        self.transport, self.waiter, self.chunks, self.head_only = transport, None, [], False

    def exchange(self, data: bytes, *, head_only: bool):
        """A future of (the answer's bytes, whether the app keeps the connection)."""
        if self.transport is None:
            raise ConnectionError("the app closed the connection")
        self.parser, self.chunks, self.head_only = httptools.HttpResponseParser(self), [], head_only
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return self.waiter

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._done(ConnectionError(f"the app's answer is malformed ({e})"))

    def on_headers_complete(self) -> None:
        if self.head_only:
            self._done()

    def on_message_complete(self) -> None:
        self._done()

    def _done(self, error=None) -> None:
        if self.waiter is None or self.waiter.done():
            return
        if error is not None:
            self.waiter.set_exception(error)
        else:
            self.waiter.set_result((b"".join(self.chunks), self.parser.should_keep_alive()))

    def connection_lost(self, exc) -> None:
        self.transport = None
        self._done(ConnectionError("the app closed the connection"))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
