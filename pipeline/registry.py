"""Dense slot ids for nodes, GPUs and network ports.

Window state lives in preallocated numpy arrays indexed by a *slot*: a small dense
integer per (node, gpu) or per (node, device, port). The registries here hand out
those slots (growing their tables by doubling) and keep a canonical order — sorted by
node name, then GPU / device / port — so that features never depend on the order in
which a live stream or a recording happened to introduce the keys.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd

from collector.sources.base import normalize_pci_bus_id


class NodeRegistry:
    """Node name → dense node id (0, 1, 2, … in order of first appearance)."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self.names: list[str] = []

    def __len__(self) -> int:
        return len(self.names)

    def id_of(self, name: str) -> int:
        """Id of one node, registering it on first sight."""
        i = self._ids.get(name)
        if i is None:
            i = self._ids[name] = len(self.names)
            self.names.append(name)
        return i

    def ids_of(self, names: np.ndarray) -> np.ndarray:
        """Vectorised :meth:`id_of` for an array of names (one dict lookup per distinct name)."""
        codes, uniques = pd.factorize(names, sort=False)
        table = np.fromiter((self.id_of(str(u)) for u in uniques), np.int32, len(uniques))
        return table[codes]

    def known_ids(self, names: Iterable[str]) -> np.ndarray:
        """Ids of those of *names* already registered (the others have no state to mute)."""
        got = (self._ids.get(n) for n in names)
        return np.array([i for i in got if i is not None], np.intp)

    def name_array(self) -> np.ndarray:
        """All node names, indexed by id (object array)."""
        return np.array(self.names, dtype=object)


class GpuRegistry:
    """(node id, gpu index) → slot, through a dense 2-D table that grows by doubling."""

    def __init__(self, nodes: NodeRegistry, expected_nodes: int = 256, gpus_per_node: int = 8,
                 expected_gpus: int = 1024) -> None:
        self.nodes = nodes
        self._table = np.full((max(expected_nodes, 1), max(gpus_per_node, 1)), -1, np.int32)
        self.slot_node = np.zeros(max(expected_gpus, 1), np.int32)
        self.slot_gpu = np.zeros(max(expected_gpus, 1), np.int16)
        self.n = 0
        self._order: np.ndarray | None = None

    @property
    def capacity(self) -> int:
        return len(self.slot_node)

    def slots_of(self, node_ids: np.ndarray, gpus: np.ndarray) -> np.ndarray:
        """Slots of (node_ids[i], gpus[i]), creating the missing ones. gpus must be ≥ 0."""
        node_ids = np.asarray(node_ids, np.int32)
        gpus = np.asarray(gpus, np.int64)
        if len(node_ids) == 0:
            return np.zeros(0, np.int32)
        need_n = int(node_ids.max()) + 1
        need_g = int(gpus.max()) + 1
        if need_n > self._table.shape[0] or need_g > self._table.shape[1]:
            self._grow_table(need_n, need_g)
        slots = self._table[node_ids, gpus]
        missing = slots < 0
        if missing.any():
            # new (node, gpu) pairs, numbered in (node id, gpu) order: one 1-D unique of packed
            # keys (a 2-D unique sorts rows of a whole read window, several times slower)
            packed = np.unique(node_ids[missing].astype(np.int64) << 32 | gpus[missing])
            pairs = np.stack([packed >> 32, packed & 0xFFFFFFFF])
            k = pairs.shape[1]
            while self.n + k > self.capacity:
                self.slot_node = _grown(self.slot_node, self.capacity * 2)
                self.slot_gpu = _grown(self.slot_gpu, self.capacity * 2)
            new = np.arange(self.n, self.n + k, dtype=np.int32)
            self._table[pairs[0], pairs[1]] = new
            self.slot_node[new] = pairs[0]
            self.slot_gpu[new] = pairs[1]
            self.n += k
            self._order = None
            slots = self._table[node_ids, gpus]
        return slots

    def _grow_table(self, need_n: int, need_g: int) -> None:
        rows, cols = self._table.shape
        while rows < need_n:
            rows *= 2
        while cols < need_g:
            cols *= 2
        t = np.full((rows, cols), -1, np.int32)
        t[: self._table.shape[0], : self._table.shape[1]] = self._table
        self._table = t

    def canonical_order(self) -> np.ndarray:
        """All slots sorted by (node name, gpu); cached until a slot is added."""
        if self._order is None:
            names = np.array(self.nodes.names, dtype=str)[self.slot_node[: self.n]]
            self._order = np.lexsort((self.slot_gpu[: self.n], names)).astype(np.int32)
        return self._order


