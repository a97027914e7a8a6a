"""What makes two process groups the same: ordered ranks, backend, backend options and timeout.

Every option is normalised once, where it enters (the Context's constructor, :class:`AxisOptions`),
into a value that compares and hashes the same in every process. Backend options are objects
torch defines (``ProcessGroupNCCL.Options``, ``ProcessGroupGloo._Options``); they are keyed by an
exact description of their fields, and options that cannot be described exactly (a field holding
an opaque object, such as a gloo ``Device``) are refused rather than silently shared: two groups
must never share a communicator because a field fmesh could not read looked alike.

>>> spec = GroupSettings.of(None, 60, backend="gloo").spec(("tp",), (0, 1))
>>> spec.ranks, spec.backend, spec.options_key, spec.timeout.total_seconds()
((0, 1), 'gloo', 'none', 60.0)
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import attrs

BACKENDS = ("gloo", "nccl", "fake", "mpi", "ucc", "xccl")
DEFAULT_TIMEOUT = timedelta(minutes=10)
# How long members wait for each other to create a group: much shorter than the collectives' timeout,
# since a member that has not come within minutes is gone or took another path.
DEFAULT_CREATION_TIMEOUT = timedelta(minutes=2)
MIN_TIMEOUT_SECONDS = 0.001  # backends count in whole milliseconds: less would be 0, "no time at all"
MAX_TIMEOUT_SECONDS = 365 * 24 * 3600.0  # a year; 1e10 s overflows gloo's and the store's nanosecond clocks
# Fields that torch fills in itself for each group it creates from an options object: not a choice.
_PER_GROUP_FIELDS = frozenset({"global_ranks_in_group", "group_name", "_timeout"})
_DEPTH = 4


def normalize_backend(backend: object) -> str | None:
    """A backend name in lower case, or ``None``; ``ValueError`` naming the choices otherwise.

    >>> normalize_backend("NCCL"), normalize_backend(None)
    ('nccl', None)
    """
    if backend is None:
        return None
    if not isinstance(backend, str) or backend.lower() not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    return backend.lower()


def normalize_timeout(value: object, default: timedelta | None = DEFAULT_TIMEOUT) -> timedelta | None:
    """Seconds or a ``timedelta`` as a positive ``timedelta`` (``default`` for ``None``).

    >>> normalize_timeout(90), normalize_timeout(None)
    (datetime.timedelta(seconds=90), datetime.timedelta(seconds=600))
    """
    if value is None:
        return default
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise TypeError(f"timeout must be seconds or a datetime.timedelta, got {value!r}")
    if not MIN_TIMEOUT_SECONDS <= seconds <= MAX_TIMEOUT_SECONDS:  # also refuses nan and inf
        raise ValueError(
            f"timeout must be between {MIN_TIMEOUT_SECONDS:g} s (backends count in milliseconds) and "
            f"{MAX_TIMEOUT_SECONDS:g} s (a year; gloo and the store overflow past that), but got {value!r}")
    return timedelta(seconds=seconds)


def describe_options(options: object) -> str:
    """An exact description of backend options, the same in every process (no addresses).

    Plain values, enums, sequences of them, and objects whose readable fields are all
    describable, recursively. Fields torch fills in per group (its name, ranks and timeout)
    are left out. Anything else raises ``ValueError`` naming the field.

    >>> describe_options(None)
    'none'
    >>> class Options:
    ...     threads = 4
    ...     devices = ["lo"]
    >>> describe_options(Options())
    "Options(devices=['lo'], threads=4)"
    """
    return _describe(options, "options", _DEPTH)


def _describe(value: object, where: str, depth: int) -> str:
    if value is None:
        return "none" if where == "options" else "None"
    if isinstance(value, (bool, int, float, str, bytes, timedelta)):
        return repr(value)
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, (list, tuple)):
        items = ", ".join(_describe(item, f"{where}[{i}]", depth - 1) for i, item in enumerate(value))
        return f"[{items}]" if isinstance(value, list) else f"({items})"
    fields = {
        name: getattr(value, name)
        for name in dir(value)
        if not name.startswith("__") and name not in _PER_GROUP_FIELDS and not callable(getattr(value, name, None))
    }
    if depth <= 0 or (not fields and " at 0x" in repr(value)):
        raise ValueError(
            f"backend options field {where} holds {value!r} ({type(value).__name__}), which fmesh cannot describe "
            "exactly, so it cannot tell whether two groups ask for the same options; use options whose fields "
            "are plain values (numbers, strings, lists of them), or create such a group with torch directly"
        )
    if not fields:
        return repr(value)
    described = ", ".join(f"{name}={_describe(field, f'{where}.{name}', depth - 1)}" for name, field in
                          sorted(fields.items()))
    return f"{type(value).__name__}({described})"


def _required(value: timedelta | None) -> timedelta:
    if value is None:  # normalize_timeout returns its default for None, and the defaults are set
        raise ValueError("a timeout is required here")
    return value


def _optional_timeout(value: object) -> timedelta | None:
    return normalize_timeout(value, None)


@attrs.frozen
class AxisOptions:
    """Per-axis overrides: another backend (say gloo for a CPU-side axis), options, or timeout.

    Checked and normalised here, before any group exists.

    >>> AxisOptions(backend="gloo", timeout=30)
    AxisOptions(backend='gloo', options=None, timeout=datetime.timedelta(seconds=30))
    """

    backend: str | None = attrs.field(default=None, converter=normalize_backend)
    options: Any = attrs.field(default=None, eq=False)
    timeout: timedelta | None = attrs.field(default=None, converter=_optional_timeout)
    options_key: str | None = attrs.field(init=False, repr=False)

    @options_key.default
    def _describe_options(self) -> str | None:
        return None if self.options is None else describe_options(self.options)


@attrs.frozen(cache_hash=True)
class GroupSpec:
    """What makes two process groups the same: the ordered ranks, backend, options and timeout.

    >>> GroupSpec((0, 1), "gloo", None, "none", timedelta(seconds=60)).digest()
    'ca2d854b525bf1122579'
    """

    ranks: tuple[int, ...]
    backend: str
    options: Any = attrs.field(eq=False, hash=False, repr=False)
    options_key: str
    timeout: timedelta

    def digest(self) -> str:
        """A short name for the group's content: the same in every process that means the same group."""
        content = repr((self.ranks, self.backend, self.options_key, self.timeout.total_seconds()))
        return hashlib.blake2b(content.encode(), digest_size=10).hexdigest()


