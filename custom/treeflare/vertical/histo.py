"""Encrypted per-feature, per-bin sums at a passive party (the hot loop) and the compression of
returned results, on a persistent pool of workers (:mod:`treeflare.crypto.workers`: local processes,
or a Dask cluster the party runs).

The rows are **sharded** over the workers: worker i holds only its contiguous block of rows -- their
bins (as uint8/uint16 where the bin counts allow) and, per tree, their ciphertexts -- so a party's
memory for ciphertexts is spread over its workers instead of copied to each.  For a layer, every worker
gets the rows of each node that fall in its block and returns per-bin partial products; the partials are
multiplied together by the pool's ``map_reduce`` (here for local processes, a tree reduction on the
cluster for Dask).  A product mod m does not depend on the order of its factors, so the sums are the
same integers with any number of workers.

Features are summed **in groups**: the rows of a node are first multiplied into the joint cells
(bin of feature a, bin of feature b, ...), then each feature's bins are products of its cells.  That
takes |rows| + k |cells| multiplications for k features instead of k |rows|; the group size is chosen per node
(:func:`_groups`: pairs at 32 bins, eight binary columns, single features in small nodes).  The bins are then
multiplied up into **cumulative** sums (bins 0..b, what a split candidate needs) at the workers, before the
merge: a product of cumulative partials is the cumulative product of the merged bins.

Where the C kernel (:mod:`treeflare.crypto.native`) is usable, a worker keeps its rows' ciphertexts in
the kernel's Montgomery form and multiplies cells and bins eight at a time; where every worker and the
party have the kernel, a node's partial histograms also stay in that form through the merges (one kernel
call per merge; the party converts only the final sums).  Compression packs eight groups at once.  Same
integers as the gmpy2 path, which runs otherwise.  Compression needs no rows: its shares go to whichever
worker is free.

(Over 400 lines: the worker-side operations and the party-side engine share the layouts of every request
and reply, so they stay in one module.)
"""
from __future__ import annotations

import numpy as np

from ..crypto import CiphertextError, native
from ..crypto.backend import even_ranges, public_from_json, public_to_json
from ..crypto.workers import is_cluster, make_pool, parse_workers

_MODULE = "treeflare.vertical.histo"


_MAX_CELLS = 1 << 16      # joint bins of one feature group (bounds the cell keys and their sort)


def _groups(nbins: list, n_rows: int) -> list:
    """Consecutive features grouped for a node of ``n_rows`` rows (on one worker): a group of k features costs about
    n_rows + k * min(n_rows, cells) multiplications (rows into cells, then each feature's bins from the cells), so a
    feature joins the group while that cost per feature falls.  Pairs at 32 bins and 100,000 rows, groups of eight
    binary (one-hot) columns, single features in small nodes.  Any grouping gives the same sums."""
    def per_feature(k, cells):
        return n_rows if k == 1 else (n_rows + k * min(n_rows, cells)) / k

    out, f, nf = [], 0, len(nbins)
    while f < nf:
        grp, cells = [f], nbins[f]
        while f + len(grp) < nf:
            nxt = cells * nbins[f + len(grp)]
            if nxt > _MAX_CELLS or per_feature(len(grp) + 1, nxt) >= per_feature(len(grp), cells):
                break
            grp.append(f + len(grp))
            cells = nxt
        out.append(tuple(grp))
        f += len(grp)
    return out


# --------------------------------------------------------------------------------- worker side
def _seg_idx(C, idx, starts, mul):
    """Products of C[idx[s:e]] for consecutive segments (starts has the end appended)."""
    out = []
    for s, e in zip(starts[:-1], starts[1:]):
        acc = C[idx[s]]
        for i in idx[s + 1:e]:
            acc = mul(acc, C[i])
        out.append(acc)
    return out


def _seg_vals(vals, starts, mul):
    out = []
    for s, e in zip(starts[:-1], starts[1:]):
        acc = vals[s]
        for v in vals[s + 1:e]:
            acc = mul(acc, v)
        out.append(acc)
    return out


def _segments(keys: np.ndarray) -> list:
    if keys.size == 0:
        return [0]
    return np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]).tolist() + [int(keys.size)]


