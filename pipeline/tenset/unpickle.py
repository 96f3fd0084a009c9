"""A restricted Unpickler for TenSet's task pickles.

TenSet pickled TVM 0.8 objects: each is stored as `(_new_object, (cls,), state)` where
`state` holds TVM's JSON graph of the object. Pickles from outside are untrusted, so
this Unpickler resolves only the handful of TVM names TenSet uses, and maps each to a
small stand-in class defined here: the named modules are never imported (TVM 0.27 has
no `tvm.auto_scheduler` anyway). Any other global is refused.

A small pickle must not become a huge value either: ten references to one list, nested
forty levels deep, is 1 KB on disk and 10^40 items once printed. So before anything is
built, the unpickler's stack is run over the opcode stream (read with `pickletools`)
and the pickle is refused unless it uses only the opcodes Python's pickler writes for
TenSet's values, every second reference (a memo get) fetches a string, number or class,
never a container, as in TenSet's own files (so the value is a tree), and that tree is
no deeper and no longer once printed than the limits below. Every error is one line
naming the file.
"""

from __future__ import annotations

import io
import json
import pickle
import pickletools
from pathlib import Path

from pipeline.core.errors import PipelineError

# Limits on what one pickle may hold, checked before anything is built. TenSet's task
# files nest 10 levels, hold one value per ~1 KB and print to about their own size.
MAX_DEPTH = 32
MAX_OPCODES = 5_000_000  # each value is at least one opcode, so this bounds their number
EXPANSION = 4  # printed size <= EXPANSION x file size + EXPANSION_SLACK characters
EXPANSION_SLACK = 1 << 20

RESTORE = "restore it from the TenSet archive"


class TaskFileError(pickle.UnpicklingError, PipelineError):
    """A TenSet pickle that cannot be used; the message names the file and what to do."""


class UnsafePickleError(TaskFileError):
    """The pickle holds what TenSet never writes: a global outside the allowlist, a shared
    container, a value over the limits."""


class DamagedPickleError(TaskFileError):
    """The file is truncated, malformed or not a TenSet pickle at all."""


def refused(source, reason: str) -> UnsafePickleError:
    return UnsafePickleError(f"{source}: refused: {_one_line(reason)}; TenSet never writes this, so {RESTORE}")


def damaged(source, reason: str) -> DamagedPickleError:
    return DamagedPickleError(f"{source}: damaged or not a TenSet task file ({_one_line(reason)}); {RESTORE}")


def _one_line(text: str, limit: int = 600) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


class TVMObject:
    """Stand-in for a pickled TVM object: keeps its state (TVM JSON graphs as text)."""

    type_name = "Object"

    def __setstate__(self, state):
        if not isinstance(state, dict):
            raise pickle.UnpicklingError(f"{self.type_name}: expected a dict state, got {type(state).__name__}")
        for k in state:  # a field may not replace a method (`kind`, `graph`) or a dunder
            if not isinstance(k, str) or hasattr(type(self), k):
                raise UnsafePickleError(f"{self.type_name} state sets field {str(k)[:80]!r}")
        self.__dict__.update(state)

    def __repr__(self):
        keys = ", ".join(sorted(self.__dict__))
        return f"<{self.type_name} ({keys})>"

    def json_graph(self) -> dict | None:
        """The TVM JSON graph stored under `handle` (Target, HardwareParams, Array...)."""
        h = self.__dict__.get("handle")
        return json.loads(h) if isinstance(h, str) else None


class SearchTask(TVMObject):
    type_name = "auto_scheduler.SearchTask"


class ComputeDAG(TVMObject):
    type_name = "auto_scheduler.ComputeDAG"

    def graph(self) -> dict:
        t = self.__dict__.get("tensors")
        if not isinstance(t, str):
            raise pickle.UnpicklingError("ComputeDAG without a 'tensors' JSON graph")
        return json.loads(t)


class HardwareParams(TVMObject):
    type_name = "auto_scheduler.HardwareParams"

    def params(self) -> dict:
        g = self.json_graph() or {}
        nodes = g.get("nodes", [])
        root = nodes[g.get("root", 0)] if nodes else {}
        return {k: _num(v) for k, v in root.get("attrs", {}).items()}


