"""Pathfinder (32x32, LRA "Pathfinder") and Path-X (128x128): the release layout, a generator that writes
it (``tasks.pathfinder_gen``), and a reader for it (generated here or the official ``lra_release``).

Layout (docs/generators.md §2.6), under ``<data_dir>`` or ``<data_dir>/lra_release`` (and under
``<data_dir>/<name>`` for a named variant such as the smoke protocol's):

  pathfinder<W>/<difficulty dir>/imgs/<batch>/sample_<i>.png
  pathfinder<W>/<difficulty dir>/metadata/<batch>.npy    # text, one line per image:
      imgs/<batch> sample_<i>.png <i> <label> <continuity> <contour> <distractor len> <paddle len>
      <paddle thickness> <paddle margin> <#paddle contrasts>

and, for generated data only: ``<difficulty dir>/lra_bench_meta.json`` (the generation options, written
first) and ``<difficulty dir>/lra_bench_sha256/<batch>.json`` (the sha256 of each file of the batch: its
PNGs and its metadata file), written just before that batch's ``metadata/<batch>.npy``, which marks the
batch complete. A ``data prepare`` re-checks every file of every batch against them and generates a batch
with a damaged file (cut short, overwritten, missing) again, naming the file; a read (training) checks
the metadata files each time and the PNGs when it decodes them, and refuses a damaged one with the
command that regenerates it (``tasks.checksums``). Batches generated before the checksums were kept get
them from a prepare that finds them whole.

Difficulty dirs: contour 6 ``curv_baseline``, 9 ``curv_contour_length_9``, 14 ``curv_contour_length_14``.

Reading: the PNGs are decoded once and cached as one uint8 ``.npy`` (pixels, row-major) plus labels in
``<difficulty dir>/lra_bench_cache/`` (atomic writes; keyed by the metadata files' names, sizes and
mtimes), so training starts in seconds and the tf.data pipeline is a plain array slice. Empty and
undecodable PNGs (the release has an empty ``curv_baseline/imgs/0/sample_172.png``) are skipped and
counted in one log line. The split is a seeded permutation cut 80/10/10 (``split_seed``, default 0),
independent of the run seed. Pixels become tokens pixel + 1 (vocab 257), or normalised floats.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import io
import json
import logging
import multiprocessing
import os
import pickle
import re
import shutil
from typing import Callable, ClassVar

import numpy as np

from tasks import checksums, register_task
from tasks import pathfinder_gen as gen
from tasks.base import (PIXEL_VOCAB, DataError, Examples, MissingDataError, Task, check_count, check_name,
                        fit_length_fn, import_tf, pid_alive, pixel_inputs_fn, read_meta)

DIFFICULTY_DIRS = {6: "curv_baseline", 9: "curv_contour_length_9", 14: "curv_contour_length_14"}
META_FILE = "lra_bench_meta.json"
CACHE_DIR = "lra_bench_cache"
CHECKSUM_DIR = "lra_bench_sha256"     # <batch>.json: {"batch": b, "sha256": {relative path: hex}}
GENERATOR_VERSION = "lra-bench pathfinder v1"
SPLIT_FRACTIONS = (0.8, 0.1)          # train, validation; test is the rest (LRA: 160k/20k/20k of 200k)
PIXEL_MEAN, PIXEL_STD = 127.5, 127.5  # floats: (x/255 - 0.5)/0.5, the S4 convention
IN_MEMORY_BYTES = 1 << 30             # larger splits are read from the memory-mapped cache


def difficulty_dir(root: str, resolution: int, contour_length: int) -> str:
  if contour_length not in DIFFICULTY_DIRS:
    raise ValueError(f"contour_length must be one of {sorted(DIFFICULTY_DIRS)}, got {contour_length}")
  return os.path.join(root, f"pathfinder{resolution}", DIFFICULTY_DIRS[contour_length])


def metadata_line(batch: int, index: int, label: int, res: gen.Resolution, contour_length: int,
                  margin: int) -> str:
  """The 11 release fields (e.g. ``imgs/0 sample_0.png 0 0 1.0 14 4 2 0.5 1 1``)."""
  fields = [f"imgs/{batch}", f"sample_{index}.png", index, label, float(res.continuity), contour_length,
            res.distractor_length(contour_length), res.paddle_length, res.paddle_thickness, margin, 1]
  return " ".join(map(str, fields))


def batch_seed(seed: int, resolution: int, contour_length: int, batch: int) -> np.random.Generator:
  """Each batch has its own stream, so the images do not depend on how batches go to workers."""
  return np.random.default_rng([seed, resolution, contour_length, batch])


def _write_atomic(path: str, data: bytes) -> None:
  tmp = f"{path}.tmp-{os.getpid()}"
  with open(tmp, "wb") as f:
    f.write(data)
  os.replace(tmp, path)


def generate_batch(job: tuple) -> int:
  """Writes ``imgs/<batch>/`` and then ``metadata/<batch>.npy`` (the marker of a finished batch)."""
  from PIL import Image

  out_dir, resolution, contour_length, batch, count, seed = job
  rng = batch_seed(seed, resolution, contour_length, batch)
  res = gen.RESOLUTIONS[resolution]
  tmp = os.path.join(out_dir, "imgs", f".tmp-{batch}-{os.getpid()}")
  shutil.rmtree(tmp, ignore_errors=True)
  os.makedirs(tmp)
  pools: dict = {}
  lines, sums = [], {}
  for i in range(count):
    sample = gen.generate_image(resolution, contour_length, rng, pools)
    png = io.BytesIO()
    Image.fromarray(sample.image, "L").save(png, format="PNG")  # the bytes a save to sample_<i>.png writes
    with open(os.path.join(tmp, f"sample_{i}.png"), "wb") as f:
      f.write(png.getvalue())
    sums[f"imgs/{batch}/sample_{i}.png"] = checksums.digest(png.getvalue())
    lines.append(metadata_line(batch, i, sample.label, res, contour_length, sample.margin))
  final = os.path.join(out_dir, "imgs", str(batch))
  shutil.rmtree(final, ignore_errors=True)
  os.replace(tmp, final)
  metadata = ("\n".join(lines) + "\n").encode()
  sums[f"metadata/{batch}.npy"] = checksums.digest(metadata)
  write_checksums(out_dir, batch, sums)  # before the marker: a batch marked complete has its checksums
  _write_atomic(os.path.join(out_dir, "metadata", f"{batch}.npy"), metadata)
  return count


def checksum_path(out_dir: str, batch: int) -> str:
  return os.path.join(out_dir, CHECKSUM_DIR, f"{batch}.json")


def write_checksums(out_dir: str, batch: int, sums: dict[str, str]) -> None:
  """Writes batch ``batch``'s checksums (``CHECKSUM_DIR``; keys: paths relative to ``out_dir``)."""
  os.makedirs(os.path.join(out_dir, CHECKSUM_DIR), exist_ok=True)
  checksums.write_json(checksum_path(out_dir, batch), {"batch": batch, checksums.KEY: sums})


