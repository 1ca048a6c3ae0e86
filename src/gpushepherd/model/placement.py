"""Where a job runs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Placement:
    """GPUs given to a job: ``((node_name, (gpu_index, ...)), ...)``.

    Parts are in the order the nodes were chosen; GPU indices ascend within a part.
    ``share``: for part of one GPU, what part (``fraction:0.18``, ``time_slice:1
    replica:10240MiB``, ``mps:2x25%``, ``mig:1g.10gb@3`` - profile and start slice);
    '' for whole GPUs.
    """

    parts: tuple[tuple[str, tuple[int, ...]], ...]
    share: str = ""

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.parts)

    @property
    def gpu_count(self) -> int:
        return sum(len(g) for _, g in self.parts)

    def __str__(self) -> str:
        text = " ".join(f"{n}:{','.join(map(str, g))}" for n, g in self.parts)
        return f"{text}[{self.share}]" if self.share else text
