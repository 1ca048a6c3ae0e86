"""The allocation ledger: which GPU of which node is free, unhealthy, unmanaged (runs
processes the scheduler did not start) or held by whom.

Kept apart from the pending queues (as Kueue keeps its scheduler cache apart from its
queue manager). Free GPUs of a node are a bitmask; nodes of one *shape group* (same
GPU count, type, memory, pool, labels) sit in buckets by free count so that the
best-fit node for ``k`` GPUs is found without scanning every node.
"""

from __future__ import annotations

from bisect import bisect_left, insort

from gpushepherd.model.cluster import Node

#: holder of a GPU that hosts shares (``fraction``, ``time_slice``, ``mps``) or is in
#: MIG mode: out of the whole-GPU inventory while it does
SHARED = "#shared"
MIG = "#mig"
FULL_MILLI = 1000
#: node changes kept unread at most (``Ledger.changes``); more: all are looked at again
MAX_CHANGES = 1 << 16


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


class ShareCard:
    """A GPU that hosts shares: its mode (the kind of its first share), what is used of
    it (milli-GPU, MiB, slots) and by whom. ``cap_slots`` 0: no slot limit."""

    __slots__ = ("mode", "milli", "mem", "slots", "cap_mem", "cap_slots", "holders", "key")

    def __init__(self, mode: str, cap_mem: int, cap_slots: int):
        self.mode = mode
        self.milli = 0
        self.mem = 0
        self.slots = 0
        self.cap_mem = cap_mem
        self.cap_slots = cap_slots
        self.holders: dict[str, tuple[int, int, int]] = {}
        self.key: tuple = ()

    def room(self) -> tuple[int, int]:
        """``(primary, MiB)`` left: the ordering key of tightest-card-first (primary:
        slots for time-slicing, milli-GPU otherwise)."""
        primary = self.cap_slots - self.slots if self.mode == "time_slice" else FULL_MILLI - self.milli
        return primary, self.cap_mem - self.mem

    def room_fraction(self) -> float:
        """The part of the card still free, in GPUs: the tightest of its compute,
        memory and (time-slicing / MPS) slots left."""
        parts = [(FULL_MILLI - self.milli) / FULL_MILLI]
        if self.cap_mem:
            parts.append((self.cap_mem - self.mem) / self.cap_mem)
        if self.cap_slots:
            parts.append((self.cap_slots - self.slots) / self.cap_slots)
        return max(0.0, min(parts))

    def fits(self, milli: int, mem: int, slots: int) -> bool:
        return (self.milli + milli <= FULL_MILLI and self.mem + mem <= self.cap_mem
                and (not self.cap_slots or self.slots + slots <= self.cap_slots))


class MigCard:
    """A GPU in MIG mode: its layout (``MigInstance`` by start) and each instance's holder."""

    __slots__ = ("layout", "holders", "healthy", "reconfiguring", "unmanaged")

    def __init__(self, layout: tuple):
        self.layout = tuple(layout)
        self.holders: list[str | None] = [None] * len(self.layout)
        self.healthy = True
        self.reconfiguring = False  # out of service until the driver applies a new layout
        self.unmanaged = False  # foreign processes on it: no instance is handed out

    @property
    def in_service(self) -> bool:
        return self.healthy and not self.reconfiguring and not self.unmanaged

    def free_of(self, profile: str) -> int | None:
        """Position of the free instance of ``profile`` with the lowest start, or ``None``."""
        if not self.in_service:
            return None
        for pos, inst in enumerate(self.layout):
            if inst.profile == profile and self.holders[pos] is None:
                return pos
        return None

    def free_count(self) -> int:
        return sum(1 for h in self.holders if h is None) if self.in_service else 0

    @property
    def idle(self) -> bool:
        return all(h is None for h in self.holders)


