"""MongoDB's semantics for ``bucketq.memory``, sans I/O: the order of BSON values across types, query
filters, update operators, find projections and the aggregation stages and expressions bucketq uses.
Values are as ``bson.decode`` returns them (``STORED`` codec options: aware UTC dates, ``DatetimeMS``
beyond Python's range)."""

from __future__ import annotations

import calendar
import copy
import datetime as dt
import functools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any, TypeGuard

import bson
from bson import Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.codec_options import CodecOptions, DatetimeConversion
from pymongo.errors import OperationFailure, WriteError

from bucketq.errors import BucketqError

UTC = dt.timezone.utc
# How documents are held: dates as aware UTC datetimes, or DatetimeMS beyond Python's range.
STORED: CodecOptions[dict[str, Any]] = CodecOptions(tz_aware=True, tzinfo=UTC,
                                                    datetime_conversion=DatetimeConversion.DATETIME_AUTO)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
_INT64 = (-(2**63), 2**63 - 1)
_MISSING: Any = type("Missing", (), {"__repr__": lambda self: "<missing>"})()


class Unsupported(BucketqError, NotImplementedError):
    """The in-memory database does not implement this part of MongoDB."""


# -- BSON order -------------------------------------------------------------------------------------------

def _rank(value: Any) -> int:
    """The rank of a value's type in MongoDB's comparison order (numbers share one rank)."""
    kind = type(value)
    rank = _RANKS.get(kind)  # matching a filter ranks every value it reaches: each type is looked up once
    if rank is None:
        rank = _RANKS[kind] = _rank_of_type(value)
    return rank


_RANKS: dict[type, int] = {}  # filled by _rank: the rank depends on the type alone


def _rank_of_type(value: Any) -> int:
    if value is None or value is _MISSING:
        return 1
    if isinstance(value, bool):
        return 8
    if isinstance(value, (int, float, Decimal128)):
        return 2
    if isinstance(value, str):
        return 3
    if isinstance(value, Mapping):
        return 4
    if isinstance(value, list):
        return 5
    if isinstance(value, bytes):
        return 6
    if isinstance(value, ObjectId):
        return 7
    if isinstance(value, (dt.datetime, bson.DatetimeMS)):
        return 9
    if isinstance(value, Timestamp):
        return 10
    if isinstance(value, (Regex, re.Pattern)):
        return 11
    if isinstance(value, MinKey):
        return 0
    if isinstance(value, MaxKey):
        return 12
    raise Unsupported(f"values of type {type(value).__name__} cannot be compared")


def _millis(value: dt.datetime | bson.DatetimeMS) -> int:
    if isinstance(value, bson.DatetimeMS):
        return int(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return calendar.timegm(value.utctimetuple()) * 1000 + value.microsecond // 1000


def _number(value: Any) -> Any:
    return value.to_decimal() if isinstance(value, Decimal128) else value


def _sign(a: Any, b: Any) -> int:
    return (a > b) - (a < b)


def compare(a: Any, b: Any) -> int:
    """-1, 0 or 1, as MongoDB orders ``a`` and ``b`` (across types: null < numbers < strings < objects <
    arrays < binary < ObjectId < booleans < dates < timestamps < regular expressions)."""
    ra, rb = _rank(a), _rank(b)
    if ra != rb:
        return _sign(ra, rb)
    if ra == 2:
        return _sign(_number(a), _number(b))
    if ra == 4:
        for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=False):
            step = _sign(_rank(va), _rank(vb)) or _sign(ka, kb) or compare(va, vb)
            if step:
                return step
        return _sign(len(a), len(b))
    if ra == 5:
        for va, vb in zip(a, b, strict=False):
            step = compare(va, vb)
            if step:
                return step
        return _sign(len(a), len(b))
    if ra == 6:
        return _sign((len(a), getattr(a, "subtype", 0), bytes(a)), (len(b), getattr(b, "subtype", 0), bytes(b)))
    if ra == 7:
        return _sign(a.binary, b.binary)
    if ra == 9:
        return _sign(_millis(a), _millis(b))
    if ra == 10:
        return _sign((a.time, a.inc), (b.time, b.inc))
    if ra == 11:
        return _sign((a.pattern, str(a.flags)), (b.pattern, str(b.flags)))
    if ra in (3, 8):
        return _sign(a, b)
    return 0  # null, MinKey, MaxKey


