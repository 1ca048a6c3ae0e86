"""Where a job runs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Placement:
    """GPUs given to a job: ``((node_name, (gpu_index, ...)), ...)``.

    Parts are in the order the nodes were chosen; GPU indices ascend within a part.
    """

    parts: tuple[tuple[str, tuple[int, ...]], ...]

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.parts)

    @property
    def gpu_count(self) -> int:
        return sum(len(g) for _, g in self.parts)

    def __str__(self) -> str:
        return " ".join(f"{n}:{','.join(map(str, g))}" for n, g in self.parts)
