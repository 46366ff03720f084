"""A seeded, vectorized re-implementation of the Pathfinder generator (Linsley et al. 2018) with the
per-resolution parameters of LRA's ``Pathfinder32/64/128/256`` builders.

Spec: docs/generators.md §2 (primitives §2.3, extension step §2.4, per-image algorithm §2.5).
The distribution is the original's; the speed comes from three things, none of which changes it:

- Paddle stamps (line, keep-out mask, dilated mask, seed exclusion kernel) depend only on the orientation,
  and orientations come from a finite set (integer degrees for seeds, integer offsets on the radius-(L+m)
  circle for extensions), so they are rendered once per geometry with the classic scipy semantics
  (Pillow line -> bytescale -> 8-bit Lanczos resize) and pasted with integer offsets.
- ``dilate(mask, disk(m))`` is kept incrementally (dilation distributes over max) and read only at the
  candidate pixels; the overlap test ``max(mask + m_new) < 1.8`` only looks inside the stamp window.
- The target-snake stage fails hundreds of times per image at contour 14 (the original retries one attempt
  at a time). Attempts are i.i.d., so we run a few hundred of them side by side in numpy and take the
  successes in index order: the first success of an i.i.d. sequence has the same law however the sequence
  is batched. Distractors likewise run their (up to 5) attempts side by side and keep the first success.

Coordinates are ``[row y, col x]``; angles are radians with ``x = cos θ``, ``y = sin θ`` (y grows down).
Array axes: ``N`` attempts, ``K`` extension candidates, ``S`` stamp side, ``W`` image side.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

ACCEPT_OVERLAP = 1.8       # snakes.extend: accept if max(mask + new paddle mask) < 1.8
FREE_LEVEL = 0.3           # a pixel is free when its occupancy is <= 0.3
MIN_FREE_FRACTION = 0.01   # distractor seeding gives up below 1% free pixels
PADDLE_TRIES = 3           # max_paddle_retrial = 2, counted 0..2
DISTRACTOR_TRIES = 5       # max_distractor_contour_retrial = 4, counted 0..4


@dataclasses.dataclass(frozen=True)
class Resolution:
  """LRA's generation parameters for one image size (docstrings of lra_benchmarks/data/pathfinder.py)."""

  window: int
  padding: int
  antialias: int
  margins: tuple[int, ...]      # paddle_margin_list; one margin is drawn per image
  seed_distance: int
  paddle_length: int
  paddle_thickness: float
  marker_radius: float
  continuity: float
  snake_contrast: float         # snake_contrast_list (one value in every LRA config)
  paddle_contrast: float        # paddle_contrast_list (one value in every LRA config)
  distractor_budget: int        # num_distractor_snakes = budget // distractor_length

  def distractor_length(self, contour_length: int) -> int:
    return contour_length // 3   # Python-2 integer division, as the 2019 code ran

  def num_distractors(self, contour_length: int) -> int:
    # Recomputed per difficulty (docs/generators.md §2.9.2; LRA's docstrings compute it for contour 14).
    return self.distractor_budget // self.distractor_length(contour_length)


RESOLUTIONS = {
    32: Resolution(32, 1, 2, (1,), 7, 2, 0.5, 1.5, 1.0, 2.0, 0.75, 20),
    64: Resolution(64, 1, 2, (1,), 12, 5, 1.0, 2.5, 1.8, 0.8, 1.0, 22),
    128: Resolution(128, 1, 2, (2, 3), 20, 5, 1.5, 3.0, 1.8, 0.9, 1.0, 35),
    256: Resolution(256, 22, 2, (3,), 27, 5, 2.0, 5.0, 1.8, 1.0, 1.0, 30),
}
CONTOUR_LENGTHS = (6, 9, 14)


# ----------------------------------------------------------------------------------------------------
# Classic scipy.misc semantics (docs/generators.md §2.3)


def bytescale(a: np.ndarray) -> np.ndarray:
  """scipy.misc.bytescale: (a - min) * 255 / (max - min) (span 0 -> 1), clipped, +0.5, truncated."""
  a = np.asarray(a, np.float32)
  lo, hi = float(a.min()), float(a.max())
  scale = 255.0 / ((hi - lo) or 1.0)
  return (np.clip((a - lo) * scale, 0, 255) + 0.5).astype(np.uint8)