_sort_key = functools.cmp_to_key(compare)

_TYPE_CODES = {"double": 1, "string": 2, "object": 3, "array": 4, "binData": 5, "objectId": 7, "bool": 8,
               "date": 9, "null": 10, "regex": 11, "int": 16, "timestamp": 17, "long": 18, "decimal": 19,
               "minKey": -1, "maxKey": 127}
_NUMBER_CODES = frozenset({1, 16, 18, 19})


def _type_code(value: Any) -> int:
    if isinstance(value, bool):
        return 8
    if isinstance(value, Int64):
        return 18
    if isinstance(value, int):
        return 16 if -(2**31) <= value < 2**31 else 18
    if isinstance(value, float):
        return 1
    return {1: 10, 2: 19, 3: 2, 4: 3, 5: 4, 6: 5, 7: 7, 9: 9, 10: 17, 11: 11, 0: -1, 12: 127}[_rank(value)]


def _identity(value: Any) -> Any:
    """A hashable stand-in, equal for values MongoDB holds equal (1 and 1.0; the same date in either type)."""
    rank = _rank(value)
    if rank in (2, 3, 8):
        return rank, _number(value)
    if rank == 9:
        return rank, _millis(value)
    return rank, bson.encode({"": value})


def write_error(message: str, code: int, kind: type[WriteError] = WriteError, **details: Any) -> WriteError:
    """A write error as PyMongo raises it from a server's reply: the reply's write error as ``details``."""
    return kind(message, code, {"index": 0, "code": code, "errmsg": message, **details})


def type_name(value: Any) -> str:
    """The BSON type name of ``value`` ("string", "long", ...), as MongoDB's messages say it."""
    code = _type_code(value)
    return next((name for name, c in _TYPE_CODES.items() if c == code), "missing")


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float, Decimal128))


# -- queries ------------------------------------------------------------------------------------------------

def _resolve(value: Any, parts: list[str]) -> list[Any]:
    """Every value a dotted path reaches, through arrays of documents as MongoDB goes; [] when missing."""
    if not parts:
        return [value]
    head, rest = parts[0], parts[1:]
    if isinstance(value, Mapping):
        return _resolve(value[head], rest) if head in value else []
    if isinstance(value, list):
        found: list[Any] = []
        if head.isdigit() and int(head) < len(value):
            found += _resolve(value[int(head)], rest)
        for item in value:
            if isinstance(item, Mapping):
                found += _resolve(item, parts)
        return found
    return []


def _leaves(found: list[Any]) -> Iterator[Any]:
    """What a condition tests: each value found, and the elements of those that are arrays."""
    for value in found:
        yield value
        if isinstance(value, list):
            yield from value


def _regex(pattern: Any, options: str = "") -> re.Pattern[str]:
    if isinstance(pattern, Regex):
        return pattern.try_compile()
    if isinstance(pattern, re.Pattern):
        return pattern
    flags = 0
    for letter, flag in (("i", re.I), ("m", re.M), ("s", re.S), ("x", re.X)):
        if letter in options:
            flags |= flag
    return re.compile(pattern, flags)


def _equal(found: list[Any], value: Any) -> bool:
    if isinstance(value, (Regex, re.Pattern)):
        return _regex_matches(found, _regex(value))
    if value is None and not found:
        return True
    return any(_rank(leaf) == _rank(value) and compare(leaf, value) == 0 for leaf in _leaves(found))


def _regex_matches(found: list[Any], pattern: re.Pattern[str]) -> bool:
    return any(isinstance(leaf, str) and pattern.search(leaf) for leaf in _leaves(found))


