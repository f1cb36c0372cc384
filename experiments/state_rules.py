"""Static rule group `state`: candidate code that keeps state from one call to the next.

A function that remembers its inputs or outputs between calls can answer the harness's later
calls from memory (a cache keyed on object identity or on the inputs' content) instead of doing
the work. Unless the task's manifest allows `state`, these constructs are rejected:

- a module-level name mutated inside a function: item assignment or deletion (`_cache[k] = v`),
  a mutating method on a module-level container (`.append`, `.setdefault`, `.update`, ...), an
  in-place tensor method on a module-level object (`_buf.copy_(...)`);
- a `global` declaration whose name the function rebinds;
- `functools.cache`, `functools.lru_cache` and `functools.cached_property`, as decorators or
  called;
- attributes set on a module-level function, class or object (`f.cache = ...`, `setattr(f, ...)`);
- a mutable default argument (`def f(x, _memo={})`) that the function mutates.

Names a function binds itself (parameters, locals, names of enclosing functions) are its own
and never count. The rule reads code; it cannot see every obfuscation, which the fresh inputs
of every timed call (a content cache never hits) back up at run time.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass

CACHE_HELPERS = frozenset({"cache", "lru_cache", "cached_property"})
MUTATING_METHODS = frozenset({
    "append", "extend", "insert", "add", "update", "setdefault", "pop", "popitem", "clear",
    "remove", "discard", "appendleft", "extendleft", "sort", "reverse", "__setitem__",
    "__delitem__", "put", "put_nowait",
})  # fmt: skip
_CONTAINER_CALLS = frozenset({
    "dict", "list", "set", "bytearray", "defaultdict", "OrderedDict", "deque", "Counter",
    "ChainMap", "WeakValueDictionary", "WeakKeyDictionary", "WeakSet", "SimpleNamespace",
    "Queue", "LifoQueue", "SimpleQueue",
})  # fmt: skip
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


@dataclass(frozen=True)
class StateHit:
    """One construct that keeps state: its line and what it is in words."""

    line: int
    what: str


def _is_container(value: ast.expr | None) -> bool:
    if isinstance(value, ast.Dict | ast.List | ast.Set | ast.DictComp | ast.ListComp | ast.SetComp):
        return True
    if isinstance(value, ast.Call):
        func = value.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        return name in _CONTAINER_CALLS
    return False


def _root(node: ast.expr) -> tuple[ast.Name | None, bool]:
    """The name at the bottom of `a.b[c].d`, and whether the chain passes through an attribute."""
    through_attribute = False
    while isinstance(node, ast.Attribute | ast.Subscript):
        through_attribute |= isinstance(node, ast.Attribute)
        node = node.value
    return (node if isinstance(node, ast.Name) else None), through_attribute


def _stored_names(nodes: list[ast.stmt]) -> set[str]:
    """Every name a block binds (assignments, loops, imports, defs), nested blocks included."""
    names: set[str] = set()
    for stmt in nodes:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
                names.add(node.id)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.alias):
                names.add(node.asname or node.name.split(".")[0])
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                names.add(node.name)
    return names


def _module_bindings(tree: ast.Module) -> tuple[dict[str, str], dict[str, str]]:
    """Module-level names -> kind ('container', 'value', 'def', 'class'), and the local names
    bound to functools' caching helpers. Imported names are left out (modules are the `timers`
    rule's business)."""
    kinds: dict[str, str] = {}
    helpers: dict[str, str] = {}

    def visit(stmts: list[ast.stmt]) -> None:
        for stmt in stmts:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                kinds[stmt.name] = "def"
            elif isinstance(stmt, ast.ClassDef):
                kinds[stmt.name] = "class"
            elif isinstance(stmt, ast.Assign | ast.AnnAssign | ast.AugAssign):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                kind = "container" if _is_container(stmt.value) else "value"
                for target in targets:
                    for node in ast.walk(target):
                        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                            kinds[node.id] = kind
            elif isinstance(stmt, ast.If | ast.Try | ast.With | ast.For | ast.While):
                for field in ("body", "orelse", "finalbody"):
                    visit(getattr(stmt, field, []))
                for handler in getattr(stmt, "handlers", []):
                    visit(handler.body)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "functools":
                helpers.update(
                    (a.asname or a.name, a.name) for a in node.names if a.name in CACHE_HELPERS
                )

    visit(tree.body)
    return kinds, helpers