class Target(TVMObject):
    type_name = "Target"

    def kind(self) -> str:
        """The target kind name ("cuda", "llvm"), read from the JSON graph."""
        g = self.json_graph()
        if not g:
            raise pickle.UnpicklingError("Target without a JSON graph")
        nodes = g["nodes"]
        root = nodes[g["root"]]
        kind = nodes[int(root["attrs"]["kind"])]
        name = kind.get("attrs", {}).get("name")
        return str(_leaf(nodes, name)) if name is not None else kind.get("repr_str", "")

    def attrs(self) -> dict:
        """Target attributes (`-arch`, `-mcpu`, ...) as plain values."""
        g = self.json_graph()
        nodes = g["nodes"]
        root = nodes[g["root"]]
        amap = nodes[int(root["attrs"]["attrs"])]
        keys, out = amap.get("keys", []), {}
        data = amap.get("data", [])
        budget = [MAX_LEAF_NODES]  # for all attributes together
        if keys:  # string-keyed Map: "keys" names, "data" values
            pairs = zip(keys, data)
        else:
            pairs = ((_leaf(nodes, data[i], budget), data[i + 1]) for i in range(0, len(data), 2))
        for k, v in pairs:
            out[str(k)] = _leaf(nodes, v, budget)
        return out


class Array(TVMObject):
    type_name = "Array"


class Object(TVMObject):
    type_name = "Object"


class String(str):
    """Stand-in for tvm.runtime.container.String (a str subclass in TVM 0.8)."""

    def __setstate__(self, state):
        # NEWOBJ built the str value; the TVM handle in the state adds nothing.
        pass


def _new_object(cls):
    """TVM 0.8's `tvm.runtime.object._new_object`: an empty instance to BUILD into."""
    if not (isinstance(cls, type) and issubclass(cls, TVMObject)):
        raise UnsafePickleError(f"_new_object called with {cls!r}, which is not an allowed TVM class")
    return cls.__new__(cls)


# (module, name) -> stand-in. Nothing else may be named by a TenSet pickle.
ALLOWED = {
    ("tvm.runtime.object", "_new_object"): _new_object,
    ("tvm.runtime.object", "Object"): Object,
    ("tvm.auto_scheduler.search_task", "SearchTask"): SearchTask,
    ("tvm.auto_scheduler.search_task", "HardwareParams"): HardwareParams,
    ("tvm.auto_scheduler.compute_dag", "ComputeDAG"): ComputeDAG,
    ("tvm.target.target", "Target"): Target,
    ("tvm.ir.container", "Array"): Array,
    ("tvm.runtime.container", "String"): String,
}

# Opcodes that push a value a memo get may fetch again: strings, numbers, None/bools,
# globals (TenSet shares its dict keys and class names). A container fetched twice
# (lists, tuples, dicts, objects) is refused: it is how a small pickle grows.
_ATOMS = frozenset({
    "NONE", "NEWTRUE", "NEWFALSE", "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT",
    "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "SHORT_BINBYTES", "BINBYTES", "BINBYTES8",
    "GLOBAL", "STACK_GLOBAL",
})
_EMPTY = frozenset({"EMPTY_TUPLE", "EMPTY_LIST", "EMPTY_DICT"})
_TUPLE_N = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}
_MEMO_PUT = frozenset({"MEMOIZE", "BINPUT", "LONG_BINPUT"})
_MEMO_GET = frozenset({"BINGET", "LONG_BINGET"})
# Opcodes that add to the value below them: (values taken: a count, or "mark" for all
# above the last MARK; the opcodes that may have built the value they add to).
_GROW = {
    "APPEND": (1, ("EMPTY_LIST",)), "APPENDS": ("mark", ("EMPTY_LIST",)),
    "SETITEM": (2, ("EMPTY_DICT",)), "SETITEMS": ("mark", ("EMPTY_DICT",)),
    "BUILD": (1, ("REDUCE", "NEWOBJ")),  # an object's state, never a class or _new_object
}
# What Python's pickler writes (protocols 2-5) for None, bools, ints, floats, str, bytes,
# tuples, lists, dicts and objects rebuilt by REDUCE/NEWOBJ + BUILD. Not here: protocol
# 0/1 text opcodes, DUP and POP (stack tricks), extension codes, persistent ids, sets,
# bytearrays and out-of-band buffers, none of which TenSet writes.
_OPCODES = _ATOMS | _EMPTY | _MEMO_PUT | _MEMO_GET | set(_TUPLE_N) | set(_GROW) | {
    "PROTO", "FRAME", "STOP", "MARK", "TUPLE", "REDUCE", "NEWOBJ",
}


class _Value:
    """What the opcode check knows of a value on the unpickler's stack: the opcode and
    offset that pushed it, how deep it nests and how long it prints (approximately: one
    character per value plus the text of strings and the digits of numbers)."""

    __slots__ = ("op", "pos", "depth", "size")

    def __init__(self, op: str, pos: int, depth: int = 1, size: int = 1):
        self.op, self.pos, self.depth, self.size = op, pos, depth, size