_ORDERINGS: dict[str, Callable[[int], bool]] = {
    "$gt": lambda c: c > 0, "$gte": lambda c: c >= 0, "$lt": lambda c: c < 0, "$lte": lambda c: c <= 0}


def _operator(name: str, arg: Any, found: list[Any], spec: Mapping[str, Any]) -> bool:
    if name == "$eq":
        return _equal(found, arg)
    if name == "$ne":
        return not _equal(found, arg)
    if name in _ORDERINGS:
        if arg is None:  # only null (and missing) is comparable with null
            return name in ("$gte", "$lte") and _equal(found, None)
        test = _ORDERINGS[name]
        return any(_rank(leaf) == _rank(arg) and test(compare(leaf, arg)) for leaf in _leaves(found))
    if name == "$in":
        return any(_equal(found, v) for v in _as_list(name, arg))
    if name == "$nin":
        return not any(_equal(found, v) for v in _as_list(name, arg))
    if name == "$exists":
        return bool(found) == bool(arg)
    if name == "$type":
        wanted: set[Any] = set()  # type codes, or an unknown alias that matches nothing
        for t in arg if isinstance(arg, list) else [arg]:
            wanted |= _NUMBER_CODES if t == "number" else {_TYPE_CODES.get(t, t)}
        return any(_type_code(leaf) in wanted for leaf in _leaves(found))
    if name == "$not":
        if isinstance(arg, Mapping):
            return not _condition(found, arg)
        return not _regex_matches(found, _regex(arg))
    if name == "$regex":
        return _regex_matches(found, _regex(arg, spec.get("$options", "")))
    if name == "$options":
        return True
    if name == "$size":
        return any(isinstance(v, list) and len(v) == arg for v in found)
    raise Unsupported(f"query operator {name} is not implemented by bucketq.memory")


def _as_list(name: str, arg: Any) -> list[Any]:
    if not isinstance(arg, list):
        raise OperationFailure(f"{name} needs an array", 2)
    return arg


def is_operators(value: Any) -> TypeGuard[Mapping[str, Any]]:
    return isinstance(value, Mapping) and bool(value) and next(iter(value)).startswith("$")


def _condition(found: list[Any], spec: Any) -> bool:
    if is_operators(spec):
        return all(_operator(name, arg, found, spec) for name, arg in spec.items())
    return _equal(found, spec)


def matches(doc: Mapping[str, Any], query: Mapping[str, Any]) -> bool:
    """Whether ``doc`` matches the query filter ``query``."""
    for key, spec in query.items():
        if key == "$and":
            ok = all(matches(doc, q) for q in _as_list(key, spec))
        elif key == "$or":
            ok = any(matches(doc, q) for q in _as_list(key, spec))
        elif key == "$nor":
            ok = not any(matches(doc, q) for q in _as_list(key, spec))
        elif key.startswith("$"):
            raise Unsupported(f"top-level query operator {key} is not implemented by bucketq.memory")
        else:
            ok = _condition(_resolve(doc, key.split(".")), spec)
        if not ok:
            return False
    return True


def _sort_value(doc: Mapping[str, Any], path: str, direction: int) -> Any:
    """The value a document sorts by: null when missing; an array sorts by its least (or greatest) element."""
    found = _resolve(doc, path.split("."))
    values = [e for v in found for e in (v if isinstance(v, list) and v else [v])]
    if not values:
        return None
    pick = min if direction > 0 else max
    return pick(values, key=_sort_key)


def sort_documents(docs: Iterable[Mapping[str, Any]], sort: list[tuple[str, int]]) -> list[Mapping[str, Any]]:
    out = list(docs)
    for path, direction in reversed(sort):  # stable sorts, last key first
        out.sort(key=_sort_by(path, direction), reverse=direction < 0)
    return out


def _sort_by(path: str, direction: int) -> Callable[[Mapping[str, Any]], Any]:
    return lambda doc: _sort_key(_sort_value(doc, path, direction))