def imresize(a: np.ndarray, side: int) -> np.ndarray:
  """scipy.misc.imresize(a, (side, side), 'lanczos'): 8-bit (bytescaled unless uint8), Pillow Lanczos."""
  from PIL import Image

  image = a if a.dtype == np.uint8 else bytescale(a)
  return np.asarray(Image.fromarray(image, "L").resize((side, side), Image.LANCZOS))


def disk(radius: float) -> np.ndarray:
  """(2r+1)^2 0/1 kernel with y^2 + x^2 <= r^2."""
  r = int(math.floor(radius))
  y, x = np.mgrid[-r:r + 1, -r:r + 1]
  return (y * y + x * x <= radius * radius).astype(np.uint8)


def dilate(a: np.ndarray, kernel: np.ndarray) -> np.ndarray:
  """Grey dilation with a 0/1 kernel anchored at its centre; pixels outside the image are ignored."""
  ky, kx = kernel.shape[0] // 2, kernel.shape[1] // 2
  return shifted_max(a, np.argwhere(kernel > 0) - (ky, kx))


def shifted_max(a: np.ndarray, offsets: np.ndarray) -> np.ndarray:
  """out[p] = max over offsets d of a[p + d] (in-image terms only; a >= 0 so zero padding is exact)."""
  if not len(offsets):
    return np.zeros_like(a)
  pad = int(np.abs(offsets).max())
  padded = np.pad(a, pad)
  h, w = a.shape
  out = np.zeros_like(a)
  for dy, dx in offsets:
    np.maximum(out, padded[pad + dy:pad + dy + h, pad + dx:pad + dx + w], out=out)
  return out


def translate(p, theta, distance):
  """[ceil(y + d sin θ), ceil(x + d cos θ)] (note the ceil, as the original)."""
  return np.stack([np.ceil(p[..., 0] + distance * np.sin(theta)),
                   np.ceil(p[..., 1] + distance * np.cos(theta))], -1).astype(np.int64)


def flip(theta: float) -> float:
  return theta + math.pi if theta < 0 else theta - math.pi


def paddle_stamp(theta: float, length: int, thickness: float, margin: int, aa: int):
  """(line, mask), float [2R+1, 2R+1] with R = L + ceil(t) + m; the paddle starts at the centre.

  line: the anti-aliased paddle (unit contrast); mask: its anti-aliased keep-out halo of about m px.
  """
  from PIL import Image, ImageDraw

  width = thickness * aa
  if width != int(width):
    raise ValueError(f"paddle_thickness * antialias_scale must be an integer, got {width}")
  radius = length + math.ceil(thickness) + margin
  centre = radius * aa
  side_hi = 2 * radius * aa + 1
  head = translate(np.array([centre, centre], np.float64), theta, length * aa)
  canvas = Image.new("F", (side_hi, side_hi), 0.0)
  ImageDraw.Draw(canvas).line([(centre, centre), (int(head[1]), int(head[0]))], fill=255, width=int(width))
  hi = np.asarray(canvas, np.float32)
  line = imresize(hi, 2 * radius + 1).astype(np.float32) / 255.0
  halo = dilate(hi, disk(margin * aa)).astype(np.uint8)
  mask = imresize(halo, 2 * radius + 1).astype(np.float32) / 255.0
  return line, mask


# ----------------------------------------------------------------------------------------------------
# Precomputed geometry of one (resolution, margin)


