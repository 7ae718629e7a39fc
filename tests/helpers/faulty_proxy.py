"""An HTTP proxy on 127.0.0.1 that fails some requests on their way to a
storage server (the tests' fake-gcs-server), as object storage does at pod
scale: HTTP 503 and 429, connections reset before an answer, and slow
answers.

A seeded draw picks which requests fail, up to `max_faults` of them and
only while `until` (seconds from the start) has not passed; `always`
fails every request whose path matches a regex with a fixed status
(storage that stays broken, for the errors a run must give up with).
`counts` says what was done: requests forwarded and faults by kind.
"""

import collections
import http.client
import http.server
import random
import re
import socket
import struct
import threading
import time
import urllib.parse

KINDS = ("503", "429", "reset", "slow")
_HOP_BY_HOP = {
    "connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
    "proxy-connection", "content-length"
}


class FaultyProxy:
  """Forwards to `upstream` (http://HOST:PORT), failing a `share` of
  requests with the `kinds` of KINDS (see the module doc)."""

  def __init__(self, upstream: str, share: float = 0.1, kinds=KINDS,
               max_faults: int = 1000, until: float = 600.0, seed: int = 0,
               slow_s: float = 1.0, always: str = None, status: int = 503):
    target = urllib.parse.urlparse(upstream)
    self.upstream = (target.hostname, target.port)
    self.share, self.kinds, self.slow_s = share, tuple(kinds), slow_s
    self.max_faults, self.deadline = max_faults, time.time() + until
    self.always = re.compile(always) if always else None
    self.status = status
    self.counts = collections.Counter()
    self._random = random.Random(seed)
    self._lock = threading.Lock()
    proxy = self

    class Handler(http.server.BaseHTTPRequestHandler):
      protocol_version = "HTTP/1.1"  # Keep-alive, as the clients expect.

      def log_message(self, *args):
        del args

      def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
          chunks = []
          while True:
            size = int(self.rfile.readline().split(b";")[0], 16)
            chunks.append(self.rfile.read(size))
            self.rfile.readline()
            if not size:
              return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length", 0)))

      def _answer(self, status: int, body: bytes, headers=()):
        self.send_response(status)
        for name, value in headers:
          self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
          self.wfile.write(body)

      def _handle(self):
        body = self._body()
        fault = proxy._draw(self.path)
        if fault == "reset":
          # SO_LINGER 0: closing sends RST, an abrupt "connection reset".
          self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                     struct.pack("ii", 1, 0))
          self.close_connection = True
          return
        if fault in ("503", "429", "always"):
          status = proxy.status if fault == "always" else int(fault)
          message = f"injected {status} by the test's proxy"
          self._answer(status, (f'{{"error": {{"code": {status}, '
                                f'"message": "{message}"}}}}').encode(),
                       [("Content-Type", "application/json")])
          return
        if fault == "slow":
          time.sleep(proxy.slow_s)
        upstream = http.client.HTTPConnection(*proxy.upstream, timeout=120)
        headers = {
            k: v
            for k, v in self.headers.items()
            if k.lower() not in _HOP_BY_HOP
        }
        upstream.request(self.command, self.path, body=body or None,
                         headers=headers)
        response = upstream.getresponse()
        data = response.read()
        upstream.close()
        self._answer(response.status, data, [(k, v)
                                             for k, v in response.getheaders()
                                             if k.lower() not in _HOP_BY_HOP])

      do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _handle

    class Server(http.server.ThreadingHTTPServer):
      daemon_threads = True

      def handle_error(self, request, client_address):
        del request, client_address  # A client that hung up: not news.

    self._server = Server(("127.0.0.1", 0), Handler)
    self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
    self._thread = threading.Thread(target=self._server.serve_forever,
                                    daemon=True)

  def _draw(self, path: str):
    """The fault for this request, or None (counted in `counts`)."""
    with self._lock:
      self.counts["requests"] += 1
      if self.always is not None and self.always.search(path):
        self.counts["always"] += 1
        return "always"
      faults = sum(self.counts[k] for k in self.kinds)
      if (faults >= self.max_faults or time.time() > self.deadline or
          self._random.random() >= self.share):
        return None
      kind = self._random.choice(self.kinds)
      self.counts[kind] += 1
      return kind

  def start(self) -> "FaultyProxy":
    self._thread.start()
    return self

  def stop(self):
    self._server.shutdown()
    self._server.server_close()