def sort_spec(sort: Any) -> list[tuple[str, int]]:
    if sort is None:
        return []
    if isinstance(sort, str):
        return [(sort, 1)]
    if isinstance(sort, Mapping):
        return list(sort.items())
    return [(k, d) for k, d in sort]


def project(doc: Mapping[str, Any], projection: Mapping[str, Any] | list[str] | None) -> dict[str, Any]:
    """A find projection: inclusion (``{"a": 1}``) or exclusion (``{"a": 0}``) of top-level or dotted fields."""
    if projection is None:
        return dict(doc)
    if isinstance(projection, list):
        projection = {k: 1 for k in projection}
    fields = {k: v for k, v in projection.items() if k != "_id"}
    if any(not isinstance(v, (bool, int, float)) for v in fields.values()):
        raise Unsupported("projection operators are not implemented by bucketq.memory")
    keep_id = bool(projection.get("_id", 1))
    if fields and all(fields.values()):
        out: dict[str, Any] = {"_id": doc["_id"]} if keep_id and "_id" in doc else {}
        for path in fields:
            _copy_path(doc, out, path.split("."))
        return out
    out = copy.deepcopy(dict(doc))
    for path in fields:
        _unset(out, path.split("."))
    if not keep_id:
        out.pop("_id", None)
    return out


def _copy_path(source: Mapping[str, Any], target: dict[str, Any], parts: list[str]) -> None:
    head = parts[0]
    if head not in source:
        return
    if len(parts) == 1:
        target[head] = copy.deepcopy(source[head])
    elif isinstance(source[head], Mapping):
        _copy_path(source[head], target.setdefault(head, {}), parts[1:])


# -- updates ------------------------------------------------------------------------------------------------

def _lookup(doc: Any, parts: list[str]) -> Any:
    for part in parts:
        if isinstance(doc, Mapping) and part in doc:
            doc = doc[part]
        elif isinstance(doc, list) and part.isdigit() and int(part) < len(doc):
            doc = doc[int(part)]
        else:
            return _MISSING
    return doc


def _parent(doc: MutableMapping[str, Any], parts: list[str], create: bool) -> Any:
    """The container holding the path's last part, creating documents on the way; a path through a value
    that is neither a document nor an array (null included) is a write error, as MongoDB's."""
    node: Any = doc
    for i, part in enumerate(parts[:-1]):
        if isinstance(node, list):
            if not part.isdigit():
                raise write_error(f"Cannot create field '{part}' in element {{{parts[i - 1]}: array}}", 28)
            index = int(part)
            if index >= len(node):
                if not create:
                    return None
                node.extend([None] * (index + 1 - len(node)))
            if node[index] is None and create:
                node[index] = {}
            node = node[index]
        elif part not in node:
            if not create:
                return None
            node = node.setdefault(part, {})
        else:
            node = node[part]
        if not isinstance(node, (MutableMapping, list)):
            if not create:
                return None
            raise write_error(f"Cannot create field '{parts[i + 1]}' in element {{{part}: {node!r}}}", 28)
    return node


def _set(doc: MutableMapping[str, Any], parts: list[str], value: Any) -> None:
    parent = _parent(doc, parts, create=True)
    last = parts[-1]
    if isinstance(parent, list):
        if not last.isdigit():
            raise write_error(f"Cannot create field '{last}' in an array", 28)
        index = int(last)
        parent.extend([None] * (index + 1 - len(parent)))
        parent[index] = value
    else:
        parent[last] = value


def _unset(doc: MutableMapping[str, Any], parts: list[str]) -> None:
    parent = _parent(doc, parts, create=False)
    if isinstance(parent, MutableMapping):
        parent.pop(parts[-1], None)
    elif isinstance(parent, list) and parts[-1].isdigit() and int(parts[-1]) < len(parent):
        parent[int(parts[-1])] = None