def _allowed(module: str, name: str):
    try:
        return ALLOWED[(module, name)]
    except KeyError:
        raise UnsafePickleError(
            f"refusing to load global {module}.{name}: TenSet task pickles only name "
            f"{', '.join(sorted(m + '.' + n for m, n in ALLOWED))}"
        ) from None


class TenSetUnpickler(pickle.Unpickler):
    """Resolves only ALLOWED names, to the stand-ins above; imports nothing."""

    def find_class(self, module, name):
        return _allowed(module, name)

    def persistent_load(self, pid):
        raise UnsafePickleError(f"refusing persistent id {pid!r}")


def check_opcodes(data: bytes) -> None:
    """Runs the unpickler's stack over the opcode stream without building anything and
    refuses what TenSet never writes, before the real unpickler sees it: unknown opcodes,
    globals outside ALLOWED, memo slots out of order (a memo slot of 2^31 makes the
    unpickler allocate tens of GB), a memo get of a container, values nested deeper than
    MAX_DEPTH (hashing a 1 MB pickle of nested tuples crashes the interpreter) or printing
    longer than EXPANSION x the file size."""
    stream = io.BytesIO(data)
    check = _OpcodeCheck(max_size=EXPANSION * len(data) + EXPANSION_SLACK)
    try:
        for n, (op, arg, pos) in enumerate(pickletools.genops(stream), 1):
            if n > MAX_OPCODES:
                raise UnsafePickleError(f"more than {MAX_OPCODES:,} pickle opcodes (TenSet task files hold thousands)")
            check.step(op.name, arg, pos)
    except ValueError as e:  # pickletools: truncated data, unknown opcode byte, bad length
        raise DamagedPickleError(str(e)) from None
    if stream.tell() != len(data):
        raise DamagedPickleError(f"{len(data) - stream.tell()} bytes after the end of the pickle")


class _OpcodeCheck:
    """The unpickler's stack, MARKs and memo as check_opcodes follows them, one opcode at a
    time (`step`), each kind of opcode in a method of its own."""

    def __init__(self, max_size: int):
        self.max_size = max_size
        self.stack: list[_Value] = []
        self.marks: list[int] = []  # the stack's height at each open MARK
        self.memo: list[_Value] = []
        self.pos = 0  # the byte offset of the opcode being checked

    def step(self, name: str, arg, pos: int) -> None:
        self.pos = pos
        if name not in _OPCODES:
            raise DamagedPickleError(f"pickle opcode {name} at byte {pos}, which TenSet task files never use")
        if name in _ATOMS:
            self.atom(name, arg)
        elif name in _EMPTY:
            self.stack.append(_Value(name, pos))
        elif name == "MARK":
            self.marks.append(len(self.stack))
        elif name == "TUPLE" or name in _TUPLE_N:
            self.stack.append(self.grow(_Value(name, pos), self.take(_TUPLE_N.get(name, "mark"))))
        elif name in ("REDUCE", "NEWOBJ"):  # callable(*args): as deep and as long as its arguments
            args = self.take(2)[1]
            self.stack.append(self.grow(_Value(name, pos, max(1, args.depth - 1), args.size), []))
        elif name in _GROW:
            self.add_to_container(name)
        elif name in _MEMO_PUT:
            self.memo_put(name, arg)
        elif name in _MEMO_GET:
            self.memo_get(arg)
        elif name == "PROTO" and not 2 <= arg <= pickle.HIGHEST_PROTOCOL:
            raise DamagedPickleError(f"pickle protocol {arg} (TenSet task files use 2 to 4)")
        elif name == "STOP" and (len(self.stack) != 1 or self.marks):
            raise DamagedPickleError(f"{len(self.stack)} values and {len(self.marks)} open MARKs at the end "
                                     f"(expected 1 and 0)")

    def take(self, n) -> list[_Value]:
        """The top n values (or all above the last MARK), removed from the stack."""
        stack, marks = self.stack, self.marks
        if n == "mark":
            if not marks:
                raise DamagedPickleError(f"opcode at byte {self.pos} needs a MARK that is not there")
            n = len(stack) - marks.pop()
        if n > len(stack) - (marks[-1] if marks else 0):
            raise DamagedPickleError(f"opcode at byte {self.pos} takes more values than the stack holds")
        items = stack[len(stack) - n:]
        del stack[len(stack) - n:]
        return items

    def grow(self, v: _Value, items: list[_Value]) -> _Value:
        """`v` with `items` inside it, refused once too deep or too long."""
        v.depth = max(v.depth, 1 + max((x.depth for x in items), default=0))
        v.size += sum(x.size for x in items)
        if v.depth > MAX_DEPTH:
            raise UnsafePickleError(f"values nested deeper than {MAX_DEPTH} levels (TenSet task files nest 10)")
        if v.size > self.max_size:
            raise UnsafePickleError(f"values longer than {self.max_size:,} characters once printed "
                                    f"({EXPANSION}x the file size + {EXPANSION_SLACK:,})")
        return v

    def atom(self, name: str, arg) -> None:
        """A string, number, constant or global: one value, as long as its text."""
        if name == "GLOBAL":
            _allowed(*str(arg).split(" ", 1))
        elif name == "STACK_GLOBAL":  # module and name: checked by find_class
            self.take(2)
        text = len(arg) if isinstance(arg, (str, bytes)) else 0
        if isinstance(arg, int) and not isinstance(arg, bool):
            text = arg.bit_length() // 3  # about its decimal digits
        self.stack.append(_Value(name, self.pos, 1, 1 + text))

    def add_to_container(self, name: str) -> None:
        """APPEND(S), SETITEM(S), BUILD: items into the container below them, of a kind that takes them."""
        count, into = _GROW[name]
        items = self.take(count)
        stack, pos = self.stack, self.pos
        if len(stack) <= (self.marks[-1] if self.marks else 0):
            raise DamagedPickleError(f"{name} at byte {pos} has nothing to add to")
        if stack[-1].op not in into:
            raise UnsafePickleError(f"{name} at byte {pos} applied to the value of {stack[-1].op} "
                                    f"at byte {stack[-1].pos}")
        self.grow(stack[-1], items)

    def memo_put(self, name: str, arg) -> None:
        """Memo slots in sequence only: a slot of 2^31 makes the unpickler allocate tens of GB."""
        if name != "MEMOIZE" and arg != len(self.memo):
            raise DamagedPickleError(f"memo slot {arg} at byte {self.pos} out of sequence (expected {len(self.memo)})")
        if not self.stack:
            raise DamagedPickleError(f"{name} at byte {self.pos} with an empty stack")
        self.memo.append(self.stack[-1])

    def memo_get(self, arg) -> None:
        """A second reference to a string or a name only: shared containers expand without bound."""
        if not 0 <= arg < len(self.memo):
            raise DamagedPickleError(f"memo slot {arg} at byte {self.pos} read before it is written")
        v = self.memo[arg]
        if v.op not in _ATOMS:
            raise UnsafePickleError(
                f"a second reference (byte {self.pos}) to the container built by {v.op} at byte {v.pos}; "
                f"TenSet shares only strings and class names, and shared containers let a small "
                f"file expand without bound")
        self.stack.append(v)