class NodeSlot:
    """Live state of one node. ``free`` is the number of healthy free (whole) GPUs;
    ``healthy`` counts GPUs that can be handed out whole (MIG GPUs never are; nor are
    unhealthy GPUs - ``sick_mask`` - or unmanaged ones - ``unmanaged_mask``, which keep
    their holders: ``healthy_mask`` is the GPUs in service)."""

    __slots__ = ("idx", "node", "total", "all_mask", "healthy_mask", "free_mask", "free", "group", "alive", "holder",
                 "healthy", "cards", "migs", "mig_mask", "sick_mask", "unmanaged_mask")

    def __init__(self, idx: int, node: Node, group: int):
        self.idx = idx
        self.node = node
        self.total = node.gpus
        self.all_mask = (1 << node.gpus) - 1
        self.mig_mask = 0
        self.migs: dict[int, MigCard] = {}
        for g, layout in node.mig:
            self.mig_mask |= 1 << g
            self.migs[g] = MigCard(layout)
        self.healthy_mask = self.all_mask & ~self.mig_mask
        self.sick_mask = 0
        self.unmanaged_mask = 0
        self.free_mask = self.healthy_mask
        self.free = self.free_mask.bit_count()
        self.group = group
        self.alive = True
        self.holder: list[str | None] = [MIG if self.mig_mask >> g & 1 else None for g in range(node.gpus)]
        self.healthy = self.free  # whole-capable healthy GPUs (kept equal to popcount(healthy_mask))
        self.cards: dict[int, ShareCard] = {}