def batch_files(batch: int, count: int) -> list[str]:
  """The files of a generated batch of ``count`` images, relative to its difficulty dir."""
  return [f"metadata/{batch}.npy"] + [f"imgs/{batch}/sample_{i}.png" for i in range(count)]


def read_checksums(out_dir: str, batch: int) -> dict[str, str] | None:
  """Batch ``batch``'s checksums ({path relative to ``out_dir``: hex sha256}); None when it has none (a
  batch generated before they were kept). An unreadable checksum file is a DataError naming it."""
  path = checksum_path(out_dir, batch)
  try:
    with open(path, encoding="utf-8") as f:
      record = json.load(f)
  except FileNotFoundError:
    return None
  except (OSError, ValueError) as err:
    raise DataError(f"{path}: unreadable checksums of batch {batch} ({type(err).__name__}: "
                    f"{' '.join(str(err).split())[:200]})") from None
  sums = record.get(checksums.KEY) if isinstance(record, dict) else None
  if not isinstance(sums, dict) or not all(isinstance(v, str) for v in sums.values()):
    raise DataError(f"{path}: not the checksums of an lra-bench batch (no {checksums.KEY} object)")
  return sums


@functools.lru_cache(maxsize=4096)
def _metadata_sum(out_dir: str, batch: int, size: int, mtime_ns: int) -> dict[str, str] | None:
  """``read_checksums`` of batch ``batch`` cut to its metadata file's entry (empty: not listed), cached
  while the checksum file's size and mtime stay the same: every read checks the metadata files, and
  parses each batch's checksum file once per process (not kept whole: a batch lists 1000 PNGs)."""
  del size, mtime_ns
  sums = read_checksums(out_dir, batch)
  key = f"metadata/{batch}.npy"
  return None if sums is None else {k: v for k, v in sums.items() if k == key}