class Geometry:
  """Everything that depends only on the resolution parameters and the paddle margin."""

  def __init__(self, res: Resolution, margin: int):
    self.res, self.margin = res, margin
    L, t, m, aa, W = res.paddle_length, res.paddle_thickness, margin, res.antialias, res.window
    self.L, self.m, self.W = L, m, W
    self.R = L + math.ceil(t) + m
    self.S = 2 * self.R + 1
    self.P = self.R + m + 1          # padding of the work arrays: every window fits
    self.Wp = W + 2 * self.P

    # Extension candidates: integer offsets on the circle of radius L + m (one pixel of arc apart),
    # truncated, unique, sorted lexicographically (docs/generators.md §2.4 step 3).
    rho = L + m
    degrees = np.arange(0.0, 360.0, 360.0 / (2 * math.pi * rho))
    rad = np.deg2rad(degrees)
    offsets = np.stack([np.floor(rho * np.sin(rad)), np.floor(rho * np.cos(rad))], -1).astype(np.int64)
    self.offsets = np.unique(offsets, axis=0)                           # [K, 2]
    self.phi = np.arctan2(self.offsets[:, 0], self.offsets[:, 1])       # [K]

    # Stamps: 0..359 = seed paddles at integer degrees -180..179; 360 + k = extension paddle k, drawn
    # from its head with orientation flip(phi_k).
    thetas = [math.radians(d) for d in range(-180, 180)] + [flip(float(p)) for p in self.phi]
    stamps = [paddle_stamp(th, L, t, m, aa) for th in thetas]
    self.line = np.stack([s[0] for s in stamps])                        # [360 + K, S, S]
    self.mask = np.stack([s[1] for s in stamps])                        # [360 + K, S, S]
    small = disk(m)
    self.dmask = np.stack([dilate(np.pad(s, m), small) for s in self.mask])  # [360 + K, S + 2m, S + 2m]

    # Seed exclusion kernels (seed_struct, docs/generators.md §2.3): the paddle mask at start
    # [L+m+1, L+m+1] on a canvas of side 2(L+m)+1, cast to uint8 (only exact 1.0 survives), anchored at
    # the canvas centre.
    side = 2 * (L + m) + 1
    self.seed_offsets = []
    for d in range(360):
      full = np.zeros((side, side), np.float32)
      paste_max(full, self.mask[d], L + m + 1, L + m + 1)
      self.seed_offsets.append(np.argwhere(full.astype(np.uint8) > 0) - (L + m, L + m))
    # A quirk of the original that shapes the data: cv2.dilate gives -DBL_MAX to a pixel whose kernel
    # taps all fall outside the image, and find_available_coordinates then reports *no* free pixel
    # (its `np.min(mask) < 0` guard), so seeding fails at once for every orientation whose exact-1.0
    # kernel does not reach all four corners. At 32x32 only ~8% of the 360 orientations can seed a snake.
    ones = np.ones((W, W), np.float32)
    self.seed_viable = np.array([shifted_max(ones, o).min() > 0 for o in self.seed_offsets])

    # Occupancy at the start of an image: a border band of width `padding`.
    self.band = border_band(W, res.padding)
    self.band_dilated = dilate(self.band, small)

    # Free tails of target seed A for each degree: the band of width 2 * seed_distance, dilated by
    # seed_struct(θ); free = <= 0.3.
    target_excl = border_band(W, 2 * res.seed_distance)
    free = [np.argwhere(shifted_max(target_excl, self.seed_offsets[d]) <= FREE_LEVEL) if self.seed_viable[d]
            else np.zeros((0, 2), np.int64) for d in range(360)]
    self.target_free_count = np.array([len(f) for f in free])
    self.target_free = np.zeros((360, max(1, self.target_free_count.max()), 2), np.int64)
    for d, f in enumerate(free):
      self.target_free[d, :len(f)] = f


@functools.lru_cache(maxsize=None)
def geometry(resolution: int, margin: int) -> Geometry:
  return Geometry(RESOLUTIONS[resolution], margin)


def border_band(side: int, width: int) -> np.ndarray:
  band = np.zeros((side, side), np.float32)
  if width > 0:
    band[:width] = band[-width:] = 1.0
    band[:, :width] = band[:, -width:] = 1.0
  return band


def paste_max(image: np.ndarray, stamp: np.ndarray, y: int, x: int) -> None:
  """image = max(image, stamp centred at (y, x)), clipped at the borders."""
  r = stamp.shape[0] // 2
  h, w = image.shape
  y0, x0 = y - r, x - r
  ys, xs = max(0, y0), max(0, x0)
  ye, xe = min(h, y0 + stamp.shape[0]), min(w, x0 + stamp.shape[1])
  if ys < ye and xs < xe:
    np.maximum(image[ys:ye, xs:xe], stamp[ys - y0:ye - y0, xs - x0:xe - x0], out=image[ys:ye, xs:xe])