def _inc(doc: MutableMapping[str, Any], parts: list[str], amount: Any) -> None:
    path = ".".join(parts)
    if not _is_number(amount):
        raise write_error(f"Cannot increment with non-numeric argument: {{{path}: {amount!r}}}", 14)
    current = _lookup(doc, parts)
    if current is _MISSING:
        _set(doc, parts, amount)
        return
    if not _is_number(current):
        raise write_error(f"Cannot apply $inc to a value of non-numeric type. {{_id: {doc.get('_id')!r}}} has the "
                         f"field '{path}' of non-numeric type {type_name(current)}", 14)
    if isinstance(current, Decimal128) or isinstance(amount, Decimal128):
        total: Any = Decimal128(_number(current) + _number(amount))
    else:
        total = current + amount
        if isinstance(total, int):
            if not _INT64[0] <= total <= _INT64[1]:
                raise write_error(f"Failed to apply $inc operations to current value ({current!r}) for document "
                                 f"{{_id: {doc.get('_id')!r}}}", 2)
            if isinstance(current, Int64) or isinstance(amount, Int64):
                total = Int64(total)  # a long stays a long, as in MongoDB
    _set(doc, parts, total)


def _add_each(doc: MutableMapping[str, Any], parts: list[str], spec: Any, operator: str) -> None:
    values = spec["$each"] if isinstance(spec, Mapping) and "$each" in spec else [spec]
    current = _lookup(doc, parts)
    if current is _MISSING:
        current = []
        _set(doc, parts, current)
    elif not isinstance(current, list):
        raise write_error(f"Cannot apply {operator} to non-array field. Field named '{parts[-1]}' has non-array "
                           f"type {type_name(current)}", 2)
    if operator == "$push":
        current.extend(values)
        return
    present = {_identity(v) for v in current}
    for value in values:
        if _identity(value) not in present:
            present.add(_identity(value))
            current.append(value)


def upsert_seed(query: Mapping[str, Any]) -> dict[str, Any]:
    """The document an upsert starts from: the equality conditions of its filter."""
    doc: dict[str, Any] = {}
    for key, spec in query.items():
        if key == "$and":
            for part in spec:
                doc.update(upsert_seed(part))
        elif not key.startswith("$") and (not is_operators(spec) or set(spec) == {"$eq"}):
            _set(doc, key.split("."), spec["$eq"] if is_operators(spec) else spec)
    return doc


def _check_conflicts(update: Mapping[str, Any]) -> None:
    seen: list[str] = []
    for fields in update.values():
        for path in fields:
            for other in seen:
                if path == other or path.startswith(other + ".") or other.startswith(path + "."):
                    raise write_error(f"Updating the path '{path}' would create a conflict at '{other}'", 40)
            seen.append(path)


def _pull(doc: MutableMapping[str, Any], parts: list[str], spec: Any) -> None:
    current = _lookup(doc, parts)
    if current is _MISSING:
        return
    if not isinstance(current, list):
        raise write_error("Cannot apply $pull to a non-array value", 2)

    def pulled(element: Any) -> bool:
        if is_operators(spec):
            return _condition([element], spec)
        if isinstance(spec, Mapping) and isinstance(element, Mapping):
            return matches(element, spec)
        return _equal([element], spec)

    current[:] = [e for e in current if not pulled(e)]


def apply_update(doc: MutableMapping[str, Any], update: Mapping[str, Any], *, inserting: bool = False) -> None:
    """Apply an update document (``$set``, ``$unset``, ``$inc``, ``$addToSet``, ``$push``, ``$pull``, and
    ``$setOnInsert`` when ``inserting``) to ``doc`` in place."""
    _check_conflicts(update)
    for operator, fields in update.items():
        if not isinstance(fields, Mapping):
            raise write_error(f"Modifiers operate on fields but we found type {type(fields).__name__} instead", 9)
        for path, value in fields.items():
            parts = path.split(".")
            if parts[0] == "_id" and not inserting:
                raise write_error("Performing an update on the path '_id' would modify the immutable field '_id'", 66)
            if operator == "$set":
                _set(doc, parts, value)
            elif operator == "$unset":
                _unset(doc, parts)
            elif operator == "$inc":
                _inc(doc, parts, value)
            elif operator in ("$addToSet", "$push"):
                _add_each(doc, parts, value, operator)
            elif operator == "$pull":
                _pull(doc, parts, value)
            elif operator == "$setOnInsert":
                if inserting:
                    _set(doc, parts, value)
            else:
                raise Unsupported(f"update operator {operator} is not implemented by bucketq.memory")