def _stem_key(path: str):
  stem = os.path.splitext(os.path.basename(path))[0]
  return (0, int(stem), "") if stem.isdigit() else (1, 0, stem)


def metadata_files(out_dir: str) -> list[str]:
  return sorted(glob.glob(os.path.join(out_dir, "metadata", "*.npy")), key=_stem_key)


def read_metadata(out_dir: str) -> list[tuple[str, int]]:
  """(image path, label) per metadata line, in file order; malformed lines raise DataError(file:line)."""
  files = metadata_files(out_dir)
  if not files:
    raise MissingDataError(f"no metadata files in {os.path.join(out_dir, 'metadata')}")
  rows = []
  for path in files:
    rows.extend(read_metadata_file(out_dir, path))
  return rows


def read_metadata_file(out_dir: str, path: str) -> list[tuple[str, int]]:
  """(image path, label) per line of one metadata file; malformed lines raise DataError(file:line)."""
  with open(path, "rb") as f:
    raw = f.read()
  if not raw.strip():
    raise DataError(f"{path}: empty metadata file (an interrupted prepare or copy?); delete it and run "
                    "lra-bench data prepare again to regenerate that batch, or restore it")
  if raw.startswith(b"\x93NUMPY"):  # the original generator's np.save of a string array
    try:
      lines = [" ".join(map(str, row)) for row in np.load(io.BytesIO(raw), allow_pickle=False)]
    except (ValueError, OSError, EOFError) as err:
      raise DataError(f"{path}: unreadable numpy metadata file ({type(err).__name__}: {err})") from None
  else:
    try:
      lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as err:
      raise DataError(f"{path}: not a text metadata file ({err})") from None
  rows = []
  for lineno, line in enumerate(lines, start=1):
    fields = line.split()
    if not fields:
      continue
    if len(fields) < 4:
      raise DataError(f"{path}:{lineno}: expected at least 4 space-separated fields "
                      f"(subpath, file name, index, label), got {len(fields)}")
    if fields[3] not in ("0", "1"):
      raise DataError(f"{path}:{lineno}: label (field 4) must be 0 or 1, got {fields[3]!r}")
    rows.append((os.path.join(out_dir, fields[0], fields[1]), int(fields[3])))
  return rows


def decode_images(rows: list[tuple[str, int]], resolution: int,
                  verify: Callable[[str, bytes | None], None] | None = None) -> tuple[np.ndarray, np.ndarray, dict]:
  """uint8 pixels [N, W*W] and int32 labels [N] of the readable images, plus skip counts. ``verify(path,
  bytes or None if missing)``, when given, sees each file first and raises on a damaged one (generated
  data with checksums: refused, not skipped)."""
  from PIL import Image

  side = resolution
  pixels = np.zeros((len(rows), side * side), np.uint8)
  labels = np.zeros(len(rows), np.int32)
  skipped = {"missing": [], "empty": [], "unreadable": []}
  n = 0
  for path, label in rows:
    try:
      with open(path, "rb") as f:
        data = f.read()
    except FileNotFoundError:
      if verify:
        verify(path, None)
      skipped["missing"].append(path)
      continue
    if verify:
      verify(path, data)
    if not data:
      skipped["empty"].append(path)
      continue
    try:
      with Image.open(io.BytesIO(data)) as image:
        array = np.asarray(image.convert("L"))
    except Exception:  # noqa: BLE001 - truncated or corrupt PNG: skipped and counted
      skipped["unreadable"].append(path)
      continue
    if array.shape != (side, side):
      skipped["unreadable"].append(path)
      continue
    pixels[n], labels[n] = array.reshape(-1), label
    n += 1
  return pixels[:n], labels[:n], skipped