def _mul_of(pub):
    if pub.modulus is not None:
        mod = pub.modulus
        return lambda a, b: a * b % mod
    return lambda a, b: a + b


def _cell_plan(st, rows: np.ndarray, grp: tuple):
    """How one feature group's histograms come from a node's rows: the rows sorted into cells (joint bins of
    the group's features), and for each feature, its bins as products of cells.  Returns (sorted rows, cell
    starts, [(feature, bin of each result, cell order or None for the cells themselves, segment starts)])."""
    cols, nbins = st["cols"], st["nbins"]
    units = len(st["C"])
    # cell keys below 2^16 (_MAX_CELLS): numpy's stable sort of 16-bit integers is a radix sort, O(rows)
    wide = int(np.prod([nbins[f] for f in grp])) > _MAX_CELLS      # one feature of more bins than that
    keys = cols[grp[0]][rows].astype(np.int64 if wide else np.uint16)
    for f in grp[1:]:
        keys *= nbins[f]
        keys += cols[f][rows]
    order = np.argsort(keys, kind="stable")
    skeys = keys[order]
    starts = np.asarray(_segments(skeys), dtype=np.int64)
    cell_keys = skeys[starts[:-1]]
    n_cells = len(starts) - 1
    st["mults"] += units * (rows.size - n_cells)
    if len(grp) == 1:
        return rows[order], starts, [(grp[0], cell_keys, None, None)]
    plan = _feature_plan(cell_keys, tuple(nbins[f] for f in grp), grp)
    for _f, _k, _o, seg in plan:
        st["mults"] += units * (n_cells - (len(seg) - 1))
    return rows[order], starts, plan


def _feature_plan(cell_keys: np.ndarray, shape: tuple, grp: tuple) -> list:
    """The features' part of :func:`_cell_plan` (bins as products of the present cells), given the cell keys."""
    n_cells = len(cell_keys)
    plan, stride = [], int(np.prod(shape))
    for j, (f, nb) in enumerate(zip(grp, shape)):
        stride //= nb
        digit = cell_keys // np.uint16(stride) % np.uint16(nb)
        # sorted by key: the cells of one bin of the first feature are contiguous already
        o = np.arange(n_cells) if j == 0 else np.argsort(digit, kind="stable")
        seg = np.asarray(_segments(digit[o]), dtype=np.int64)
        plan.append((f, digit[o][seg[:-1]], o, seg))
    return plan


_BULK_ROWS = 8192     # nodes up to this many rows (per worker) plan their groups together (larger: one by one,
                     # each group's arrays still in the caches when its products run)


def _cell_plans(st, rows: np.ndarray, groups: list) -> list:
    """:func:`_cell_plan` of every group of a node, the same integers: the groups of one shape (their features' bin
    counts) are keyed and sorted together, in one numpy call each, and their features' plans are shared wherever
    the same cells are present (every group of a large node): a small node's many groups would otherwise cost
    more in numpy calls than in products."""
    cols, nbins = st["cols"], st["nbins"]
    units = len(st["C"])
    by_shape = {}
    for gi, grp in enumerate(groups):
        by_shape.setdefault(tuple(nbins[f] for f in grp), []).append(gi)
    out = [None] * len(groups)
    r = rows.size
    for shape, gis in by_shape.items():
        if len(shape) == 1 or int(np.prod(shape)) > _MAX_CELLS or len(gis) == 1 or not 0 < r <= _BULK_ROWS:
            for gi in gis:
                out[gi] = _cell_plan(st, rows, groups[gi])
            continue
        G = np.asarray([groups[gi] for gi in gis], dtype=np.int64)
        K = cols[G[:, 0]][:, rows].astype(np.uint16)
        for j in range(1, len(shape)):
            K *= np.uint16(shape[j])
            K += cols[G[:, j]][:, rows]
        order = np.argsort(K, axis=1, kind="stable")
        SK = np.take_along_axis(K, order, axis=1)
        SR = rows[order]
        change = np.ones(SK.shape, dtype=bool)
        change[:, 1:] = SK[:, 1:] != SK[:, :-1]
        cache = {}
        for t, gi in enumerate(gis):
            starts = np.append(np.flatnonzero(change[t]), r).astype(np.int64)
            cell_keys = SK[t][starts[:-1]]
            n_cells = len(starts) - 1
            key = cell_keys.tobytes()
            if key not in cache:
                cache[key] = _feature_plan(cell_keys, shape, (0,) * len(shape))
            st["mults"] += units * (r - n_cells)
            plan = []
            for f, (_f0, keys_f, o, seg) in zip(groups[gi], cache[key]):
                st["mults"] += units * (n_cells - (len(seg) - 1))
                plan.append((f, keys_f, o, seg))
            out[gi] = (SR[t], starts, plan)
    return out


