"""The allocation ledger: which GPU of which node is free, unhealthy or held by whom.

Kept apart from the pending queues (as Kueue keeps its scheduler cache apart from its
queue manager). Free GPUs of a node are a bitmask; nodes of one *shape group* (same
GPU count, type, memory, pool, labels) sit in buckets by free count so that the
best-fit node for ``k`` GPUs is found without scanning every node.
"""

from __future__ import annotations

from bisect import bisect_left, insort

from gpushepherd.model.cluster import Node


def lowest_bits(mask: int, k: int) -> int:
    """The ``k`` lowest set bits of ``mask`` (GPUs by lowest index, the conventions' rule)."""
    out = 0
    while k:
        low = mask & -mask
        out |= low
        mask ^= low
        k -= 1
    return out


def bits(mask: int) -> tuple[int, ...]:
    """Indices of the set bits of ``mask``, ascending."""
    out = []
    i = 0
    while mask:
        if mask & 1:
            out.append(i)
        mask >>= 1
        i += 1
    return tuple(out)


def popcount(mask: int) -> int:
    return mask.bit_count()


class NodeSlot:
    """Live state of one node. ``free`` is the number of healthy free GPUs."""

    __slots__ = ("idx", "node", "total", "all_mask", "healthy_mask", "free_mask", "free", "group", "alive", "holder",
                 "healthy")

    def __init__(self, idx: int, node: Node, group: int):
        self.idx = idx
        self.node = node
        self.total = node.gpus
        self.all_mask = (1 << node.gpus) - 1
        self.healthy_mask = self.all_mask
        self.free_mask = self.all_mask
        self.free = node.gpus
        self.group = group
        self.alive = True
        self.holder: list[str | None] = [None] * node.gpus
        self.healthy = node.gpus  # healthy GPUs (kept equal to popcount(healthy_mask))


class Group:
    """Nodes with one shape key; ``buckets[f]`` holds the indices (ascending) of the
    group's live nodes with exactly ``f`` free GPUs."""

    __slots__ = ("gid", "shape", "gpus", "node", "members", "buckets", "free_sum", "healthy_sum")

    def __init__(self, gid: int, shape: tuple, node: Node):
        self.gid = gid
        self.shape = shape
        self.gpus = node.gpus
        self.node = node  # a representative, for the filters
        self.members: list[int] = []
        self.buckets: list[list[int]] = [[] for _ in range(node.gpus + 1)]
        self.free_sum = 0
        self.healthy_sum = 0