def load(out_dir: str, resolution: int, verify: Callable[[str, bytes | None], None] | None = None
         ) -> tuple[np.ndarray, np.ndarray]:
  """All readable images of one difficulty dir, decoded once and cached (memory-mapped on reuse);
  ``verify``: checks each PNG as it is decoded (``decode_images``)."""
  files = metadata_files(out_dir)
  if not files:
    raise MissingDataError(f"no metadata files in {os.path.join(out_dir, 'metadata')}")
  stats = [(os.path.basename(f), os.path.getsize(f), os.stat(f).st_mtime_ns) for f in files]
  key = hashlib.sha256(json.dumps([resolution, stats]).encode()).hexdigest()[:16]
  cache = os.path.join(out_dir, CACHE_DIR)
  pixels_path, labels_path = (os.path.join(cache, f"{kind}-{key}.npy") for kind in ("pixels", "labels"))
  if os.path.exists(labels_path) and os.path.exists(pixels_path):
    cached = _read_cache(pixels_path, labels_path, resolution)
    if cached is not None:
      return cached
  rows = read_metadata(out_dir)
  logging.info("decoding %d Pathfinder PNGs in %s (once; cached in %s)", len(rows), out_dir, cache)
  pixels, labels, skipped = decode_images(rows, resolution, verify)
  num_skipped = sum(map(len, skipped.values()))
  if num_skipped:
    first = next(paths[0] for paths in skipped.values() if paths)
    logging.warning("%s: skipped %d of %d images (%d empty, %d unreadable, %d missing), e.g. %s",
                    out_dir, num_skipped, len(rows), len(skipped["empty"]), len(skipped["unreadable"]),
                    len(skipped["missing"]), first)
  if not len(labels):
    raise DataError(f"{out_dir}: none of the {len(rows)} images listed in its metadata could be read")
  try:
    os.makedirs(cache, exist_ok=True)
    for path, array in ((pixels_path, pixels), (labels_path, labels)):  # labels last: marks complete
      tmp = f"{path}.tmp-{os.getpid()}.npy"
      np.save(tmp, array)
      os.replace(tmp, path)
  except OSError as err:  # e.g. a read-only copy of the release: work from memory
    logging.warning("cannot cache decoded images in %s (%s); decoding again next time", cache, err)
  return pixels, labels


def _read_cache(pixels_path: str, labels_path: str, resolution: int) -> tuple[np.ndarray, np.ndarray] | None:
  """The cached (pixels, labels), or None when the cache is unreadable or inconsistent (a cut or
  corrupt file: it is removed, and the images are decoded again)."""
  try:
    pixels, labels = np.load(pixels_path, mmap_mode="r"), np.load(labels_path)
    if pixels.ndim != 2 or pixels.shape[1] != resolution * resolution or pixels.dtype != np.uint8 or \
        labels.shape != (pixels.shape[0],):
      raise ValueError(f"pixels {pixels.dtype} {pixels.shape} and labels {labels.dtype} {labels.shape} do "
                       f"not match {resolution}x{resolution} images")
    return pixels, labels
  except (ValueError, OSError, EOFError, pickle.UnpicklingError) as err:
    detail = " ".join(str(err).split())[:200]
    logging.warning("decode cache %s is unreadable (%s: %s); decoding the images again", pixels_path,
                    type(err).__name__, detail)
    for path in (labels_path, pixels_path):
      try:
        os.remove(path)
      except OSError:
        pass  # read-only: the new cache cannot be written either, and load() says so
    return None