def _node_hist(st, rows: np.ndarray) -> list:
    """out[f][b][u]: product over the node's rows of this worker with a bin <= b of feature f (None if none):
    cumulative, as the split candidates need them.  A product of the workers' cumulative products is the
    cumulative product of their merged bins, so the workers do this and the party has nothing left to add."""
    nbins, C, mul, nat = st["nbins"], st["C"], st["mul"], st["native"]
    units = len(C)
    out = [[[None] * units for _ in range(nb)] for nb in nbins]
    if rows.size == 0:
        return out
    for grp in _groups(nbins, rows.size):
        srows, starts, plan = _cell_plan(st, rows, grp)
        for u in range(units):
            if nat is not None:
                cells = nat.segment_products(st["C52"][u], srows, starts)
                results = [nat.values(cells if idx is None else nat.segment_products(cells, idx, seg))
                           for _f, _k, idx, seg in plan]
            else:
                cells = _seg_idx(C[u], srows.tolist(), starts.tolist(), mul)
                results = [cells if idx is None else _seg_vals([cells[i] for i in idx.tolist()], seg.tolist(), mul)
                           for _f, _k, idx, seg in plan]
            for (f, keys_f, _i, _s), vals in zip(plan, results):
                for k, v in zip(keys_f.tolist(), vals):
                    out[f][k][u] = v
    for hist_f in out:
        for u in range(units):
            acc = None
            for b in range(len(hist_f)):
                v = hist_f[b][u]
                if v is not None and acc is not None:
                    v = mul(acc, v)
                    st["mults"] += 1
                acc = hist_f[b][u] = v if v is not None else acc
    return out


def _mont_one(nat) -> np.ndarray:
    """The neutral element (1) in the C kernel's Montgomery form, one row of L 64-bit words."""
    return np.frombuffer(nat.load([1]), dtype=np.uint64)


def _cumulate_mont(st, flat, filled, offsets, nbins, units) -> None:
    """flat[f][b][u] <- product of flat[f][0..b][u] in place (see :func:`_node_hist`): one kernel call per bin
    position over every feature and unit at once; ``filled`` marks the entries that are not neutral."""
    nat, L = st["native"], flat.shape[1]
    nbins = np.asarray(nbins, dtype=np.int64)
    u = np.arange(units, dtype=np.int64)
    for b in range(1, int(nbins.max(initial=0))):
        feats = np.flatnonzero(nbins > b)
        cur = (offsets[feats, None] + b * units + u).ravel()
        prev = cur - units
        both = filled[prev] & filled[cur]
        carry = filled[prev] & ~filled[cur]
        if carry.any():             # an empty bin: the sum so far carries over
            flat[cur[carry]] = flat[prev[carry]]
            filled[cur[carry]] = True
        if both.any():
            p, c = prev[both], cur[both]
            k = p.size
            tab = np.concatenate([flat[p], flat[c]]).tobytes()
            idx = np.empty(2 * k, dtype=np.int32)
            idx[0::2] = np.arange(k)
            idx[1::2] = np.arange(k, 2 * k)
            flat[c] = np.frombuffer(nat.segment_products(tab, idx, np.arange(0, 2 * k + 1, 2)),
                                    dtype=np.uint64).reshape(-1, L)
            st["mults"] += k