class Ledger:
    """Allocation state of the cluster.

    Invariant (checked by ``check``): every healthy GPU of a live node is either free
    or held by exactly one job; the buckets and sums agree with the nodes.
    """

    def __init__(self, nodes: tuple[Node, ...] | list[Node] = ()):
        self.slots: list[NodeSlot] = []
        self.by_name: dict[str, int] = {}
        self.groups: list[Group] = []
        self._group_of_shape: dict[tuple, int] = {}
        self.free_total = 0
        self.healthy_total = 0
        #: node indices in the order their allocation or health changed (memos of
        #: failed searches re-check only the nodes changed since)
        self.changes: list[int] = []
        for node in nodes:
            self.add_node(node)

    # -- nodes -------------------------------------------------------------
    def add_node(self, node: Node) -> NodeSlot:
        """Add a live node with all GPUs free and healthy. Raises ``ValueError`` if the
        name is live already."""
        if node.name in self.by_name and self.slots[self.by_name[node.name]].alive:
            raise ValueError(f"node {node.name!r} exists already")
        shape = node.shape_key()
        gid = self._group_of_shape.get(shape)
        if gid is None:
            gid = len(self.groups)
            self._group_of_shape[shape] = gid
            self.groups.append(Group(gid, shape, node))
        if node.name in self.by_name:  # a node that was lost comes back
            idx = self.by_name[node.name]
            slot = NodeSlot(idx, node, gid)
            self.slots[idx] = slot
        else:
            idx = len(self.slots)
            slot = NodeSlot(idx, node, gid)
            self.slots.append(slot)
            self.by_name[node.name] = idx
        group = self.groups[gid]
        insort(group.members, idx)
        insort(group.buckets[slot.free], idx)
        group.free_sum += slot.free
        group.healthy_sum += slot.total
        self.free_total += slot.free
        self.healthy_total += slot.total
        self.changes.append(idx)
        return slot

    def remove_node(self, idx: int) -> list[str]:
        """Take a node out; returns the ids of jobs that held GPUs on it (the caller
        releases them elsewhere)."""
        slot = self.slots[idx]
        if not slot.alive:
            return []
        holders = sorted({h for h in slot.holder if h is not None})
        group = self.groups[slot.group]
        _remove_sorted(group.buckets[slot.free], idx)
        _remove_sorted(group.members, idx)
        group.free_sum -= slot.free
        group.healthy_sum -= slot.healthy
        self.free_total -= slot.free
        self.healthy_total -= slot.healthy
        slot.alive = False
        slot.free = 0
        slot.free_mask = 0
        self.changes.append(idx)
        return holders

    def _set_free(self, slot: NodeSlot, new_mask: int) -> None:
        self.changes.append(slot.idx)
        old = slot.free
        new = new_mask.bit_count()
        slot.free_mask = new_mask
        if new != old:
            group = self.groups[slot.group]
            _remove_sorted(group.buckets[old], slot.idx)
            insort(group.buckets[new], slot.idx)
            group.free_sum += new - old
            self.free_total += new - old
            slot.free = new

    def set_gpu_health(self, idx: int, gpu: int, healthy: bool) -> str | None:
        """Mark one GPU healthy or not. Returns the job holding it, if any (an
        unhealthy GPU under a job is the caller's to handle)."""
        slot = self.slots[idx]
        bit = 1 << gpu
        was = bool(slot.healthy_mask & bit)
        if was == healthy or not slot.alive:
            return slot.holder[gpu]
        group = self.groups[slot.group]
        if healthy:
            slot.healthy_mask |= bit
            slot.healthy += 1
            group.healthy_sum += 1
            self.healthy_total += 1
            if slot.holder[gpu] is None:
                self._set_free(slot, slot.free_mask | bit)
        else:
            slot.healthy_mask &= ~bit
            slot.healthy -= 1
            group.healthy_sum -= 1
            self.healthy_total -= 1
            if slot.free_mask & bit:
                self._set_free(slot, slot.free_mask & ~bit)
        return slot.holder[gpu]

    # -- allocation ----------------------------------------------------------
    def allocate(self, job_id: str, idx: int, mask: int) -> None:
        """Give the GPUs of ``mask`` on node ``idx`` to ``job_id``. Raises
        ``ValueError`` if any of them is not free (a GPU is never given twice)."""
        slot = self.slots[idx]
        if mask & ~slot.free_mask or not slot.alive:
            raise ValueError(f"GPUs {bits(mask & ~slot.free_mask)} of {slot.node.name} are not free for {job_id}")
        for g in bits(mask):
            slot.holder[g] = job_id
        self._set_free(slot, slot.free_mask & ~mask)

    def release(self, job_id: str, idx: int, mask: int) -> None:
        """Return ``job_id``'s GPUs of ``mask`` on node ``idx``; unhealthy ones stay out."""
        slot = self.slots[idx]
        for g in bits(mask):
            if slot.holder[g] == job_id:
                slot.holder[g] = None
        if slot.alive:
            self._set_free(slot, slot.free_mask | (mask & slot.healthy_mask))

    # -- queries -------------------------------------------------------------
    def best_fit(self, groups: list[int], k: int) -> int | None:
        """Live node with the fewest free GPUs that still has ``k`` free, ties by
        lowest node index, among ``groups`` (bin-packing; the conventions' rule)."""
        best: int | None = None
        top = max((self.groups[g].gpus for g in groups), default=0)
        for f in range(k, top + 1):
            for g in groups:
                grp = self.groups[g]
                if f <= grp.gpus:
                    bucket = grp.buckets[f]
                    if bucket and (best is None or bucket[0] < best):
                        best = bucket[0]
            if best is not None:
                return best
        return None

    def free_in(self, groups: list[int]) -> int:
        return sum(self.groups[g].free_sum for g in groups)

    def healthy_in(self, groups: list[int]) -> int:
        return sum(self.groups[g].healthy_sum for g in groups)

    def max_free_node(self, groups: list[int]) -> int:
        best = 0
        for g in groups:
            grp = self.groups[g]
            for f in range(grp.gpus, best, -1):
                if grp.buckets[f]:
                    best = f
                    break
        return best

    def check(self) -> None:
        """Raise ``AssertionError`` if the ledger's own invariants do not hold."""
        free_total = healthy_total = 0
        for slot in self.slots:
            if not slot.alive:
                continue
            held = 0
            for g, h in enumerate(slot.holder):
                if h is not None:
                    held |= 1 << g
            assert held & slot.free_mask == 0, f"{slot.node.name}: a GPU is both free and held"
            expect_free = slot.healthy_mask & ~held
            assert slot.free_mask == expect_free, f"{slot.node.name}: free mask {slot.free_mask:b} != {expect_free:b}"
            assert slot.free == slot.free_mask.bit_count()
            assert slot.healthy == slot.healthy_mask.bit_count()
            grp = self.groups[slot.group]
            assert slot.idx in grp.buckets[slot.free], f"{slot.node.name}: not in bucket {slot.free}"
            free_total += slot.free
            healthy_total += slot.healthy
        assert free_total == self.free_total, f"free_total {self.free_total} != {free_total}"
        assert healthy_total == self.healthy_total
        for grp in self.groups:
            assert grp.free_sum == sum(self.slots[i].free for i in grp.members)
            assert sum(len(b) for b in grp.buckets) == len(grp.members)


def _remove_sorted(seq: list[int], value: int) -> None:
    i = bisect_left(seq, value)
    if i < len(seq) and seq[i] == value:
        del seq[i]
    else:  # pragma: no cover - a broken invariant, not an input error
        raise AssertionError(f"{value} missing from sorted list")
