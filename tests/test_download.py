"""The LRA release download: resumable over HTTP Range (127.0.0.1 only), verified, unpacked atomically."""

import hashlib
import http.server
import io
import os
import socket
import subprocess
import sys
import tarfile
import threading

import pytest

from tasks import download

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
  state = {"blob": make_tarball(), "cut": 0, "ranges": [], "unavailable": 0}

  class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # http.server calls it by this name
      if state["unavailable"] > 0:  # the first ``unavailable`` requests get HTTP 503
        state["unavailable"] -= 1
        state["ranges"].append("503")
        self.send_error(503, "Service Unavailable")
        return
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


@pytest.fixture
def sleeps(monkeypatch):
  """The back-off sleeps of ``fetch`` (recorded, not slept): one per retry."""
  calls = []
  monkeypatch.setattr(download.time, "sleep", calls.append)
  return calls


def _refused_url() -> str:
  with socket.socket() as sock:  # a port nobody listens on once this socket is closed
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
  return f"http://127.0.0.1:{port}/lra_release.gz"


def test_refused_connection_is_not_retried(tmp_path, sleeps):
  """Issue 30 item 15: a refused connection was retried 5 times (with back-off) before the message."""
  with pytest.raises(download.DownloadError) as err:
    download.fetch(_refused_url(), str(tmp_path / "a.gz"), retries=5, progress=False)
  assert "ConnectionRefusedError" in str(err.value) and "not retried" in str(err.value)
  assert sleeps == []


def test_missing_file_is_not_retried(tmp_path, sleeps):
  url = (tmp_path / "no_such.gz").as_uri()
  with pytest.raises(download.DownloadError, match=r"FileNotFoundError: .*no_such\.gz.*not retried"):
    download.fetch(url, str(tmp_path / "a.gz"), retries=5, progress=False)
  assert sleeps == []


def test_transient_errors_are_still_retried(server, tmp_path, sleeps):
  server["cut"], server["unavailable"] = 1, 2
  download.fetch(server["url"], str(tmp_path / "a.gz"), retries=5, progress=False)
  assert (tmp_path / "a.gz").read_bytes() == server["blob"]
  assert len(sleeps) == 3 and server["ranges"][:2] == ["503", "503"]  # two 503s, one cut transfer


def test_persistent_http_503_gives_up_after_the_retries(server, tmp_path, sleeps):
  server["unavailable"] = 9
  with pytest.raises(download.DownloadError, match="HTTP 503"):
    download.fetch(server["url"], str(tmp_path / "a.gz"), retries=2, progress=False)
  assert len(sleeps) == 2


@pytest.mark.parametrize("value", ["xyz", "0" * 63, "g" * 64, ""])
def test_cli_sha256_must_be_64_hex_digits(tmp_path, value):
  env = dict(os.environ, PYTHONPATH=REPO)
  proc = subprocess.run([sys.executable, "-m", "lra_bench", "data", "download", "lra-release", "--data_dir",
                         str(tmp_path / "data"), "--url", _refused_url(), f"--sha256={value}"],
                        capture_output=True, text=True, env=env, timeout=300)
  assert proc.returncode == 2
  assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("error: ")
  assert "--sha256" in proc.stderr and "64 hexadecimal digits" in proc.stderr
  assert not (tmp_path / "data").exists()