def _node_hist_mont(st, rows: np.ndarray) -> bytes:
    """The node's partial cumulative histograms (as :func:`_node_hist`) as one table in the C kernel's Montgomery
    form, in the order [f][b][u] (neutral where this worker has no row in bins 0..b): a merge multiplies two such
    tables without leaving the kernel's form, and only the party converts the final sums."""
    nbins, nat, units = st["nbins"], st["native"], len(st["C"])
    one = _mont_one(nat)
    L = one.size
    offsets = np.cumsum([0] + [nb * units for nb in nbins])
    flat = np.tile(one, (int(offsets[-1]), 1))
    if rows.size:
        filled = np.zeros(int(offsets[-1]), dtype=bool)
        for srows, starts, plan in _cell_plans(st, rows, _groups(nbins, rows.size)):
            for u in range(units):
                cells = nat.segment_products(st["C52"][u], srows, starts)
                for f, keys_f, idx, seg in plan:
                    tab = cells if idx is None else nat.segment_products(cells, idx, seg)
                    at = offsets[f] + keys_f * units + u
                    flat[at] = np.frombuffer(tab, dtype=np.uint64).reshape(-1, L)
                    filled[at] = True
        _cumulate_mont(st, flat, filled, offsets, nbins, units)
    return flat.tobytes()


_BIN_DTYPES = {"uint8": np.uint8, "uint16": np.uint16, "int32": np.int32}


def _bin_dtype(nbins) -> str:
    top = max(nbins, default=1)
    return "uint8" if top <= 256 else "uint16" if top <= 65536 else "int32"


def _op_setup(st, args, blobs):
    """This worker's block of rows: their bins, column-major (``rows`` = [lo, hi) of the party's rows)."""
    st.clear()
    st["pub"] = pub = public_from_json(args["pub"])
    st["mul"] = _mul_of(pub)
    st["nbins"] = [int(v) for v in args["nbins"]]
    nf = len(st["nbins"])
    lo, hi = (int(v) for v in args["rows"])
    dtype = _BIN_DTYPES[args["dtype"]]
    st["n_local"] = hi - lo
    # column-major: a feature's codes for a node's rows are one gather from one contiguous column
    st["cols"] = np.frombuffer(blobs[0], dtype=dtype).reshape(nf, hi - lo) if nf else np.zeros((0, hi - lo), dtype)
    st["C"] = None
    st.pop("C52", None)
    # the C kernel for this key's ciphertexts (None: gmpy2 arithmetic), checked once per worker
    st["native"] = native.products(pub.modulus) if pub.modulus is not None else None
    return {"native": st["native"] is not None}, []


def _op_load(st, args, blobs):
    """The tree's ciphertexts of this worker's rows (row-major, ``units`` per row), each one checked."""
    pub, units = st["pub"], int(args["units"])
    st["C"] = None
    st.pop("C52", None)
    nat = st["native"]
    if nat is not None:
        # straight from the wire into the kernel's form: each value's range checked there, and all of them units
        # iff their product is (one gcd, as check_many)
        try:
            tab = nat.load_wire(blobs[0], pub.ct_bytes)
        except ValueError:
            pub.from_bytes(blobs[0], check=True)      # the scheme's own error for the value out of range
            raise CiphertextError("a ciphertext outside the range of the key's modulus") from None
        if len(tab) != st["n_local"] * units * 8 * nat.L:
            raise ValueError("ciphertext count does not match the rows")
        pub.check(nat.product(tab))
        if units == 1:
            st["C52"] = [tab]
        else:
            rows = np.frombuffer(tab, dtype=np.uint64).reshape(st["n_local"], units, nat.L)
            st["C52"] = [rows[:, u, :].tobytes() for u in range(units)]
        st["C"] = [None] * units
        return {}, []
    flat = pub.from_bytes(blobs[0], check=False)
    if len(flat) != st["n_local"] * units:
        raise ValueError("ciphertext count does not match the rows")
    pub.check_many(flat)
    st["C"] = [flat[u::units] for u in range(units)]
    return {}, []