def loads(data: bytes, source: str = "pickle data"):
    """Checks and loads one TenSet pickle; every failure is a TaskFileError naming `source`."""
    try:
        check_opcodes(data)
        obj = TenSetUnpickler(io.BytesIO(data)).load()
    except UnsafePickleError as e:
        raise refused(source, str(e)) from None
    except Exception as e:  # noqa: BLE001 - untrusted data: any failure means the file is unusable
        raise damaged(source, str(e) or type(e).__name__) from None
    return obj


def load(path: str | Path):
    """Load one TenSet pickle (a task pickle or all_tasks.pkl) with the restricted Unpickler."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise TaskFileError(f"{path}: cannot read it ({e.strerror or e}); check that it is a readable file, "
                            f"or {RESTORE}") from None
    return loads(data, str(path))


def _num(v):
    try:
        return int(v)
    except (TypeError, ValueError):
        try:
            return float(v)
        except (TypeError, ValueError):
            return v


# Nodes one target attribute may expand to: the JSON graph may share nodes, so writing an
# Array out is bounded (TenSet's targets have a few dozen nodes in all).
MAX_LEAF_NODES = 10_000


def _leaf(nodes, ref, budget: list[int] | None = None):
    """A JSON graph node as a plain value (strings, numbers, lists of them)."""
    budget = [MAX_LEAF_NODES] if budget is None else budget
    budget[0] -= 1
    if budget[0] < 0:
        raise pickle.UnpicklingError(f"a target attribute expands to more than {MAX_LEAF_NODES:,} nodes")
    n = nodes[int(ref)]
    tk = n.get("type_key")
    if tk in ("runtime.String", "String"):
        return n.get("repr_str", "")
    if tk == "IntImm":
        return int(n["attrs"]["value"])
    if tk == "FloatImm":
        return float(n["attrs"]["value"])
    if tk == "Array":
        return [_leaf(nodes, x, budget) for x in n.get("data", [])]
    return n
