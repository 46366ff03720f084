"""The LRA release download: resumable over HTTP Range (127.0.0.1 only), verified, unpacked atomically."""

import hashlib
import http.server
import io
import os
import tarfile
import threading

import pytest

from tasks import download


def make_tarball() -> bytes:
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode="w:gz") as tar:
    for name, data in [("lra_release/tsv_data/new_aan_pairs.test.tsv", b"1\ta\tb\tx\ty\n" * 2000),
                       ("lra_release/listops-1000/basic_test.tsv", os.urandom(50_000))]:
      info = tarfile.TarInfo(name)
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  return buf.getvalue()


@pytest.fixture
def server():
  """Serves one blob; honours ``Range: bytes=N-``; the first ``cut`` responses stop halfway."""
  state = {"blob": make_tarball(), "cut": 0, "ranges": []}

  class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
      blob = state["blob"]
      start = 0
      header = self.headers.get("Range")
      state["ranges"].append(header)
      if header:
        start = int(header.split("=")[1].split("-")[0])
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{len(blob) - 1}/{len(blob)}")
      else:
        self.send_response(200)
      self.send_header("Content-Length", str(len(blob) - start))
      self.end_headers()
      body = blob[start:]
      if state["cut"] > 0:
        state["cut"] -= 1
        body = body[:len(body) // 2]
      self.wfile.write(body)
      self.wfile.flush()
      self.close_connection = True

    def log_message(self, *args):
      pass

  httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
  thread = threading.Thread(target=httpd.serve_forever, daemon=True)
  thread.start()
  state["url"] = f"http://127.0.0.1:{httpd.server_address[1]}/lra_release.gz"
  yield state
  httpd.shutdown()


def test_interrupted_transfer_resumes_and_unpacks(server, tmp_path):
  server["cut"] = 1
  sha = hashlib.sha256(server["blob"]).hexdigest()
  path = download.download_lra_release(str(tmp_path), url=server["url"], sha256=sha, backoff=0.0,
                                       progress=False)
  assert path == str(tmp_path / "lra_release")
  assert server["ranges"][0] is None and server["ranges"][1].startswith("bytes=")  # resumed, not restarted
  assert int(server["ranges"][1].split("=")[1].rstrip("-")) > 0
  assert open(tmp_path / "lra_release" / "tsv_data" / "new_aan_pairs.test.tsv", "rb").read().count(b"\n") == 2000
  assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp")]
  assert download.download_lra_release(str(tmp_path), url=server["url"], progress=False) == path  # idempotent


def test_resume_across_calls_and_checksum(server, tmp_path):
  server["cut"] = 1
  with pytest.raises(download.DownloadError, match="resume"):
    download.fetch(server["url"], str(tmp_path / "a.gz"), retries=0, backoff=0.0, progress=False)
  part = tmp_path / "a.gz.part"
  assert 0 < part.stat().st_size < len(server["blob"])
  download.fetch(server["url"], str(tmp_path / "a.gz"), size=len(server["blob"]), retries=0, progress=False)
  assert (tmp_path / "a.gz").read_bytes() == server["blob"] and server["ranges"][-1].startswith("bytes=")
  with pytest.raises(download.DownloadError, match="sha256"):
    download.fetch(server["url"], str(tmp_path / "b.gz"), sha256="0" * 64, progress=False)