# ----------------------------------------------------------------------------------------------------
# Side-by-side attempts


def in_image(p: np.ndarray, side: int) -> np.ndarray:
  return np.all((p >= 0) & (p < side), axis=-1)


@dataclasses.dataclass
class _Snakes:
  """One snake in each of n attempts (arrays over n; paddle k of attempt i is stamps[i, k] at pos[i, k])."""
  pivot: np.ndarray       # [n, 2]
  theta: np.ndarray       # [n]
  stamps: np.ndarray      # [n, num_paddles] stamp ids; the last one's mask is not yet committed
  pos: np.ndarray         # [n, num_paddles, 2] paddle start points (tail of the seed, heads after)
  count: int = 1          # paddles so far

  def subset(self, keep: np.ndarray) -> "_Snakes":
    return _Snakes(self.pivot[keep], self.theta[keep], self.stamps[keep], self.pos[keep], self.count)


@dataclasses.dataclass
class Snake:
  """One finished snake: its paddles (stamp ids and start points) and its two ends."""
  stamps: np.ndarray
  positions: np.ndarray
  origin: np.ndarray      # tail of the first paddle
  terminal: np.ndarray    # head of the last paddle


def seed_snakes(geo: Geometry, tails: np.ndarray, degrees: np.ndarray, empty: np.ndarray,
                num_paddles: int) -> tuple[np.ndarray, _Snakes]:
  """Seed paddles of n attempts, up to 3 tries each (tails [n, 3, 2], degrees [n, 3]): a try without a free
  pixel (``empty``) fails the attempt; a try whose head or pivot leaves the image is retried."""
  theta = np.deg2rad(degrees.astype(np.float64))
  heads = translate(tails, theta, geo.L)
  pivots = translate(heads, theta + math.pi, geo.L + geo.m)
  valid = ~empty & in_image(tails, geo.W) & in_image(heads, geo.W) & in_image(pivots, geo.W)
  stop = valid | empty
  rows, first = np.arange(len(tails)), stop.argmax(1)
  ok = stop.any(1) & valid[rows, first]
  n = len(tails)
  stamps = np.zeros((n, num_paddles), np.int64)
  pos = np.zeros((n, num_paddles, 2), np.int64)
  stamps[:, 0] = degrees[rows, first] + 180
  pos[:, 0] = tails[rows, first]
  return ok, _Snakes(pivots[rows, first], theta[rows, first], stamps, pos)