class _StateVisitor:
    def __init__(self, tree: ast.Module) -> None:
        self.kinds, self.helpers = _module_bindings(tree)
        self.functools = {
            a.asname or a.name
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for a in node.names
            if a.name == "functools"
        }
        self.hits: list[StateHit] = []
        self.tree = tree

    def _hit(self, node: ast.AST, what: str) -> None:
        self.hits.append(StateHit(getattr(node, "lineno", 0), f"keeps state across calls: {what}"))

    def run(self) -> list[StateHit]:
        in_functions = {
            id(n) for f in ast.walk(self.tree) if isinstance(f, _FUNCTIONS) for n in ast.walk(f)
        }
        for node in ast.walk(self.tree):
            self._cache_helper(node)
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store | ast.Del):
                root, _ = _root(node)
                top_level = id(node) not in in_functions
                if root is not None and top_level and self.kinds.get(root.id) in ("def", "class"):
                    self._hit(node, f"sets an attribute on '{root.id}'")
        self._functions(self.tree.body, shadowed=frozenset(), persistent=frozenset())
        return self.hits

    def _cache_helper(self, node: ast.AST) -> None:
        if isinstance(node, ast.Name) and node.id in self.helpers:
            self._hit(node, f"uses functools.{self.helpers[node.id]} (memoizes results)")
        elif (
            isinstance(node, ast.Attribute)
            and node.attr in CACHE_HELPERS
            and isinstance(node.value, ast.Name)
            and node.value.id in self.functools
        ):
            self._hit(node, f"uses functools.{node.attr} (memoizes results)")

    def _functions(
        self, stmts: list[ast.stmt], shadowed: frozenset[str], persistent: frozenset[str]
    ) -> None:
        """Find functions in `stmts` (at any depth) and check each with its own scope."""
        for stmt in stmts:
            for node in _direct_functions(stmt):
                self._function(node, shadowed, persistent)

    def _function(
        self,
        func: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda,
        shadowed: frozenset[str],
        persistent: frozenset[str],
    ) -> None:
        body = _body_of(func)
        args = func.args
        params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
        params += [a for a in (args.vararg, args.kwarg) if a is not None]
        defaults = list(
            zip(reversed(args.posonlyargs + args.args), reversed(args.defaults), strict=False)
        )
        defaults += [
            (a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None
        ]
        memo = {a.arg for a, d in defaults if _is_container(d)}
        declared = {n for s in ast.walk(ast.Module(body=body, type_ignores=[]))
                    if isinstance(s, ast.Global) for n in s.names}  # fmt: skip
        stored = _stored_names(body)
        own = (stored | {p.arg for p in params}) - declared - memo
        persistent = (persistent - own) | memo
        name = getattr(func, "name", "<lambda>")
        for node in _own_nodes(body):
            self._check(node, name, shadowed | own, persistent, stored)
        for stmt in body:
            for inner in _direct_functions(stmt):
                self._function(inner, shadowed | own, persistent)

    def _module_level(self, root: ast.Name | None, shadowed: frozenset[str]) -> str | None:
        if root is None or root.id in shadowed:
            return None
        return self.kinds.get(root.id)

    def _check(
        self,
        node: ast.AST,
        func: str,
        shadowed: frozenset[str],
        persistent: frozenset[str],
        stored: set[str],
    ) -> None:
        def where(root: ast.Name) -> str:
            if root.id in persistent:
                return f"its mutable default argument '{root.id}'"
            return f"module-level '{root.id}'"

        def kind_of(root: ast.Name | None) -> str | None:
            if root is not None and root.id in persistent:
                return "container"
            return self._module_level(root, shadowed)

        if isinstance(node, ast.Global):
            for name in node.names:
                if name in stored:
                    self._hit(node, f"'{func}' rebinds module-level '{name}' through global")
        elif isinstance(node, ast.Subscript | ast.Attribute) and isinstance(
            node.ctx, ast.Store | ast.Del
        ):
            root, _ = _root(node)
            kind = kind_of(root)
            if root is not None and kind is not None:
                verb = "stores into" if isinstance(node, ast.Subscript) else "sets an attribute of"
                self._hit(node, f"'{func}' {verb} {where(root)}")
        elif isinstance(node, ast.Call):
            self._check_call(node, func, kind_of, where)

    def _check_call(
        self,
        node: ast.Call,
        func: str,
        kind_of: Callable[[ast.Name | None], str | None],
        where: Callable[[ast.Name], str],
    ) -> None:
        callee = node.func
        if isinstance(callee, ast.Name) and callee.id in ("setattr", "delattr") and node.args:
            root, _ = _root(node.args[0])
            if root is not None and kind_of(root) is not None:
                self._hit(node, f"'{func}' calls {callee.id}() on {where(root)}")
            return
        if not isinstance(callee, ast.Attribute):
            return
        root, through_attribute = _root(callee.value)
        kind = kind_of(root)
        if root is None or kind is None:
            return
        method = callee.attr
        in_place = method.endswith("_") and not method.startswith("_")
        container = kind == "container" or (through_attribute and kind in ("def", "class"))
        if (method in MUTATING_METHODS and container) or (in_place and kind != "def"):
            self._hit(node, f"'{func}' mutates {where(root)} (.{method})")


def _body_of(func: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> list[ast.stmt]:
    return [ast.Expr(func.body)] if isinstance(func, ast.Lambda) else list(func.body)


def _direct_functions(
    node: ast.AST,
) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda]:
    """Functions in `node` not nested inside another function in `node` (itself included)."""
    if isinstance(node, _FUNCTIONS):
        yield node
        return
    for child in ast.iter_child_nodes(node):
        yield from _direct_functions(child)


def _own_nodes(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """Nodes of a function's body, not descending into nested functions (they have their own
    scope) but including their decorators and defaults, which run in this one."""
    stack: list[ast.AST] = list(reversed(body))
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, _FUNCTIONS):
            if not isinstance(node, ast.Lambda):
                stack.extend(node.decorator_list)
            stack.extend(node.args.defaults)
            stack.extend(d for d in node.args.kw_defaults if d is not None)
            continue
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


def scan_state(tree: ast.Module) -> list[StateHit]:
    """Constructs in a parsed module that keep state across calls of its functions."""
    return _StateVisitor(tree).run()