def _op_hist(st, args, blobs):
    """Per node (one blob of this worker's local row indices each): its partial histograms, flat."""
    pub = st["pub"]
    one = pub.one()
    out = []
    st["mults"] = 0
    n_local = st["n_local"]
    mont = bool(args.get("mont"))
    if mont and st["native"] is None:
        raise ValueError("Montgomery-form partials asked of a worker without the C kernel")
    for raw in blobs:
        rows = np.frombuffer(raw, dtype=np.int32)
        if rows.size and (int(rows.min()) < 0 or int(rows.max()) >= n_local):
            raise ValueError("row index outside this worker's rows")
        if mont:
            out.append(_node_hist_mont(st, rows))
            continue
        h = _node_hist(st, rows)
        out.append(pub.to_bytes(one if c is None else c for f in h for b in f for c in b))
    return {"mults": st["mults"]}, out


def _merge_pub(st, args):
    pub = st.get("pub")
    if pub is None:     # a local pool merges in the party's process, which has no worker state
        pub = st.get("merge_pub")
        if pub is None:
            pub = st["merge_pub"] = public_from_json(args["pub"])
    return pub


def _merge_native(st, pub):
    nat = st.get("native")
    if nat is None:     # the party's own process (a local pool's merges)
        nat = st.get("merge_native")
        if nat is None:
            nat = st["merge_native"] = native.products(pub.modulus)
        if nat is None:
            raise ValueError("Montgomery-form partials need the C kernel where they are merged")
    return nat


def _merge_mont(nat, left, right, mults) -> tuple:
    one = _mont_one(nat)
    L = one.size
    out = []
    for a, b in zip(left, right):
        if len(a) != len(b) or len(a) % (8 * L):
            raise ValueError("partial histograms of different sizes")
        k = len(a) // (8 * L)
        A, B = np.frombuffer(a, dtype=np.uint64).reshape(k, L), np.frombuffer(b, dtype=np.uint64).reshape(k, L)
        mults += int(np.count_nonzero((A != one).any(axis=1) & (B != one).any(axis=1)))
        idx = np.empty(2 * k, dtype=np.int32)
        idx[0::2] = np.arange(k)
        idx[1::2] = np.arange(k, 2 * k)
        out.append(nat.segment_products(a + b, idx, np.arange(0, 2 * k + 1, 2)))
    return {"mults": mults}, out


def _op_merge(st, args, blobs):
    """Two workers' partial histograms (blobs[:split] and blobs[split:], one per node) multiplied per cell."""
    pub = _merge_pub(st, args)
    split = int(args["split"])
    left, right = blobs[:split], blobs[split:]
    if len(left) != len(right):
        raise ValueError("partial histograms of different node counts")
    one = pub.one()
    mults = sum(int(r.get("mults", 0)) for r in args["results"])
    if args.get("mont"):
        return _merge_mont(_merge_native(st, pub), left, right, mults)
    out = []
    for a, b in zip(left, right):
        xa, xb = pub.from_bytes(a, check=False), pub.from_bytes(b, check=False)
        if len(xa) != len(xb):
            raise ValueError("partial histograms of different sizes")
        merged = []
        for x, y in zip(xa, xb):
            if x == one:
                merged.append(y)
            elif y == one:
                merged.append(x)
            else:
                merged.append(pub.add(x, y))
                mults += 1
        out.append(pub.to_bytes(merged))
    return {"mults": mults}, out


def _horner(pub, group, widths):
    acc = group[-1]
    for c, w in zip(reversed(group[:-1]), reversed(widths[:-1])):
        acc = pub.add(pub.shift(acc, w), c)
    return acc


def _compress_mont(pub, nat, widths_list, raw: bytes) -> bytes:
    """:func:`_op_compress` of fields in the C kernel's Montgomery form (``raw``: rows of L digits, the groups one
    after another): the histogram sums go from the merge to the packing without a conversion in between."""
    row = 8 * nat.L
    shapes, pos = {}, 0
    for i, widths in enumerate(widths_list):
        shapes.setdefault(tuple(widths), []).append((i, pos))
        pos += len(widths)
    if pos * row != len(raw):
        raise ValueError("the fields do not match the widths")
    out = [None] * len(widths_list)
    for widths, items in shapes.items():
        g = len(widths)
        table = b"".join(raw[p * row:(p + g) * row] for _i, p in items)
        for (i, _p), c in zip(items, nat.horner_mont(table, list(widths))):
            out[i] = c
    return pub.to_bytes(out)


