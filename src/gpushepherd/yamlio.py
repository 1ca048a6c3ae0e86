"""Reading YAML files users write (policies, scenarios) without surprises.

``load_yaml`` refuses what a plain ``yaml.safe_load`` lets through silently or chokes
on: a key given twice in one mapping (the last one would win), recursive aliases, and
alias "bombs" that expand to millions of nodes. Every problem is one ``YamlError`` line
with the file, the line and column where known, and what is wrong.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

#: the most nodes a document may expand to once its aliases are followed
MAX_NODES = 1_000_000


class YamlError(ValueError):
    """A YAML document that cannot be used; ``str()`` is one line."""


class _Loader(yaml.SafeLoader):
    """SafeLoader that rejects a key repeated in one mapping."""

    def construct_mapping(self, node, deep=False):  # noqa: D401 - PyYAML hook
        seen: dict[Any, Any] = {}
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                hash(key)
            except TypeError:
                continue  # PyYAML reports unhashable keys itself
            if key in seen:
                mark = key_node.start_mark
                raise YamlError(f"line {mark.line + 1} column {mark.column + 1}: key {key!r} appears twice in one "
                                f"mapping (first on line {seen[key].line + 1}); allowed: each key once")
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 (PyYAML) reads 6e5 or 1e-3 as strings; YAML 1.2 and every user read them as
# numbers. Our own copy of the resolvers, so PyYAML's SafeLoader is left as it is.
_Loader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def read_text(path: str | Path) -> str:
    """The file's text (UTF-8, a leading byte-order mark dropped).

    Raises:
        YamlError: unreadable, or not UTF-8 text.
    """
    try:
        return Path(path).read_bytes().decode("utf-8-sig")
    except OSError as exc:
        raise YamlError(f"cannot read the file ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise YamlError(f"byte {exc.start} is not UTF-8 text; allowed: a UTF-8 text file") from None


def load_yaml(text: str) -> Any:
    """Parse one YAML document.

    Raises:
        YamlError: syntax error (with line and column), a repeated key, a recursive
            alias, or more than ``MAX_NODES`` nodes once aliases are expanded.
    """
    try:
        data = yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader
    except YamlError:
        raise
    except RecursionError:
        raise YamlError("the document is nested too deeply; allowed: a flatter document") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1} column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        context = getattr(exc, "context", None)
        detail = f"{problem} ({context})" if context else problem
        raise YamlError(f"{where}not valid YAML: {detail}") from None
    _check_size(data)
    return data


def _check_size(data: Any) -> None:
    # Aliases share objects: count each object's expanded size once (memoised by id),
    # and an object met again on its own path is a cycle.
    sizes: dict[int, int] = {}
    on_path: set[int] = set()

    def size(obj: Any) -> int:
        if not isinstance(obj, (dict, list)):
            return 1
        oid = id(obj)
        if oid in sizes:
            return sizes[oid]
        if oid in on_path:
            raise YamlError("a recursive alias (a mapping or list that contains itself) is not allowed")
        on_path.add(oid)
        children = list(obj.keys()) + list(obj.values()) if isinstance(obj, dict) else obj
        total = 1
        for child in children:
            total += size(child)
            if total > MAX_NODES:
                raise YamlError(f"the document expands to more than {MAX_NODES:,} nodes through its aliases; "
                                "allowed: a smaller document")
        on_path.discard(oid)
        sizes[oid] = total
        return total

    try:
        size(data)
    except RecursionError:
        raise YamlError("the document is nested too deeply; allowed: a flatter document") from None