class PortRegistry:
    """(node id, device, port) → port slot; ports are few, so a dict suffices."""

    def __init__(self, nodes: NodeRegistry, expected_ports: int = 1024) -> None:
        self.nodes = nodes
        self._ids: dict[tuple[int, str, int], int] = {}
        self.port_node = np.zeros(max(expected_ports, 1), np.int32)
        self.keys: list[tuple[int, str, int]] = []
        self._order: np.ndarray | None = None

    @property
    def n(self) -> int:
        return len(self.keys)

    @property
    def capacity(self) -> int:
        return len(self.port_node)

    def slots_of(self, node_ids: np.ndarray, devices: np.ndarray | pd.Categorical,
                 ports: np.ndarray) -> np.ndarray:
        """Port slots of each row, creating the missing ones (one dict lookup per distinct key,
        in order of first appearance). *devices*: names, or a Categorical looked up per category."""
        n = len(node_ids)
        if n == 0:
            return np.zeros(0, np.int32)
        if isinstance(devices, pd.Categorical):
            dev_codes, dev_values = devices.codes.astype(np.int64), devices.categories.to_numpy(object)
        else:
            dev_codes, dev_values = pd.factorize(np.asarray(devices, dtype=object), sort=False)
            dev_values = np.asarray(dev_values, dtype=object)
        node_ids = np.asarray(node_ids, np.int64)
        ports = np.asarray(ports, np.int64)
        # one int64 key per (node, device, port); factorize keeps the order of first appearance,
        # and each distinct key decodes back to its parts (device code -1, null, becomes 0)
        lo = int(ports.min())
        width, dev_n = int(ports.max()) - lo + 1, len(dev_values) + 1
        codes, uniq = pd.factorize((node_ids * dev_n + (dev_codes + 1)) * width + (ports - lo))
        node_dev, port = np.divmod(uniq, width)
        node, dev = np.divmod(node_dev, dev_n)
        dev_names = np.append(dev_values, None)[dev - 1]  # code 0 → the appended None
        ids = self._ids
        table = np.empty(len(uniq), np.int32)
        for u, k in enumerate(zip(node.tolist(), dev_names.tolist(), (port + lo).tolist())):
            s = ids.get(k)
            if s is None:
                s = ids[k] = len(self.keys)
                self.keys.append(k)
                if s >= self.capacity:
                    self.port_node = _grown(self.port_node, self.capacity * 2)
                self.port_node[s] = k[0]
                self._order = None
            table[u] = s
        return table[codes]

    def canonical_order(self) -> np.ndarray:
        """All port slots sorted by (node name, device, port); cached until one is added."""
        if self._order is None:
            names = self.nodes.names
            self._order = np.array(sorted(range(self.n), key=lambda s: (names[self.keys[s][0]],) + self.keys[s][1:]),
                                   dtype=np.int32)
        return self._order


def _grown(a: np.ndarray, size: int) -> np.ndarray:
    out = np.zeros((size,) + a.shape[1:], a.dtype)
    out[: len(a)] = a
    return out


def _pci_keys(bus_ids: np.ndarray | pd.Categorical) -> tuple[np.ndarray, np.ndarray]:
    """(code per row, -1 where missing; normalised id per code, ``None`` where malformed): each
    distinct bus id is normalised once (``0000:4e:00``, see :func:`normalize_pci_bus_id`)."""
    codes, uniques = pd.factorize(bus_ids, use_na_sentinel=True)
    table = np.empty(len(uniques), dtype=object)
    for j, u in enumerate(uniques):
        try:
            table[j] = normalize_pci_bus_id(str(u)) if str(u).count(":") in (1, 2) else None
        except ValueError:
            table[j] = None
    return codes, table