UPDATE_OPERATORS = frozenset({"$set", "$unset", "$inc", "$addToSet", "$push", "$pull", "$setOnInsert"})


# -- aggregation --------------------------------------------------------------------------------------------

def _truthy(value: Any) -> bool:
    if value is None or value is _MISSING or value is False:
        return False
    return not (_is_number(value) and _number(value) == 0)


def _nullish(value: Any) -> bool:
    return value is None or value is _MISSING


def _field(doc: Mapping[str, Any], path: str) -> Any:
    value: Any = doc
    for part in path.split("."):
        if isinstance(value, Mapping):
            value = value.get(part, _MISSING)
        elif isinstance(value, list):
            value = [v[part] for v in value if isinstance(v, Mapping) and part in v]
        else:
            return _MISSING
    return value


def _args(spec: Any, count: int | None = None, name: str = "") -> list[Any]:
    args = spec if isinstance(spec, list) else [spec]
    if count is not None and len(args) != count:
        raise OperationFailure(f"Expression {name} takes exactly {count} arguments. {len(args)} were passed in.", 16020)
    return args


def _subtract(a: Any, b: Any) -> Any:
    if _nullish(a) or _nullish(b):
        return None
    if _is_number(a) and _is_number(b):
        return _number(a) - _number(b)
    if _rank(a) == 9 and _rank(b) == 9:
        return _millis(a) - _millis(b)
    if _rank(a) == 9 and _is_number(b):
        return _EPOCH + dt.timedelta(milliseconds=_millis(a) - _number(b))
    raise OperationFailure(f"cant $subtract a {type_name(b)} from a {type_name(a)}", 16556)


def evaluate(expr: Any, doc: Mapping[str, Any]) -> Any:
    """An aggregation expression's value for ``doc`` (``_MISSING`` for a missing field)."""
    if isinstance(expr, str) and expr.startswith("$"):
        if expr in ("$$ROOT", "$$CURRENT"):
            return doc
        if expr.startswith("$$"):
            raise Unsupported(f"variable {expr} is not implemented by bucketq.memory")
        return _field(doc, expr[1:])
    if isinstance(expr, list):
        return [evaluate(e, doc) for e in expr]
    if not isinstance(expr, Mapping):
        return expr
    if not is_operators(expr):
        return {k: v for k, v in ((k, evaluate(v, doc)) for k, v in expr.items()) if v is not _MISSING}
    ((name, spec),) = expr.items()
    if name == "$literal":
        return spec
    if name == "$cond":
        if isinstance(spec, Mapping):
            spec = [spec.get("if"), spec.get("then"), spec.get("else")]
        test, then, otherwise = _args(spec, 3, name)
        return evaluate(then if _truthy(evaluate(test, doc)) else otherwise, doc)
    if name == "$ifNull":
        *candidates, fallback = _args(spec)
        for candidate in candidates:
            value = evaluate(candidate, doc)
            if not _nullish(value):
                return value
        return evaluate(fallback, doc)
    args = [evaluate(a, doc) for a in _args(spec)]
    if name == "$and":
        return all(_truthy(a) for a in args)
    if name == "$or":
        return any(_truthy(a) for a in args)
    if name == "$not":
        return not _truthy(_args(args, 1, name)[0])
    if name in ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$cmp"):
        a, b = (None if v is _MISSING else v for v in _args(args, 2, name))
        order = compare(a, b)
        return order if name == "$cmp" else order == 0 if name == "$eq" else order != 0 if name == "$ne" else \
            _ORDERINGS[name](order)
    if name == "$isArray":
        return isinstance(_args(args, 1, name)[0], list)
    if name == "$size":
        (value,) = _args(args, 1, name)
        if not isinstance(value, list):
            raise OperationFailure(f"The argument to $size must be an array. Type of argument: "
                                   f"{'missing' if value is _MISSING else type_name(value)}", 17124)
        return len(value)
    if name == "$subtract":
        return _subtract(*_args(args, 2, name))
    if name == "$add":
        if any(_nullish(a) for a in args):
            return None
        if not all(_is_number(a) for a in args):
            raise Unsupported("$add of non-numbers is not implemented by bucketq.memory")
        return sum(_number(a) for a in args)
    raise Unsupported(f"expression {name} is not implemented by bucketq.memory")