@attrs.frozen
class GroupSettings:
    """The context-wide backend, options and timeout, and the per-axis overrides.

    >>> settings = GroupSettings.of(None, 60, {"dp": AxisOptions(backend="gloo")}, backend="nccl")
    >>> settings.spec(("dp",), (0, 2)).backend, settings.spec(("tp",), (0, 1)).backend
    ('gloo', 'nccl')
    """

    backend: str
    options: Any = attrs.field(eq=False)
    options_key: str
    timeout: timedelta
    axis_options: Mapping[str, AxisOptions]
    creation_timeout: timedelta = DEFAULT_CREATION_TIMEOUT

    @classmethod
    def of(
        cls,
        options: object,
        timeout: object,
        axis_options: Mapping[str, AxisOptions] | None = None,
        backend: str = "",
        creation_timeout: object = None,
    ) -> GroupSettings:
        """Normalise the Context's arguments (``ValueError``/``TypeError`` naming any bad one); the
        backend is the world's, set with ``attrs.evolve`` once the default group is known."""
        if axis_options is not None and not isinstance(axis_options, Mapping):
            raise TypeError(f"axis_options must map axis names (str) to fmesh.context.AxisOptions, "
                            f"got {axis_options!r}")
        overrides = dict(axis_options or {})
        for axis, override in overrides.items():
            if not isinstance(axis, str):
                raise TypeError(f"axis_options keys are axis names (str), but got {axis!r} "
                                f"({type(axis).__name__}); write axis_options={{'tp': fmesh.context.AxisOptions(...)}}")
            if not axis:
                raise ValueError("axis_options keys are axis names, but got the empty name '' (no axis is named ''); "
                                 "write axis_options={'tp': fmesh.context.AxisOptions(...)}")
            if not isinstance(override, AxisOptions):
                raise TypeError(f"axis_options[{axis!r}] must be fmesh.context.AxisOptions, got {override!r}")
        return cls(backend, options, describe_options(options), _required(normalize_timeout(timeout)), overrides,
                   _required(normalize_timeout(creation_timeout, DEFAULT_CREATION_TIMEOUT)))

    def spec(self, axes: tuple[str, ...], ranks: tuple[int, ...]) -> GroupSpec:
        """The spec of a group of ``ranks`` along ``axes``; ``ValueError`` if the axes' overrides clash."""
        overrides = {self.axis_options[a] for a in axes if a in self.axis_options}
        if len(overrides) > 1:
            raise ValueError(f"axes {axes} have different axis_options {sorted(map(repr, overrides))}; pick one")
        override = overrides.pop() if overrides else None
        if override is None:
            return GroupSpec(ranks, self.backend, self.options, self.options_key, self.timeout)
        has_options = override.options is not None
        return GroupSpec(
            ranks,
            override.backend or self.backend,
            override.options if has_options else self.options,
            override.options_key if has_options and override.options_key is not None else self.options_key,
            override.timeout or self.timeout,
        )


# Fields of GroupSettings that only say how long this rank waits, never what goes over the wire or which group a
# collective runs on: ranks may differ in them. Every other field, present and future, is agreed at start.
LOCAL_FIELDS = frozenset({"creation_timeout"})
# Fields described by another field (the backend options object, by its exact description ``options_key``).
DESCRIBED_FIELDS = frozenset({"options"})


def wire_options(settings: GroupSettings, check_tensors: str) -> dict[str, str]:
    """What the ranks of one context must agree on, each field as text the same in every process: every field of
    ``settings`` but :data:`LOCAL_FIELDS` (an option added later is covered by default), and how the members check
    their calls (``check_tensors``: the mode of :mod:`fmesh.context.call_checks`; a member that meets while another
    does not waits for it).

    >>> record = wire_options(GroupSettings.of(None, 60, backend="gloo"), check_tensors="steady")
    >>> sorted(record), record["check_tensors"]
    (['axis_options', 'backend', 'check_tensors', 'options_key', 'timeout'], "'steady'")
    """
    record = {field.name: _wire_text(getattr(settings, field.name)) for field in attrs.fields(GroupSettings)
              if field.name not in LOCAL_FIELDS | DESCRIBED_FIELDS}
    record["check_tensors"] = repr(check_tensors)
    return record


def _wire_text(value: object) -> str:
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{key!r}: {_wire_text(value[key])}" for key in sorted(value)) + "}"
    if isinstance(value, AxisOptions):
        return f"AxisOptions(backend={value.backend!r}, options={value.options_key!r}, timeout={value.timeout!r})"
    return repr(value)