class _Attempts:
  """n attempts of one stage side by side, each with its own occupancy ``mask`` and ``near`` =
  dilate(mask, disk(m)), kept in zero-padded [n, Wp, Wp] arrays addressed through flat indices."""

  def __init__(self, geo: Geometry, mask0: np.ndarray, near0: np.ndarray, n: int, rng: np.random.Generator):
    self.geo, self.rng = geo, rng
    P, W, Wp = geo.P, geo.W, geo.Wp
    self.mask = np.zeros((n, Wp, Wp), np.float32)
    self.mask[:, P:P + W, P:P + W] = mask0
    self.near = np.zeros((n, Wp, Wp), np.float32)
    self.near[:, P:P + W, P:P + W] = near0
    self.idx = np.arange(n)            # array rows of the attempts still alive
    ar, ar2 = np.arange(geo.S), np.arange(geo.S + 2 * geo.m)
    self._win = (ar[:, None] * Wp + ar[None, :]).ravel()            # [S*S] flat window offsets
    self._dwin = (ar2[:, None] * Wp + ar2[None, :]).ravel()
    self._ar = ar
    self._mask_flat = geo.mask.reshape(len(geo.mask), -1)
    self._dmask_flat = geo.dmask.reshape(len(geo.dmask), -1)

  def _base(self, rows: np.ndarray, corner: np.ndarray) -> np.ndarray:
    """Flat index of the window corner (in padded coordinates) of each attempt row."""
    Wp = self.geo.Wp
    return rows * Wp * Wp + (corner[:, 0] + self.geo.P) * Wp + corner[:, 1] + self.geo.P

  def commit(self, rows: np.ndarray, stamp: np.ndarray, pos: np.ndarray) -> None:
    """mask = max(mask, stamp mask clipped to the image); near = max(near, dilated stamp mask)."""
    if not len(rows):
      return
    g = self.geo
    corner = pos - g.R
    inside_y = (corner[:, 0, None] + self._ar >= 0) & (corner[:, 0, None] + self._ar < g.W)
    inside_x = (corner[:, 1, None] + self._ar >= 0) & (corner[:, 1, None] + self._ar < g.W)
    inside = (inside_y[:, :, None] & inside_x[:, None, :]).reshape(len(rows), -1)
    ids = self._base(rows, corner)[:, None] + self._win
    flat = self.mask.reshape(-1)
    flat[ids] = np.maximum(flat[ids], self._mask_flat[stamp] * inside)
    ids = self._base(rows, corner - g.m)[:, None] + self._dwin
    flat = self.near.reshape(-1)
    flat[ids] = np.maximum(flat[ids], self._dmask_flat[stamp])

  def extend(self, snakes: _Snakes, continuity: float) -> np.ndarray:
    """One extension step (docs/generators.md §2.4) of every alive attempt; returns ok [n]."""
    g, rng, rows = self.geo, self.rng, self.idx
    n, Wp = len(rows), g.Wp
    pivot = translate(snakes.pivot, snakes.theta, g.L + 2 * g.m)                  # [n, 2]
    cand = pivot[:, None, :] + g.offsets[None]                                    # [n, K, 2]
    inside = in_image(cand, g.W)
    cc = np.clip(cand, 0, g.W - 1) + g.P
    near = self.near.reshape(-1)[rows[:, None] * Wp * Wp + cc[..., 0] * Wp + cc[..., 1]]   # [n, K]
    diff = np.abs(g.phi[None, :] - snakes.theta[:, None])
    delta = np.minimum(diff, 2 * math.pi - diff)
    weight = np.cos(np.minimum(delta * continuity, math.pi / 2)) ** 2 * (1.0 - near) * inside
    total = weight.sum(1)
    ok = total >= 1e-4
    cdf = np.cumsum(weight, 1) / np.maximum(total, 1e-12)[:, None]
    u = rng.random((n, PADDLE_TRIES))
    pick = np.minimum((cdf[:, None, :] <= u[:, :, None]).sum(-1), len(g.phi) - 1)  # [n, 3]
    chosen = np.zeros(n, np.int64)
    found = np.zeros(n, bool)
    pending = ok.copy()
    mask_flat = self.mask.reshape(-1)
    for t in range(PADDLE_TRIES):  # a retry only where the earlier tries were rejected
      r = np.flatnonzero(pending)
      if not len(r):
        break
      k = pick[r, t]
      ids = self._base(rows[r], cand[r, k] - g.R)[:, None] + self._win
      good = (mask_flat[ids] + self._mask_flat[k + 360]).max(1) < ACCEPT_OVERLAP
      chosen[r[good]], found[r[good]] = k[good], True
      pending[r[good]] = False
    ok &= found
    # Commit the previous paddle's mask (one step late, as the original), then advance.
    r = np.flatnonzero(ok)
    last = snakes.count - 1
    self.commit(rows[r], snakes.stamps[r, last], snakes.pos[r, last])
    snakes.stamps[:, snakes.count] = chosen + 360
    snakes.pos[:, snakes.count] = cand[np.arange(n), chosen]
    snakes.pivot = pivot
    snakes.theta = g.phi[chosen]
    snakes.count += 1
    return ok

  def grow(self, snakes: list[_Snakes], steps: int, continuity: float) -> list[_Snakes]:
    """Extends every snake ``steps`` times (one paddle each per step, in order), dropping the attempts
    that fail; afterwards ``self.idx`` holds the survivors in increasing order."""
    for _ in range(steps):
      for i in range(len(snakes)):
        ok = self.extend(snakes[i], continuity)
        if not ok.all():
          self.idx = self.idx[ok]
          snakes = [s.subset(ok) for s in snakes]
        if not len(self.idx):
          return snakes
    return snakes

  def result(self, j: int, snakes: list[_Snakes]) -> tuple[list[Snake], np.ndarray]:
    """Survivor j: its finished snakes and its occupancy [W, W] with the last snake's last paddle added."""
    g = self.geo
    done = [Snake(s.stamps[j].copy(), s.pos[j].copy(), s.pos[j, 0].copy(), s.pos[j, -1].copy())
            for s in snakes]
    row = self.idx[j]
    mask = self.mask[row, g.P:g.P + g.W, g.P:g.P + g.W].copy()
    paste_max(mask, g.mask[done[-1].stamps[-1]], *done[-1].terminal)  # the last snake's last paddle only
    return done, mask