class PciGpuMap:
    """(node id, PCI bus id) → GPU index, learnt from GPU samples that carry ``pci_bus_id``.

    Some fleets' kernel-log XIDs name only the PCI bus id; NVML writes it as
    ``00000000:4E:00.0`` and the kernel as ``0000:4e:00``. Both are keyed by their
    normalised form (domain width, case and function dropped), so an XID event without a
    GPU index finds its GPU once that node's samples have told us the mapping.
    """

    def __init__(self) -> None:
        self._gpu: dict[tuple[int, str], int] = {}

    def __len__(self) -> int:
        return len(self._gpu)

    def learn(self, nodes: np.ndarray, gpus: np.ndarray, bus_ids: np.ndarray | pd.Categorical) -> None:
        """Record the bus id of each (node, gpu) row (distinct triples only; the latest wins)."""
        codes, table = _pci_keys(bus_ids)
        ok = codes >= 0
        if not ok.any():
            return
        n_ids, n_gpus = len(table), int(gpus.max()) + 1
        triple = pd.unique((nodes[ok].astype(np.int64) * n_gpus + gpus[ok]) * n_ids + codes[ok])
        node_gpu, code = np.divmod(triple, n_ids)
        for (n, g), k in zip(zip(*np.divmod(node_gpu, n_gpus)), table[code]):
            if k is not None:
                self._gpu[(int(n), k)] = int(g)

    def resolve(self, nodes: np.ndarray, bus_ids: np.ndarray | pd.Categorical) -> np.ndarray:
        """GPU index per row (int16), -1 where the bus id is missing or not (yet) known."""
        codes, table = _pci_keys(bus_ids)
        return np.fromiter((-1 if c < 0 or table[c] is None else self._gpu.get((int(n), table[c]), -1)
                            for n, c in zip(nodes, codes)), np.int16, len(codes))


class GpuUuids:
    """Which GPU sits in each slot, by a 64-bit hash of its ``gpu_uuid``: a new UUID at the same
    (node, index) is a GPU swap, and the part's history (baselines, lifetime counters) is another
    part's. The check is a gather and a compare per row (UUIDs hashed once per distinct value);
    only rows whose UUID differs from the slot's take the slower path, and those are rare: a
    slot's first rows, and a swap.
    """

    def __init__(self, capacity: int = 1024) -> None:
        self.hash = np.zeros(max(capacity, 1), np.int64)  # 0: no UUID seen yet
        #: (slot, ts of the new GPU's first sample) per swap seen, until the pipeline takes them
        self.swaps: list[tuple[int, float]] = []

    def observe(self, slots: np.ndarray, ts: np.ndarray, uuids: np.ndarray | pd.Categorical) -> None:
        """Learn the UUID of each row; a slot whose UUID changes records a swap at the first new row."""
        codes, uniques = pd.factorize(uuids, use_na_sentinel=True)
        if len(uniques) == 0:
            return
        table = pd.util.hash_array(np.asarray(uniques, dtype=object)).view(np.int64)
        h = np.append(np.where(table == 0, 1, table), 0)[codes]  # code -1 (null) → 0, never a swap
        need = int(slots.max()) + 1
        if need > len(self.hash):
            self.hash = _grown(self.hash, max(need, 2 * len(self.hash)))
        changed = (h != self.hash[slots]) & (h != 0)
        if changed.any():
            self._changed(slots[changed], ts[changed], h[changed])

    def _changed(self, slots: np.ndarray, ts: np.ndarray, h: np.ndarray) -> None:
        order = np.lexsort((ts, slots))
        slots, ts, h = slots[order], ts[order], h[order]
        first = np.ones(len(slots), bool)
        first[1:] = slots[1:] != slots[:-1]
        prev = np.empty_like(h)
        prev[1:] = h[:-1]
        prev[first] = self.hash[slots[first]]
        swap = (prev != 0) & (h != prev)
        self.swaps += zip(slots[swap].tolist(), ts[swap].tolist())
        last = np.append(first[1:], True)
        self.hash[slots[last]] = h[last]

    def take_swaps(self) -> list[tuple[int, float]]:
        """The swaps seen since the last call."""
        out, self.swaps = self.swaps, []
        return out


class Keys:
    """The registries of one pipeline (nodes, GPUs, ports, PCI bus ids, GPU UUIDs), shared by
    decoding and window state."""

    def __init__(self, expected_nodes: int = 256, expected_gpus: int = 1024, expected_ports: int = 1024) -> None:
        self.nodes = NodeRegistry()
        self.gpus = GpuRegistry(self.nodes, expected_nodes=expected_nodes, expected_gpus=expected_gpus)
        self.ports = PortRegistry(self.nodes, expected_ports=expected_ports)
        self.pci = PciGpuMap()
        self.uuids = GpuUuids(expected_gpus)
        self._names: np.ndarray = np.zeros(0, dtype=object)

    def node_names(self) -> np.ndarray:
        """Node names by id (object array), cached until a node is added."""
        if len(self._names) != len(self.nodes):
            self._names = self.nodes.name_array()
        return self._names