def _op_compress(st, args, blobs):
    """Horner packing: for fields x_0..x_m (lowest first) with widths w_j, E(sum_j 2^(w_0+..+w_(j-1)) x_j).
    Groups of one shape go through the C kernel (:mod:`treeflare.crypto.native`) together when it is usable; with
    ``mont`` the fields arrive in its Montgomery form.  The packed ciphertexts return as wire bytes."""
    pub, nat = st["pub"], st["native"]
    if args.get("mont"):
        if nat is None:
            raise ValueError("Montgomery-form fields sent to a worker without the C kernel")
        return {}, [_compress_mont(pub, nat, args["widths"], blobs[0])]
    flat = pub.from_bytes(blobs[0], check=False)
    out, pos, shapes = [], 0, {}
    for widths in args["widths"]:
        group = flat[pos:pos + len(widths)]
        pos += len(widths)
        if nat is not None and len(widths) > 1:
            shapes.setdefault(tuple(widths), []).append((len(out), group))
            out.append(None)
        else:
            out.append(_horner(pub, group, widths))
    for widths, items in shapes.items():
        for (i, _g), c in zip(items, nat.horner_many([g for _i, g in items], list(widths))):
            out[i] = c
    return {}, [pub.to_bytes(out)]


OPS = {"hist_setup": _op_setup, "hist_load": _op_load, "hist": _op_hist, "hist_merge": _op_merge,
       "hist_compress": _op_compress}