def target_attempts(geo: Geometry, contour_length: int, n: int, rng: np.random.Generator):
  """``n`` side-by-side attempts at the two target snakes. Returns (the successes in attempt order as
  (snake A, snake B, occupancy mask [W, W] after the stage), how many attempts got past seeding)."""
  res = geo.res
  tries = (n, PADDLE_TRIES)
  # Seed A: a free tail inside the band of width 2 * seed_distance (a new orientation every try).
  deg_a = rng.integers(-180, 180, tries)
  count = geo.target_free_count[deg_a + 180]
  pick = np.minimum((rng.random(tries) * count).astype(np.int64), np.maximum(count - 1, 0))
  tails_a = geo.target_free[deg_a + 180, pick]                                     # [n, 3, 2]
  ok_a, snake_a = seed_snakes(geo, tails_a, deg_a, count == 0, contour_length)
  # Seed B: seed_distance from A's tail in a random direction (not checked against occupancy).
  deg_b = rng.integers(-180, 180, tries)
  psi = np.deg2rad(rng.integers(0, 360, tries).astype(np.float64))
  tails_b = np.rint(snake_a.pos[:, None, 0] + res.seed_distance
                    * np.stack([np.sin(psi), np.cos(psi)], -1)).astype(np.int64)
  ok_b, snake_b = seed_snakes(geo, tails_b, deg_b, np.zeros(tries, bool), contour_length)
  keep = np.flatnonzero(ok_a & ok_b)
  if not len(keep):
    return [], 0
  att = _Attempts(geo, geo.band, geo.band_dilated, len(keep), rng)
  snakes = att.grow([snake_a.subset(keep), snake_b.subset(keep)], contour_length - 1, res.continuity)
  out = []
  for j in range(len(att.idx)):
    (a, b), mask = att.result(j, snakes)
    out.append((a, b, mask))
  return out, len(keep)


def distractor(geo: Geometry, mask: np.ndarray, length: int, rng: np.random.Generator):
  """Up to 5 side-by-side attempts at one distractor snake on occupancy ``mask``; the first success
  as (snake, new mask), or None (the snake is then silently skipped, as the original)."""
  if np.mean(mask <= FREE_LEVEL) < MIN_FREE_FRACTION:   # stop_with_availability = 0.01
    return None
  n = DISTRACTOR_TRIES
  degrees = rng.integers(-180, 180, (n, PADDLE_TRIES))
  u = rng.random((n, PADDLE_TRIES))
  empty = ~geo.seed_viable[degrees + 180]
  tails = np.zeros((n, PADDLE_TRIES, 2), np.int64)
  seed_src = None
  free_maps: dict[int, np.ndarray] = {}
  for i in range(n):
    for t in range(PADDLE_TRIES):
      if empty[i, t]:
        break   # this attempt fails here; later tries are never reached
      d = int(degrees[i, t]) + 180
      if d not in free_maps:
        if seed_src is None:
          seed_src = np.maximum(mask, border_band(geo.W, 1))
        free_maps[d] = np.argwhere(shifted_max(seed_src, geo.seed_offsets[d]) <= FREE_LEVEL)
      free = free_maps[d]
      empty[i, t] = not len(free)
      if not len(free):
        break
      tails[i, t] = free[min(int(u[i, t] * len(free)), len(free) - 1)]
  ok, snake = seed_snakes(geo, tails, degrees, empty, length)
  keep = np.flatnonzero(ok)
  if not len(keep):
    return None
  att = _Attempts(geo, mask, dilate(mask, disk(geo.m)), len(keep), rng)
  snakes = att.grow([snake.subset(keep)], length - 1, geo.res.continuity)
  if not len(att.idx):
    return None
  (s,), new_mask = att.result(0, snakes)
  return s, new_mask


