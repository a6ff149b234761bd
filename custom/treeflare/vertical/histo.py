"""Encrypted per-feature, per-bin sums at a passive party (the hot loop) and the compression of
returned results, on a persistent pool of worker processes (:mod:`treeflare.crypto.workers`).

Every worker holds the tree's ciphertexts and the bins (loaded once per tree; each worker checks a
share of the ciphertexts).  A layer's work is cut into pieces -- a node, or a slice of a large node's
rows -- that go to whichever worker is free next, so a worker slowed down by other load on a shared
machine simply does fewer; the party multiplies the partial per-bin products of a node's pieces.

Features are summed **in pairs**: the rows of a node are first multiplied into the joint cells
(bin of feature a, bin of feature b), then each feature's bins are products of its cells.  That
takes |rows| + |cells| multiplications for two features instead of 2 |rows|, and the result is
the same integer (a product mod n^2 does not depend on the order of its factors).

Where the C kernel (:mod:`treeflare.crypto.native`) is usable, a worker keeps its rows' ciphertexts in
the kernel's Montgomery form and multiplies cells and bins eight at a time; compression packs eight
groups at once.  Same integers as the gmpy2 path, which runs otherwise.
"""
from __future__ import annotations

import numpy as np

from ..crypto import native
from ..crypto.backend import even_ranges, public_from_json, public_to_json
from ..crypto.workers import make_pool

_MODULE = "treeflare.vertical.histo"


def _groups(n_features: int) -> list:
    return [tuple(range(f, min(f + 2, n_features))) for f in range(0, n_features, 2)]


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
    bins, nbins = st["bins"], st["nbins"]
    units = len(st["C"])
    if len(grp) == 2:
        fa, fb = grp
        nbb = nbins[fb]
        keys = bins[rows, fa].astype(np.int64) * nbb + bins[rows, fb]
    else:
        (fa,) = grp
        keys = bins[rows, fa].astype(np.int64)
    order = np.argsort(keys, kind="stable")
    skeys = keys[order]
    starts = np.asarray(_segments(skeys), dtype=np.int64)
    cell_keys = skeys[starts[:-1]]
    n_cells = len(starts) - 1
    st["mults"] += units * (rows.size - n_cells)
    if len(grp) == 1:
        return rows[order], starts, [(fa, cell_keys, None, None)]
    ka, kb = cell_keys // nbb, cell_keys % nbb      # sorted by key: the cells of one bin of fa are contiguous
    sa = np.asarray(_segments(ka), dtype=np.int64)
    ob = np.argsort(kb, kind="stable")
    sb = np.asarray(_segments(kb[ob]), dtype=np.int64)
    st["mults"] += units * (2 * n_cells - (len(sa) - 1) - (len(sb) - 1))
    return rows[order], starts, [(fa, ka[sa[:-1]], np.arange(n_cells), sa), (fb, kb[ob][sb[:-1]], ob, sb)]


def _node_hist(st, rows: np.ndarray) -> list:
    """out[f][b][u]: product over the node's rows of this worker with bin b of feature f (None if none).
    With the C kernel the products stay in its Montgomery form from the rows to the bins."""
    nbins, C, mul, nat = st["nbins"], st["C"], st["mul"], st["native"]
    units = len(C)
    out = [[[None] * units for _ in range(nb)] for nb in nbins]
    if rows.size == 0:
        return out
    for grp in st["groups"]:
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
    return out


def _op_setup(st, args, blobs):
    st.clear()
    st["pub"] = pub = public_from_json(args["pub"])
    st["mul"] = _mul_of(pub)
    st["nbins"] = [int(v) for v in args["nbins"]]
    nf = len(st["nbins"])
    st["bins"] = np.frombuffer(blobs[0], dtype=np.int32).reshape(-1, nf) if nf else np.zeros((0, 0), np.int32)
    st["groups"] = [tuple(g) for g in args["groups"]]
    st["C"] = None
    # the C kernel for this key's ciphertexts (None: gmpy2 arithmetic), checked once per worker
    st["native"] = native.products(pub.modulus) if pub.modulus is not None else None
    return {}, []


def _op_load(st, args, blobs):
    """The tree's ciphertexts (row-major, ``units`` per row); this worker checks rows [lo, hi)."""
    pub, units = st["pub"], int(args["units"])
    flat = pub.from_bytes(blobs[0], check=False)
    if len(flat) != st["bins"].shape[0] * units:
        raise ValueError("ciphertext count does not match the rows")
    lo, hi = (int(v) for v in args["check"])
    pub.check_many(flat[lo * units:hi * units])
    st["C"] = [flat[u::units] for u in range(units)]
    if st["native"] is not None:
        st["C52"] = [st["native"].load(c) for c in st["C"]]
    return {}, []