# --------------------------------------------------------------------------------- party side
class HistEngine:
    """A passive party's histogram and compression machinery for one run."""

    def __init__(self, pub, bins: np.ndarray, nbins: list, workers=1):
        self.pub = pub
        self.n, self.n_features = bins.shape
        self.nbins = [int(v) for v in nbins]
        workers = parse_workers(workers)
        if pub.modulus is None:           # the plaintext oracle: nothing worth a pool
            workers = 1
        elif not is_cluster(workers):     # blocks of at least 256 rows
            workers = max(1, min(workers or 1, self.n // 256 or 1))
        self.pool = make_pool(workers, [_MODULE])
        try:
            self.shards = even_ranges(self.n, self.pool.n)
            dtype = _bin_dtype(self.nbins)
            pub_json = public_to_json(pub)
            replies = self.pool.map("hist_setup", [{"pub": pub_json, "nbins": self.nbins,
                                                    "rows": [a, b], "dtype": dtype} for a, b in self.shards],
                                    [[np.ascontiguousarray(bins[a:b].T, dtype=_BIN_DTYPES[dtype]).tobytes()]
                                     for a, b in self.shards])
            # partials in the C kernel's form where every worker and this process have it (no conversions between
            # the rows and the final sums; merges in the kernel)
            self._nat = native.products(pub.modulus) if pub.modulus is not None else None
            self.mont = self._nat is not None and all(r.get("native") for r, _b in replies)
            self._merge_args = {"pub": pub_json, "mont": self.mont}
        except BaseException:
            self.pool.close()
            raise
        self.units = 0
        self.counts = {"multiplications": 0}
        self._table = None            # the layer's node sums in the kernel's Montgomery form (mont)
        self._offsets = np.cumsum([0] + self.nbins[:-1]).astype(np.int64)   # engine column -> first bin's entry

    def load(self, raw: bytes, units: int) -> None:
        """The tree's ciphertexts, ``units`` per row, row-major: each worker gets (and checks) its rows' only."""
        w = self.pub.ct_bytes
        if len(raw) != self.n * units * w:
            raise ValueError("ciphertext bytes do not match the rows")
        view = memoryview(raw)       # each worker's rows without copying the whole tree's ciphertexts again
        self.pool.map("hist_load", [{"units": units}] * self.pool.n,
                      [[view[a * units * w:b * units * w]] for a, b in self.shards])
        self.units = units

    def histograms(self, nodes: dict) -> dict:
        """{key: global row indices} -> {key: the node's cumulative sums} (neutral for empty bins), to be read with
        :meth:`handles` or :meth:`sums` until the next call: its ciphertexts, or where its table starts among the
        layer's sums in the kernel's Montgomery form."""
        keys = list(nodes)
        per_worker = [[] for _ in self.shards]
        for key in keys:
            rows = np.asarray(nodes[key], dtype=np.int64)
            if rows.size and (int(rows.min()) < 0 or int(rows.max()) >= self.n):
                raise ValueError("row index outside the party's rows")
            for i, (a, b) in enumerate(self.shards):
                local = rows[(rows >= a) & (rows < b)] - a
                per_worker[i].append(local.astype(np.int32).tobytes())
        res, blobs = self.pool.map_reduce("hist", [{"mont": self.mont}] * self.pool.n, per_worker, "hist_merge",
                                          self._merge_args)
        self.counts["multiplications"] += int(res["mults"])
        if self.mont:
            # the sums stay in the kernel's form, one table for the layer, until the workers pack them
            L = self._nat.L
            self._table = np.concatenate([np.frombuffer(raw, dtype=np.uint64).reshape(-1, L) for raw in blobs])
            starts = np.cumsum([0] + [len(raw) // (8 * L) for raw in blobs])
            return {key: int(a) for key, a in zip(keys, starts[:-1].tolist())}
        return {key: self.pub.from_bytes(raw, check=False) for key, raw in zip(keys, blobs)}

    def sums(self, hist) -> list:
        """A node's cumulative sums as integers, hist[f][b] = [one ciphertext per unit] (``hist``: what the last
        :meth:`histograms` call returned for the node)."""
        units, size = self.units, sum(self.nbins) * self.units
        flat = self._nat.values(self._table[hist:hist + size].tobytes()) if self.mont else hist
        out, pos = [], 0
        for nb in self.nbins:
            out.append([flat[pos + b * units:pos + (b + 1) * units] for b in range(nb)])
            pos += nb * units
        return out

    def handles(self, hist, cols: np.ndarray, bins: np.ndarray) -> list:
        """Per candidate (engine column, bin), its cumulative sums' handles, one per unit, in a node's ``hist``
        (what :meth:`histograms` returned for it), for :meth:`compress`: ciphertexts, or rows of the layer's
        Montgomery-form table."""
        units = self.units
        at = (self._offsets[cols] + bins) * units
        if self.mont:
            at = at + hist
            return [[a + u for u in range(units)] for a in at.tolist()] if units > 1 else [[a] for a in at.tolist()]
        return [hist[a:a + units] for a in at.tolist()]

    def compress(self, groups: list) -> bytes:
        """groups: [[(handle, width), ...] lowest field first] -> one ciphertext per group, as wire bytes."""
        if not groups:
            return b""
        if all(len(g) == 1 for g in groups) and not self.mont:
            return self.pub.to_bytes(g[0][0] for g in groups)
        # shares of at least 8 groups: the C kernel packs 8 groups at once (fewer lanes would idle)
        n_tasks = 1 if self.pool.n == 1 else max(1, min(len(groups) // 8, 4 * self.pool.n))
        # contiguous shares of about equal cost (sum of shift bits)
        cost = np.cumsum([sum(w for _c, w in g[:-1]) + 1 for g in groups])
        cuts = sorted(set([0] + [int(np.searchsorted(cost, cost[-1] * i / n_tasks)) for i in range(1, n_tasks)]
                          + [len(groups)]))
        tasks = []
        for a, b in zip(cuts[:-1], cuts[1:]):
            share = groups[a:b]
            if self.mont:
                rows = np.fromiter((h for g in share for h, _w in g), dtype=np.int64)
                blob = self._table[rows].tobytes()
            else:
                blob = self.pub.to_bytes(c for g in share for c, _w in g)
            tasks.append(({"widths": [[w for _c, w in g] for g in share], "mont": self.mont}, [blob]))
        return b"".join(rb[0] for _res, rb in self.pool.run_tasks("hist_compress", tasks))

    def close(self) -> None:
        self.pool.close()
