"""``lra-bench data download lra-release``: a resumable download of the official LRA tarball, unpacked
atomically into the data dir (it holds ``lra_release/{listops-1000,tsv_data,pathfinder32,...}``).

The transfer goes to ``<file>.part`` and continues from its size with an HTTP ``Range`` request after an
interruption (in the same call, up to ``retries`` times, or in a later call); a server that ignores the
range restarts it. The size (and the sha256, when given) is checked before the archive is unpacked into a
temporary folder next to the target, which is then renamed into place: a reader never sees half a tree.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import shutil
import socket
import ssl
import tarfile
import tempfile
import time
import urllib.error
import urllib.request

from tasks.base import DataError

LRA_RELEASE_URL = "https://storage.googleapis.com/long-range-arena/lra_release.gz"  # LRA README
CHUNK = 1 << 20
TRANSIENT_HTTP = (429, 500, 502, 503, 504)  # too many requests, server errors: retried like a cut transfer


class DownloadError(DataError):
  """The transfer failed or the file does not match its expected size / checksum (the message says which,
  and whether rerunning resumes it)."""


def _total_size(response, offset: int) -> int | None:
  content_range = response.headers.get("Content-Range")
  if content_range and "/" in content_range:
    total = content_range.rsplit("/", 1)[1]
    return int(total) if total.isdigit() else None
  length = response.headers.get("Content-Length")
  return int(length) + offset if length and length.isdigit() else None


def fetch(url: str, path: str, *, size: int | None = None, sha256: str | None = None, retries: int = 5,
          timeout: float = 60.0, backoff: float = 1.0, progress: bool = True) -> str:
  """Downloads ``url`` to ``path`` (resuming ``path + '.part'``); returns ``path``."""
  from tqdm import tqdm

  if os.path.exists(path):
    _verify(path, size, sha256)
    return path
  part = path + ".part"
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  attempt = 0
  with tqdm(unit="B", unit_scale=True, desc=os.path.basename(path), disable=not progress) as bar:
    while True:
      offset = os.path.getsize(part) if os.path.exists(part) else 0
      request = urllib.request.Request(url, headers={"Range": f"bytes={offset}-"} if offset else {})
      try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
          if offset and response.status != 206:  # the server ignored the range: start over
            logging.info("%s does not support ranges; restarting the download", url)
            offset = 0
          total = _total_size(response, offset)
          bar.reset(total=total)
          bar.update(offset)
          with open(part, "ab" if offset else "wb") as f:
            while chunk := response.read(CHUNK):
              f.write(chunk)
              bar.update(len(chunk))
        if total is not None and os.path.getsize(part) < total:
          raise http.client.IncompleteRead(b"", total - os.path.getsize(part))
        break
      except urllib.error.HTTPError as err:
        if err.code == 416 and offset:  # range not satisfiable: the part is already complete
          break
        if err.code not in TRANSIENT_HTTP or attempt >= retries:
          raise DownloadError(f"{url}: HTTP {err.code} {err.reason}") from None
        attempt += 1
        logging.warning("HTTP %d %s; retrying (%d/%d)", err.code, err.reason, attempt, retries)
        time.sleep(min(backoff * 2.0 ** attempt, 30.0))
      except (http.client.HTTPException, urllib.error.URLError, ConnectionError, TimeoutError) as err:
        if not transient(err):
          raise DownloadError(f"{url}: {_reason(err)} (not retried: check the URL, the network or the "
                              "proxy, then run the same command again)") from None
        attempt += 1
        if attempt > retries:
          raise DownloadError(f"{url}: transfer interrupted ({err}); run the same command again to "
                              f"resume from {os.path.getsize(part) if os.path.exists(part) else 0} bytes") from None
        logging.warning("transfer interrupted (%s); resuming (%d/%d)", err, attempt, retries)
        time.sleep(min(backoff * 2.0 ** attempt, 30.0))
  _verify(part, size, sha256)
  os.replace(part, path)
  return path


def _reason(err: BaseException) -> str:
  reason = getattr(err, "reason", None) if isinstance(err, urllib.error.URLError) else None
  err = reason if isinstance(reason, BaseException) else err
  return f"{type(err).__name__}: {' '.join(str(err).split())}"


def transient(err: BaseException) -> bool:
  """Whether a failed transfer may succeed if tried again: a timeout, a reset or cut connection, a
  temporary name-resolution failure. A refused connection, a missing file (``file://``), an unknown
  host or a certificate error is permanent: retrying only delays the message."""
  if isinstance(err, urllib.error.URLError) and isinstance(err.reason, BaseException):
    err = err.reason
  if isinstance(err, urllib.error.URLError):  # a reason given as text: "unknown url type", ...
    return "timed out" in str(err.reason)
  if isinstance(err, (http.client.IncompleteRead, http.client.RemoteDisconnected)):
    return True
  if isinstance(err, socket.gaierror):
    return err.errno == socket.EAI_AGAIN  # "temporary failure in name resolution"
  if isinstance(err, ssl.SSLCertVerificationError):
    return False
  return isinstance(err, (TimeoutError, ConnectionResetError, ConnectionAbortedError, BrokenPipeError,
                          ssl.SSLError))


def _verify(path: str, size: int | None, sha256: str | None) -> None:
  actual = os.path.getsize(path)
  if size is not None and actual != size:
    raise DownloadError(f"{path}: {actual} bytes, expected {size}")
  if sha256:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
      while chunk := f.read(CHUNK):
        digest.update(chunk)
    if digest.hexdigest() != sha256.lower():
      os.remove(path)
      raise DownloadError(f"{path}: sha256 {digest.hexdigest()} does not match {sha256}; removed it")


def unpack(archive: str, data_dir: str) -> list[str]:
  """Extracts a (gzipped) tar into ``data_dir``: into a temporary folder first, then each top-level
  entry is renamed into place (entries already there are kept). Returns the top-level paths."""
  os.makedirs(data_dir, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=".tmp-unpack-", dir=data_dir)
  try:
    with tarfile.open(archive) as tar:
      tar.extractall(tmp, filter="data")
    placed = []
    for name in sorted(os.listdir(tmp)):
      target = os.path.join(data_dir, name)
      if os.path.exists(target):
        logging.info("%s already exists; keeping it", target)
      else:
        os.replace(os.path.join(tmp, name), target)
      placed.append(target)
    return placed
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def download_lra_release(data_dir: str, *, url: str = LRA_RELEASE_URL, sha256: str | None = None,
                         size: int | None = None, keep_archive: bool = True, retries: int = 5,
                         backoff: float = 1.0, progress: bool = True) -> str:
  """Fetches and unpacks the LRA release into ``data_dir``; returns ``<data_dir>/lra_release``."""
  target = os.path.join(data_dir, "lra_release")
  if os.path.isdir(target):
    logging.info("%s already exists", target)
    return target
  archive = os.path.join(data_dir, os.path.basename(url.split("?")[0]) or "lra_release.gz")
  fetch(url, archive, size=size, sha256=sha256, retries=retries, backoff=backoff, progress=progress)
  placed = unpack(archive, data_dir)
  if not keep_archive:
    os.remove(archive)
  if not os.path.isdir(target):
    raise DownloadError(f"{archive} did not contain lra_release/ (found {', '.join(map(os.path.basename, placed))})")
  return target