def _op_hist(st, args, blobs):
    pub = st["pub"]
    one = pub.one()
    out = []
    st["mults"] = 0
    for raw in blobs:            # one or more row sets (global row indices)
        h = _node_hist(st, np.frombuffer(raw, dtype=np.int32))
        out.append(pub.to_bytes(one if c is None else c for f in h for b in f for c in b))
    return {"mults": st["mults"]}, out


def _horner(pub, group, widths):
    acc = group[-1]
    for c, w in zip(reversed(group[:-1]), reversed(widths[:-1])):
        acc = pub.add(pub.shift(acc, w), c)
    return acc


def _op_compress(st, args, blobs):
    """Horner packing: for fields x_0..x_m (lowest first) with widths w_j, E(sum_j 2^(w_0+..+w_(j-1)) x_j).
    Groups of one shape go through the C kernel (:mod:`treeflare.crypto.native`) together when it is usable."""
    pub, nat = st["pub"], st["native"]
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


OPS = {"hist_setup": _op_setup, "hist_load": _op_load, "hist": _op_hist, "hist_compress": _op_compress}


# --------------------------------------------------------------------------------- party side
class HistEngine:
    """A passive party's histogram and compression machinery for one run."""

    def __init__(self, pub, bins: np.ndarray, nbins: list, workers: int = 1):
        self.pub = pub
        self.n, self.n_features = bins.shape
        self.nbins = [int(v) for v in nbins]
        k = max(1, min(int(workers or 1), self.n // 256 or 1)) if pub.modulus is not None else 1
        self.pool = make_pool(k, [_MODULE])
        groups = _groups(self.n_features)
        b32 = np.ascontiguousarray(bins, dtype=np.int32).tobytes()
        self.pool.map("hist_setup", [{"pub": public_to_json(pub), "nbins": self.nbins, "groups": groups}] * self.pool.n,
                      [[b32]] * self.pool.n)
        self.units = 0
        self.counts = {"multiplications": 0}

    def load(self, raw: bytes, units: int) -> None:
        """The tree's ciphertexts, ``units`` per row, row-major; each worker checks a share."""
        self.pool.map("hist_load", [{"units": units, "check": [a, b]} for a, b in even_ranges(self.n, self.pool.n)],
                      [[raw]] * self.pool.n)
        self.units = units

    def histograms(self, nodes: dict) -> dict:
        """{key: global row indices} -> {key: hist[f][b] = [unit ciphertexts]} (neutral for empty bins)."""
        keys = list(nodes)
        k = self.pool.n
        tasks, owner = [], []
        for key in keys:
            rows = np.ascontiguousarray(nodes[key], dtype=np.int32)
            pieces = 1 if k == 1 else max(1, min(2 * k, rows.size // 2048))
            for a, b in even_ranges(rows.size, pieces):
                tasks.append(({}, [rows[a:b].tobytes()]))
                owner.append(key)
        replies = self.pool.run_tasks("hist", tasks)
        self.counts["multiplications"] += sum(int(res["mults"]) for res, _ in replies)
        pub, units = self.pub, self.units
        one = pub.one()
        merged = {}
        for key, (_res, rb) in zip(owner, replies):
            part = pub.from_bytes(rb[0], check=False)
            if key not in merged:
                merged[key] = part
            else:
                merged[key] = [x if y == one else y if x == one else pub.add(x, y) for x, y in zip(merged[key], part)]
                self.counts["multiplications"] += len(part)
        out = {}
        for key in keys:
            flat, hist, pos = merged[key], [], 0
            for nb in self.nbins:
                hist.append([flat[pos + b * units:pos + (b + 1) * units] for b in range(nb)])
                pos += nb * units
            out[key] = hist
        return out

    def compress(self, groups: list) -> list:
        """groups: [[(ciphertext, width), ...] lowest field first] -> one ciphertext per group."""
        if not groups:
            return []
        if all(len(g) == 1 for g in groups):
            return [g[0][0] for g in groups]
        # shares of at least 8 groups: the C kernel packs 8 groups at once (fewer lanes would idle)
        n_tasks = 1 if self.pool.n == 1 else max(1, min(len(groups) // 8, 4 * self.pool.n))
        # contiguous shares of about equal cost (sum of shift bits)
        cost = np.cumsum([sum(w for _c, w in g[:-1]) + 1 for g in groups])
        cuts = sorted(set([0] + [int(np.searchsorted(cost, cost[-1] * i / n_tasks)) for i in range(1, n_tasks)]
                          + [len(groups)]))
        tasks = []
        for a, b in zip(cuts[:-1], cuts[1:]):
            share = groups[a:b]
            tasks.append(({"widths": [[w for _c, w in g] for g in share]},
                          [self.pub.to_bytes(c for g in share for c, _w in g)]))
        out = []
        for _res, rb in self.pool.run_tasks("hist_compress", tasks):
            out.extend(self.pub.from_bytes(rb[0], check=False))
        return out

    def close(self) -> None:
        self.pool.close()