def _accumulate(name: str, values: list[Any]) -> Any:
    present = [v for v in values if v is not _MISSING]
    if name == "$sum":
        return sum(_number(v) for v in present if _is_number(v))
    if name in ("$min", "$max"):
        real = [v for v in present if v is not None]
        if not real:
            return None
        return (min if name == "$min" else max)(real, key=_sort_key)
    if name == "$avg":
        numbers = [_number(v) for v in present if _is_number(v)]
        return sum(numbers) / len(numbers) if numbers else None
    if name == "$first":
        return values[0] if values and values[0] is not _MISSING else None
    if name == "$last":
        return values[-1] if values and values[-1] is not _MISSING else None
    if name == "$push":
        return present
    raise Unsupported(f"accumulator {name} is not implemented by bucketq.memory")


def _project_stage(doc: Mapping[str, Any], spec: Mapping[str, Any]) -> dict[str, Any]:
    flags = {k: v for k, v in spec.items() if isinstance(v, (bool, int)) and not isinstance(v, Int64)}
    if flags and not any(flags.values()) and len(flags) == len(spec):
        return project(doc, spec)
    out: dict[str, Any] = {"_id": doc["_id"]} if spec.get("_id", 1) and "_id" in doc else {}
    for key, value in spec.items():
        if key in flags:
            if value and key != "_id":
                _copy_path(doc, out, key.split("."))
            continue
        result = evaluate(value, doc)
        if result is not _MISSING:
            out[key] = result
    return out


def _group_stage(docs: Sequence[Mapping[str, Any]], spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    groups: dict[bytes, tuple[Any, list[Mapping[str, Any]]]] = {}
    for doc in docs:
        key = evaluate(spec["_id"], doc)
        key = None if key is _MISSING else key
        groups.setdefault(bson.encode({"k": key}), (key, []))[1].append(doc)
    out = []
    for key, members in groups.values():
        row: dict[str, Any] = {"_id": key}
        for name, accumulator in spec.items():
            if name == "_id":
                continue
            ((op, expr),) = accumulator.items()
            row[name] = _accumulate(op, [evaluate(expr, d) for d in members])
        out.append(row)
    return out


def aggregate_documents(docs: Sequence[Mapping[str, Any]],
                        pipeline: list[Mapping[str, Any]]) -> Sequence[Mapping[str, Any]]:
    """Run an aggregation pipeline (``$match``, ``$project``, ``$group``, ``$sort``, ``$skip``, ``$limit``,
    ``$count``) over ``docs``."""
    for stage in pipeline:
        if len(stage) != 1:
            raise OperationFailure("A pipeline stage specification object must contain exactly one field.", 40323)
        ((name, spec),) = stage.items()
        if name == "$match":
            docs = [d for d in docs if matches(d, spec)]
        elif name == "$project":
            docs = [_project_stage(d, spec) for d in docs]
        elif name == "$group":
            docs = _group_stage(docs, spec)
        elif name == "$sort":
            docs = sort_documents(docs, sort_spec(spec))
        elif name == "$skip":
            docs = docs[spec:]
        elif name == "$limit":
            docs = docs[:spec]
        elif name == "$count":
            docs = [{spec: len(docs)}] if docs else []
        else:
            raise Unsupported(f"pipeline stage {name} is not implemented by bucketq.memory")
    return docs