def remove_stale_temporaries(out_dir: str) -> list[str]:
  """Removes the ``.tmp-*`` files and folders that killed prepares or decodes left under ``out_dir``
  (those of a process still running are kept). Returns the removed paths."""
  pattern = re.compile(r"\.tmp-(?:\d+-)?(\d+)(?:\.npy)?$")
  candidates = (glob.glob(os.path.join(out_dir, "imgs", ".tmp-*")) +
                glob.glob(os.path.join(out_dir, "metadata", "*.tmp-*")) +
                glob.glob(os.path.join(out_dir, f"{META_FILE}.tmp-*")) +
                glob.glob(os.path.join(out_dir, CHECKSUM_DIR, "*.tmp-*")) +
                glob.glob(os.path.join(out_dir, CACHE_DIR, "*.tmp-*")))
  removed = []
  for path in candidates:
    match = pattern.search(os.path.basename(path))
    if match and pid_alive(int(match.group(1))):
      continue
    if os.path.isdir(path):
      shutil.rmtree(path, ignore_errors=True)
    else:
      try:
        os.remove(path)
      except OSError:
        continue
    removed.append(path)
  return removed


def missing_batches(out_dir: str, options: dict) -> list[int]:
  """The batches a prepare with ``options`` (its ``lra_bench_meta.json``) has not finished yet."""
  done = {os.path.splitext(os.path.basename(f))[0] for f in metadata_files(out_dir)}
  num_batches = -(-options["num_images"] // options["images_per_batch"])
  return [b for b in range(num_batches) if str(b) not in done]


def split_indices(num_examples: int, split: str, split_seed: int) -> np.ndarray:
  """The seeded 80/10/10 cut of a permutation of all readable examples."""
  perm = np.random.default_rng(split_seed).permutation(num_examples)
  n_train = int(SPLIT_FRACTIONS[0] * num_examples)
  n_val = int(SPLIT_FRACTIONS[1] * num_examples)
  cuts = {"train": perm[:n_train], "validation": perm[n_train:n_train + n_val],
          "test": perm[n_train + n_val:]}
  return cuts[split]


def array_dataset(pixels: np.ndarray, labels: np.ndarray, indices: np.ndarray):
  """tf.data of (uint8 pixels [W*W], int32 label) rows ``indices``; big splits read the memory map."""
  tf = import_tf()
  size = len(indices) * pixels.shape[1]
  if size <= IN_MEMORY_BYTES:
    return tf.data.Dataset.from_tensor_slices((np.asarray(pixels[indices]), labels[indices]))
  width = pixels.shape[1]

  def fetch(i):
    return np.asarray(pixels[i]), labels[i]

  def lookup(i):
    row, label = tf.numpy_function(fetch, [i], (tf.uint8, tf.int32))
    row.set_shape([width])
    label.set_shape([])
    return row, label

  return tf.data.Dataset.from_tensor_slices(indices.astype(np.int64)).map(lookup)


def _relative(out_dir: str, path: str) -> str:
  return os.path.relpath(path, out_dir).replace(os.sep, "/")


def _png_check(out_dir: str, regenerate: str) -> Callable[[str, bytes | None], None]:
  """``decode_images``'s ``verify`` for generated data: a PNG of a batch with checksums whose bytes differ
  (or that is missing) is a DataError naming it and ``regenerate``; batches without checksums pass."""
  loaded: dict[str, dict | None] = {}

  def verify(path: str, data: bytes | None) -> None:
    key = _relative(out_dir, path)
    parts = key.split("/")
    if len(parts) != 3 or parts[0] != "imgs" or not parts[1].isdigit():
      return  # not a file this generator writes
    batch = parts[1]
    if batch not in loaded:
      try:
        loaded[batch] = read_checksums(out_dir, int(batch))
      except DataError as err:
        raise DataError(f"{err}; {regenerate}") from None
    sums = loaded[batch]
    if sums is None:
      return  # generated before checksums were kept
    problem = "missing" if data is None else checksums.checksum_problem(
        path, sums, key, data=data, source=_relative(out_dir, checksum_path(out_dir, int(batch))))
    if problem:
      raise DataError(f"{path}: {problem}; {regenerate}")

  return verify


def damaged_batches(out_dir: str, options: dict) -> list[int]:
  """The finished batches of a prepare with ``options`` with a file that is not the one its checksums
  record (cut short, overwritten, missing), each logged naming that file. Every file is read (a ``data
  prepare`` is the full check). A batch generated before checksums were kept is damaged unless its
  metadata file lists its images and each of them decodes; a whole one gets its checksums now."""
  num_batches = -(-options["num_images"] // options["images_per_batch"])
  missing = set(missing_batches(out_dir, options))
  damaged = []
  for batch in range(num_batches):
    if batch in missing:
      continue
    count = min(options["images_per_batch"], options["num_images"] - batch * options["images_per_batch"])
    problem = _batch_problem(out_dir, batch, count, options["resolution"])
    if problem:
      logging.warning("%s; generating batch %d of %s again", problem, batch, out_dir)
      damaged.append(batch)
  return damaged


def _batch_problem(out_dir: str, batch: int, count: int, resolution: int) -> str | None:
  """Why batch ``batch`` (``count`` images) is not whole, naming the file; None when it is."""
  try:
    sums = read_checksums(out_dir, batch)
  except DataError as err:
    return str(err)
  files = batch_files(batch, count)
  if sums is None:
    problem = _unchecked_batch_problem(out_dir, batch, count, resolution)
    if problem is None:
      try:
        write_checksums(out_dir, batch, {key: checksums.sha256(os.path.join(out_dir, key)) for key in files})
      except OSError as err:  # a read-only data dir: the data stay usable, only unchecked
        logging.warning("%s: could not add the checksums of batch %d (%s)", out_dir, batch, err)
    return problem
  source = _relative(out_dir, checksum_path(out_dir, batch))
  for key in files:
    path = os.path.join(out_dir, key)
    try:
      with open(path, "rb") as f:
        data = f.read()
    except FileNotFoundError:
      return f"{path}: missing"
    problem = checksums.checksum_problem(path, sums, key, data=data, source=source)
    if problem:
      return f"{path}: {problem}"
  return None


def _unchecked_batch_problem(out_dir: str, batch: int, count: int, resolution: int) -> str | None:
  """Why a batch without checksums is not whole (its metadata file does not list its ``count`` images, or
  one of them does not decode at ``resolution``), or None."""
  marker = os.path.join(out_dir, "metadata", f"{batch}.npy")
  try:
    rows = read_metadata_file(out_dir, marker)
  except DataError as err:
    return str(err)
  if [path for path, _ in rows] != [os.path.join(out_dir, key) for key in batch_files(batch, count)[1:]]:
    return f"{marker}: lists {len(rows)} images, not the {count} images of batch {batch}"
  _, _, skipped = decode_images(rows, resolution)
  for kind, paths in skipped.items():
    if paths:
      return f"{paths[0]}: {kind}"
  return None


class _Pathfinder(Task):
  num_classes = 2
  vocab_size = PIXEL_VOCAB
  pixel_inputs = True
  pixel_std = PIXEL_STD
  chance_accuracy = 0.5
  resolution: ClassVar[int]
  contour_length: ClassVar[int] = 14   # LRA reports the hard split (issue #11)

  def _root(self, data_dir: str, name: str) -> str:
    return os.path.join(data_dir, name) if name else data_dir

  def find(self, data_dir: str, contour_length: int, name: str = "") -> tuple[str, list[str]]:
    """The difficulty dir holding metadata (``<data_dir>`` first, then ``<data_dir>/lra_release``) and
    the paths looked at."""
    root = self._root(data_dir, name)
    looked = [difficulty_dir(root, self.resolution, contour_length)]
    if not name:
      looked.append(difficulty_dir(os.path.join(data_dir, "lra_release"), self.resolution, contour_length))
    for path in looked:
      if metadata_files(path):
        return path, looked
    return looked[0], looked

  def prepare(self, data_dir: str, *, resolution: int | None = None, contour_length: int | None = None,
              num_images: int = 200_000, seed: int = 0, images_per_batch: int = 1000,
              workers: int | None = None, name: str = "", overwrite: bool = False,
              progress: bool = True) -> str:
    """Generates ``num_images`` images into the release layout (idempotent, resumable, atomic per batch).

    Batches already written with the same options are kept (an interrupted run continues); files from
    elsewhere (the official release) are never touched unless ``overwrite=True``.
    """
    from tasks.progress import Progress

    resolution = resolution or self.resolution
    contour_length = contour_length or self.contour_length
    if resolution not in gen.RESOLUTIONS:
      raise DataError(f"data prepare {self.name}: --resolution must be one of {sorted(gen.RESOLUTIONS)}, "
                      f"got {resolution!r}")
    if contour_length not in gen.CONTOUR_LENGTHS:
      raise DataError(f"data prepare {self.name}: --contour_length must be one of {list(gen.CONTOUR_LENGTHS)}, "
                      f"got {contour_length!r}")
    num_images = check_count(self.name, "num_images", num_images)
    images_per_batch = check_count(self.name, "images_per_batch", images_per_batch)
    if workers is not None:
      workers = check_count(self.name, "workers", workers)
    check_name(self.name, name)
    out_dir = difficulty_dir(self._root(data_dir, name), resolution, contour_length)
    options = dict(resolution=resolution, contour_length=contour_length, num_images=num_images, seed=seed,
                   images_per_batch=images_per_batch, generator=GENERATOR_VERSION)
    meta_path = os.path.join(out_dir, META_FILE)
    if os.path.exists(meta_path):
      existing = read_meta(meta_path, "delete it (or pass --overwrite) to regenerate the images")
      if existing != options:
        if not overwrite:
          raise DataError(f"{out_dir} holds Pathfinder images generated with other options (see "
                          f"{meta_path}); pass --overwrite to regenerate them")
        shutil.rmtree(out_dir)
    elif metadata_files(out_dir):
      if not overwrite:
        logging.info("found Pathfinder files without generator metadata in %s (official release?); "
                     "keeping them", out_dir)
        return out_dir
      shutil.rmtree(out_dir)
    os.makedirs(os.path.join(out_dir, "imgs"), exist_ok=True)
    os.makedirs(os.path.join(out_dir, "metadata"), exist_ok=True)
    # The metadata file records the options first (a resumed prepare checks them); the batches'
    # metadata/<b>.npy files are the commit markers, which examples() counts against it.
    if not os.path.exists(meta_path):
      _write_atomic(meta_path, json.dumps(options, indent=1).encode())
    for path in remove_stale_temporaries(out_dir):
      logging.info("removed %s (left by an interrupted prepare)", path)
    for batch in damaged_batches(out_dir, options):  # generated again below, as a missing batch
      os.remove(os.path.join(out_dir, "metadata", f"{batch}.npy"))
    jobs = [(out_dir, resolution, contour_length, b, min(images_per_batch, num_images - b * images_per_batch),
             seed) for b in missing_batches(out_dir, options)]
    if not jobs:
      logging.info("Pathfinder data already prepared in %s", out_dir)
      return out_dir
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    done = num_images - sum(job[4] for job in jobs)
    with Progress(num_images, f"pathfinder{resolution} contour {contour_length}: generating", "images",
                  initial=done, enabled=progress, every=max(1, num_images // 10)) as bar:
      if workers == 1:
        for job in jobs:
          bar.advance(generate_batch(job))
      else:
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
          for count in pool.imap_unordered(generate_batch, jobs):
            bar.advance(count)
    return out_dir

  def _check_complete(self, data_dir: str, out_dir: str, name: str
                      ) -> Callable[[str, bytes | None], None] | None:
    """Generated data (it has ``lra_bench_meta.json``) holds every batch its metadata promises, and each
    batch's metadata file is the one its checksums record; an interrupted prepare or a damaged file is
    refused with the command that resumes or regenerates it. Returns the check of the PNGs for ``load``
    (None: not generated here)."""
    meta_path = os.path.join(out_dir, META_FILE)
    if not os.path.exists(meta_path):
      return None  # the official release, or nothing yet (the missing-data error follows)
    meta = read_meta(meta_path, "delete it and regenerate the images with lra-bench data prepare "
                     f"{self.name} --overwrite (and the options they were made with)")
    try:
      missing = missing_batches(out_dir, meta)
    except (KeyError, TypeError, ZeroDivisionError):
      raise DataError(f"{meta_path}: not the metadata of an lra-bench prepare (no num_images / "
                      "images_per_batch); delete it, or regenerate the images with --overwrite") from None
    keys = ("resolution", "contour_length", "num_images", "seed", "images_per_batch")
    options = {k: meta[k] for k in keys if k in meta}
    command = self.prepare_command(data_dir, **options, **({"name": name} if name else {}))
    num_batches = -(-meta["num_images"] // meta["images_per_batch"])
    if missing:
      raise DataError(f"{out_dir}: incomplete Pathfinder data: {num_batches - len(missing)} of "
                      f"{num_batches} batches of {meta['num_images']} images (an interrupted data prepare); "
                      f"finish it with: {command}")
    regenerate = (f"regenerate it with: {command} (a prepare with the same options finds the damaged file and "
                  "generates its batch again)")
    for batch in range(num_batches):
      sums_path = checksum_path(out_dir, batch)
      try:
        stat = os.stat(sums_path)
        expected = _metadata_sum(out_dir, batch, stat.st_size, stat.st_mtime_ns)
      except FileNotFoundError:
        continue  # generated before checksums were kept: read as it is
      except DataError as err:
        raise DataError(f"{err}; {regenerate}") from None
      marker = os.path.join(out_dir, "metadata", f"{batch}.npy")
      problem = checksums.checksum_problem(marker, expected, f"metadata/{batch}.npy",
                                           source=_relative(out_dir, sums_path))
      if problem:
        raise DataError(f"{marker}: {problem}; {regenerate}")
    return _png_check(out_dir, regenerate)

  def examples(self, data_dir: str, split: str, *, max_length: int, contour_length: int | None = None,
               split_seed: int = 0, input_kind: str = "tokens", name: str = "", limit: int = 0) -> Examples:
    contour_length = contour_length or self.contour_length
    check_name(self.name, name, "data.options.name")
    out_dir, looked = self.find(data_dir, contour_length, name)
    verify = self._check_complete(data_dir, out_dir, name)
    if not metadata_files(out_dir):
      options = {"contour_length": contour_length, **({"name": name} if name else {})}
      raise MissingDataError(
          f"{self.name} data not found: no metadata/*.npy in {' or '.join(looked)}.\n"
          f"Generate it with:\n  {self.prepare_command(data_dir, **options)}\n"
          "(or unpack the official release there: lra-bench data download lra-release)")
    pixels, labels = load(out_dir, self.resolution, verify)
    indices = split_indices(len(labels), split, split_seed)
    if limit:
      indices = indices[:limit]
    if not len(indices):
      raise DataError(f"{out_dir}: the {split} split is empty ({len(labels)} readable images)")
    side = self.resolution * self.resolution
    num_truncated = len(indices) if max_length < side else 0
    if num_truncated:
      logging.warning("%s: images of %d pixels are truncated to max_length=%d", out_dir, side, max_length)
    tf = import_tf()
    to_inputs, fit = pixel_inputs_fn(input_kind, PIXEL_MEAN, PIXEL_STD), fit_length_fn(max_length)
    ds = array_dataset(pixels, labels, indices).map(
        lambda p, y: {"inputs": fit(to_inputs(p)), "targets": y},
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return Examples(ds, len(indices), num_truncated, f"{out_dir} ({split}, split_seed {split_seed})")


@register_task
class Pathfinder(_Pathfinder):
  name = "pathfinder"
  resolution = 32
  max_length = 32 * 32


@register_task
class PathX(_Pathfinder):
  name = "pathx"
  resolution = 128
  max_length = 128 * 128