def render_marker(centre, radius: float, aa: int, window: int) -> np.ndarray:
  """A soft disk in [0, 1]: a hi-res 0/1 disk of radius r*aa at centre*aa, Lanczos-resized
  (docs/generators.md §2.3)."""
  side = window * aa
  y, x = np.ogrid[:side, :side]
  cy, cx = centre[0] * aa, centre[1] * aa
  hi = ((y - cy) ** 2 + (x - cx) ** 2 <= (radius * aa) ** 2).astype(np.float32)
  return imresize(hi, window).astype(np.float32) / 255.0


def draw(geo: Geometry, snakes: list[Snake], contrast: float, image: np.ndarray) -> None:
  for s in snakes:
    for stamp, (y, x) in zip(s.stamps, s.positions):
      paste_max(image, geo.line[stamp] * contrast, int(y), int(x))


class TargetPool:
  """Successful target-snake stages for one geometry, drawn in side-by-side batches as needed."""

  def __init__(self, geo: Geometry, contour_length: int, rng: np.random.Generator):
    self.geo, self.contour_length, self.rng = geo, contour_length, rng
    # Attempts that survive seeding grow side by side: a few hundred at 32x32, fewer for the large
    # windows (memory ~ n * Wp^2). Most attempts fail at seeding already (at 32x32 ~92% of orientations
    # cannot seed), so the batch of attempts is sized from the running seeding success rate.
    self.grow_batch = int(np.clip(8_000_000 // geo.Wp ** 2, 16, 384))
    self.seeded, self.attempts = 1, 1
    self.queue: list = []

  def take(self):
    while not self.queue:
      rate = max(self.seeded / self.attempts, 1e-3)
      n = int(np.clip(self.grow_batch / rate, 16, 1 << 16))
      found, seeded = target_attempts(self.geo, self.contour_length, n, self.rng)
      self.queue.extend(found)
      self.attempts += n
      self.seeded += seeded
    return self.queue.pop(0)


@dataclasses.dataclass
class Sample:
  image: np.ndarray          # uint8 [W, W], as saved
  label: int
  margin: int
  targets: tuple             # (Snake A, Snake B)
  marker_snakes: tuple       # (origin snake index, terminal snake index)
  num_distractors: int


def generate_image(resolution: int, contour_length: int, rng: np.random.Generator,
                   pools: dict, distractors: bool = True) -> Sample:
  """One Pathfinder image (docs/generators.md §2.5). ``pools`` caches TargetPools by margin across images."""
  res = RESOLUTIONS[resolution]
  label = int(rng.integers(0, 2))
  margin = int(res.margins[rng.integers(0, len(res.margins))])
  geo = geometry(resolution, margin)
  pool = pools.get(margin)
  if pool is None:
    pool = pools[margin] = TargetPool(geo, contour_length, rng)
  a, b, mask = pool.take()
  image = np.zeros((res.window, res.window), np.float32)
  draw(geo, [a, b], res.paddle_contrast * res.snake_contrast, image)
  placed = 0
  if distractors:
    for _ in range(res.num_distractors(contour_length)):
      found = distractor(geo, mask, res.distractor_length(contour_length), rng)
      if found is not None:
        snake, mask = found
        draw(geo, [snake], res.snake_contrast, image)
        placed += 1
  origin = int(rng.integers(0, 2))
  terminal = origin if label == 1 else 1 - origin
  targets = (a, b)
  marker = np.maximum(render_marker(targets[origin].origin, res.marker_radius, res.antialias, res.window),
                      render_marker(targets[terminal].terminal, res.marker_radius, res.antialias, res.window))
  final = bytescale(np.maximum(image, marker))
  return Sample(final, label, margin, targets, (origin, terminal), placed)