class Group:
    """Nodes with one shape key; ``buckets[f]`` holds the indices (ascending) of the
    group's live nodes with exactly ``f`` free GPUs."""

    __slots__ = ("gid", "shape", "gpus", "node", "members", "buckets", "free_sum", "healthy_sum", "open")

    def __init__(self, gid: int, shape: tuple, node: Node):
        self.gid = gid
        self.shape = shape
        self.gpus = node.gpus - len(node.mig)  # GPUs that can be handed out whole
        self.node = node  # a representative, for the filters
        self.members: list[int] = []
        self.buckets: list[list[int]] = [[] for _ in range(self.gpus + 1)]
        self.free_sum = 0
        self.healthy_sum = 0
        #: share mode -> sorted ``(primary room, MiB room, node index, GPU)`` of its cards
        self.open: dict[str, list[tuple[int, int, int, int]]] = {}


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
        #: node indices in the order their allocation or health changed, drained by the
        #: release index (``releases.ReleaseIndex``); past ``MAX_CHANGES`` unread it is
        #: cleared and ``changes_lost`` set (the reader then looks at every node)
        self.changes: list[int] = []
        self.changes_lost = False
        #: per node index: a counter bumped at each change of its allocation, health or
        #: its holders' planned ends (``touch``): caches of per-node facts key on it
        self.version: list[int] = []
        for node in nodes:
            self.add_node(node)

    def touch(self, idx: int) -> None:
        """Node ``idx`` changed (allocation, health, or a holder's planned end)."""
        changes = self.changes
        if len(changes) >= MAX_CHANGES:
            changes.clear()
            self.changes_lost = True
        changes.append(idx)
        while idx >= len(self.version):
            self.version.append(0)
        self.version[idx] += 1

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
        group.healthy_sum += slot.healthy
        self.free_total += slot.free
        self.healthy_total += slot.healthy
        self.touch(idx)
        return slot

    def remove_node(self, idx: int) -> list[str]:
        """Take a node out; returns the ids of jobs that held GPUs on it (the caller
        releases them elsewhere)."""
        slot = self.slots[idx]
        if not slot.alive:
            return []
        holders = sorted({h for h in slot.holder if h is not None and h not in (SHARED, MIG)}
                         | {h for card in slot.cards.values() for h in card.holders}
                         | {h for card in slot.migs.values() for h in card.holders if h is not None})
        group = self.groups[slot.group]
        for g, card in list(slot.cards.items()):
            self._unindex(slot, g, card)
        slot.cards = {}
        _remove_sorted(group.buckets[slot.free], idx)
        _remove_sorted(group.members, idx)
        group.free_sum -= slot.free
        group.healthy_sum -= slot.healthy
        self.free_total -= slot.free
        self.healthy_total -= slot.healthy
        slot.alive = False
        slot.free = 0
        slot.free_mask = 0
        self.touch(idx)
        return holders

    def _set_free(self, slot: NodeSlot, new_mask: int) -> None:
        self.touch(slot.idx)
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

    def set_gpu_health(self, idx: int, gpu: int, healthy: bool) -> list[str]:
        """Mark one GPU healthy or not. Returns the jobs holding it or a share or MIG
        instance of it (on an unhealthy GPU they are the caller's to handle)."""
        return self._set_off(idx, gpu, "sick", not healthy)

    def set_gpu_unmanaged(self, idx: int, gpu: int, unmanaged: bool) -> list[str]:
        """Mark one GPU as running processes the scheduler did not start (or no longer):
        while it does, nothing of it is handed out; its holders keep it. Returns them."""
        return self._set_off(idx, gpu, "unmanaged", unmanaged)

    def _set_off(self, idx: int, gpu: int, why: str, off: bool) -> list[str]:
        """Set or clear one reason (``sick``, ``unmanaged``) for a GPU to be out of
        service; it is in service when it has none."""
        slot = self.slots[idx]
        bit = 1 << gpu
        if not slot.alive:
            return []
        if slot.mig_mask & bit:
            card = slot.migs[gpu]
            if why == "sick":
                card.healthy = not off
            else:
                card.unmanaged = off
            self.touch(idx)
            return sorted(h for h in card.holders if h is not None)
        if why == "sick":
            slot.sick_mask = slot.sick_mask | bit if off else slot.sick_mask & ~bit
        else:
            slot.unmanaged_mask = slot.unmanaged_mask | bit if off else slot.unmanaged_mask & ~bit
        healthy = not (slot.sick_mask | slot.unmanaged_mask) & bit
        holders = [slot.holder[gpu]] if slot.holder[gpu] not in (None, SHARED) else []
        if gpu in slot.cards:
            holders = sorted(slot.cards[gpu].holders)
        was = bool(slot.healthy_mask & bit)
        if was == healthy:
            return holders
        group = self.groups[slot.group]
        if healthy:
            slot.healthy_mask |= bit
            slot.healthy += 1
            group.healthy_sum += 1
            self.healthy_total += 1
            if slot.holder[gpu] is None:
                self._set_free(slot, slot.free_mask | bit)
            card = slot.cards.get(gpu)
            if card is not None and not card.key:  # its holders stayed (unmanaged): open again
                self._index(slot, gpu, card)
                self.touch(idx)
        else:
            slot.healthy_mask &= ~bit
            slot.healthy -= 1
            group.healthy_sum -= 1
            self.healthy_total -= 1
            if slot.free_mask & bit:
                self._set_free(slot, slot.free_mask & ~bit)
            card = slot.cards.get(gpu)
            if card is not None:  # no new shares on it; its holders are the caller's
                self._unindex(slot, gpu, card)
                card.key = ()
                self.touch(idx)
        return holders

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

    # -- shares ----------------------------------------------------------------
    def _index(self, slot: NodeSlot, gpu: int, card: ShareCard) -> None:
        if not slot.alive or not slot.healthy_mask >> gpu & 1:
            card.key = ()
            return
        primary, mem = card.room()
        card.key = (primary, mem, slot.idx, gpu)
        insort(self.groups[slot.group].open.setdefault(card.mode, []), card.key)

    def _unindex(self, slot: NodeSlot, gpu: int, card: ShareCard) -> None:
        if card.key:
            _remove_sorted(self.groups[slot.group].open[card.mode], card.key)
            card.key = ()

    def best_card(self, groups: list[int], kind: str, milli: int, mem: int, slots: int,
                  exclude: frozenset[int] = frozenset(), cards=()) -> tuple[int, int] | None:
        """The card already shared in mode ``kind`` with the least room left that
        still fits ``(milli, MiB, slots)``: ``(node index, GPU)`` or ``None``. Every
        card of ``groups`` is considered (tightest first: primary room, then MiB
        room, then node and GPU index), but those on ``exclude`` nodes and the
        ``(node index, GPU)`` pairs in ``cards``."""
        primary = slots if kind == "time_slice" else milli
        best = None
        slots_of = self.slots
        for g in groups:
            lst = self.groups[g].open.get(kind)
            if not lst:
                continue
            for key in lst[bisect_left(lst, (primary, mem)):]:
                if best is not None and key >= best:
                    break
                if (key[2] not in exclude and slots_of[key[2]].cards[key[3]].fits(milli, mem, slots)
                        and (not cards or (key[2], key[3]) not in cards)):
                    best = key
                    break
        return None if best is None else (best[2], best[3])

    def allocate_share(self, job_id: str, idx: int, gpu: int, kind: str, need: tuple[int, int, int]) -> None:
        """Give ``job_id`` a ``kind`` share of ``need`` = ``(milli, MiB, slots)`` on
        GPU ``gpu`` of node ``idx``. Raises ``ValueError`` if the GPU is neither free
        nor shared in the same mode with room (memory is never over-committed, a
        card's fractions never exceed 1000 milli)."""
        slot = self.slots[idx]
        milli, mem, slots = need
        card = slot.cards.get(gpu)
        node = slot.node
        if card is None:
            if not slot.alive or not slot.free_mask >> gpu & 1:
                raise ValueError(f"GPU {gpu} of {node.name} is not free for a share of {job_id}")
            if not node.supports(kind):
                raise ValueError(f"{node.name} offers no {kind} shares (for {job_id})")
            cap_slots = node.ts_replicas if kind == "time_slice" else node.mps_clients if kind == "mps" else 0
            card = ShareCard(kind, node.gpu_mem_mib, cap_slots)
            if not card.fits(milli, mem, slots):
                raise ValueError(f"a {kind} share {need} of {job_id} does not fit GPU {gpu} of {node.name}")
            slot.holder[gpu] = SHARED
            self._set_free(slot, slot.free_mask & ~(1 << gpu))
            slot.cards[gpu] = card
        else:
            if card.mode != kind or not card.fits(milli, mem, slots) or job_id in card.holders or not card.key:
                raise ValueError(f"a {kind} share {need} of {job_id} does not fit GPU {gpu} of {node.name} "
                                 f"({card.mode}: {card.milli} milli, {card.mem} MiB, {card.slots} slots used)")
            self._unindex(slot, gpu, card)
        card.milli += milli
        card.mem += mem
        card.slots += slots
        card.holders[job_id] = need
        self._index(slot, gpu, card)
        self.touch(idx)

    def release_share(self, job_id: str, idx: int, gpu: int) -> None:
        """Take ``job_id``'s share off the card; the last one out frees the GPU."""
        slot = self.slots[idx]
        card = slot.cards.get(gpu)
        if card is None or job_id not in card.holders:
            return
        self._unindex(slot, gpu, card)
        milli, mem, slots = card.holders.pop(job_id)
        card.milli -= milli
        card.mem -= mem
        card.slots -= slots
        self.touch(idx)
        if card.holders:
            self._index(slot, gpu, card)
            return
        del slot.cards[gpu]
        slot.holder[gpu] = None
        if slot.alive and slot.healthy_mask >> gpu & 1:
            self._set_free(slot, slot.free_mask | (1 << gpu))

    def best_mig(self, groups: list[int], profile: str,
                 exclude: frozenset[int] = frozenset()) -> tuple[int, int, int] | None:
        """A free MIG instance of ``profile``: on the card with the fewest free
        instances (tightest), then lowest node and GPU index; the instance with the
        lowest start. Returns ``(node index, GPU, instance position)`` or ``None``."""
        best = None
        for g in groups:
            grp = self.groups[g]
            if not grp.node.mig:
                continue
            for idx in grp.members:
                if idx in exclude:
                    continue
                slot = self.slots[idx]
                for gpu in sorted(slot.migs):
                    card = slot.migs[gpu]
                    pos = card.free_of(profile)
                    if pos is not None:
                        key = (card.free_count(), idx, gpu, pos)
                        if best is None or key < best:
                            best = key
        return None if best is None else best[1:]

    def allocate_mig(self, job_id: str, idx: int, gpu: int, pos: int) -> None:
        """Give MIG instance ``pos`` of GPU ``gpu`` on node ``idx`` to ``job_id``.
        Raises ``ValueError`` if it is taken or the GPU is not in MIG mode."""
        slot = self.slots[idx]
        card = slot.migs.get(gpu)
        if card is None or not slot.alive or not 0 <= pos < len(card.layout) or card.holders[pos] is not None:
            raise ValueError(f"MIG instance {pos} of GPU {gpu} on {slot.node.name} is not free for {job_id}")
        card.holders[pos] = job_id
        self.touch(idx)

    def release_mig(self, job_id: str, idx: int, gpu: int, pos: int) -> None:
        card = self.slots[idx].migs.get(gpu)
        if card is not None and 0 <= pos < len(card.holders) and card.holders[pos] == job_id:
            card.holders[pos] = None
            self.touch(idx)

    def begin_reconfigure(self, idx: int, gpu: int) -> None:
        """Take an idle MIG GPU out of service for a new layout. Raises ``ValueError``
        while any instance is held."""
        slot = self.slots[idx]
        card = slot.migs.get(gpu)
        if card is None or not card.idle:
            raise ValueError(f"GPU {gpu} of {slot.node.name} is not an idle MIG GPU")
        card.reconfiguring = True
        self.touch(idx)

    def reconfigure_mig(self, idx: int, gpu: int, layout: tuple) -> None:
        """Give an idle MIG GPU ``layout`` (``MigInstance``s) and put it back in
        service. Raises ``ValueError`` while any instance is held."""
        slot = self.slots[idx]
        card = slot.migs.get(gpu)
        if card is None or not card.idle:
            raise ValueError(f"GPU {gpu} of {slot.node.name} is not an idle MIG GPU")
        new = MigCard(layout)
        new.healthy = card.healthy
        new.unmanaged = card.unmanaged
        slot.migs[gpu] = new
        self.touch(idx)

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
            expect_service = slot.all_mask & ~slot.mig_mask & ~slot.sick_mask & ~slot.unmanaged_mask
            assert slot.healthy_mask == expect_service, f"{slot.node.name}: GPUs in service drifted"
            grp = self.groups[slot.group]
            assert slot.idx in grp.buckets[slot.free], f"{slot.node.name}: not in bucket {slot.free}"
            free_total += slot.free
            healthy_total += slot.healthy
            for g, card in slot.cards.items():
                assert slot.holder[g] == SHARED and not slot.free_mask >> g & 1, f"{slot.node.name}:{g} shared but free"
                sums = [sum(v[i] for v in card.holders.values()) for i in range(3)]
                assert sums == [card.milli, card.mem, card.slots], f"{slot.node.name}:{g}: share sums drifted"
                assert card.holders, f"{slot.node.name}:{g}: an empty shared card"
                assert card.milli <= FULL_MILLI, f"{slot.node.name}:{g}: {card.milli} milli > 1000"
                assert card.mem <= card.cap_mem, f"{slot.node.name}:{g}: {card.mem} MiB > {card.cap_mem}"
                assert not card.cap_slots or card.slots <= card.cap_slots, f"{slot.node.name}:{g}: slots over"
                if card.key:
                    assert card.key == (*card.room(), slot.idx, g)
                    lst = self.groups[slot.group].open[card.mode]
                    i = bisect_left(lst, card.key)
                    assert i < len(lst) and lst[i] == card.key, f"{slot.node.name}:{g}: not indexed"
            for g, h in enumerate(slot.holder):
                if h == SHARED:
                    assert g in slot.cards
                if h == MIG:
                    assert slot.mig_mask >> g & 1
            assert not slot.healthy_mask & slot.mig_mask, f"{slot.node.name}: a MIG GPU counted as whole"
        assert free_total == self.free_total, f"free_total {self.free_total} != {free_total}"
        assert healthy_total == self.healthy_total
        for grp in self.groups:
            assert grp.free_sum == sum(self.slots[i].free for i in grp.members)
            for mode, lst in grp.open.items():
                assert lst == sorted(lst)
                for key in lst:
                    card = self.slots[key[2]].cards.get(key[3])
                    assert card is not None and card.key == key and card.mode == mode, f"stale open-card entry {key}"
            assert sum(len(b) for b in grp.buckets) == len(grp.members)


def _remove_sorted(seq: list[int], value: int) -> None:
    i = bisect_left(seq, value)
    if i == len(seq) or seq[i] != value:  # pragma: no cover - a broken invariant, not an input error
        raise AssertionError(f"{value} missing from sorted list")
    del seq[i]
