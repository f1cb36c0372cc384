"""Static rules: constructs a candidate patch may not introduce, found by reading its code.

Cheapest stage of the cascade after the patch applies. Each rule belongs to a group; a task's
manifest may `allow` a group its code legitimately needs (e.g. `threads`, or `state` for code that
keeps caches or pools between calls, see state_rules). Two groups can never be
allowed: `harness` (reaching the harness, the package, files outside the workspace, secrets) and
`timers` (replacing clocks or monkeypatching modules).

Only constructs the patch *adds* count: a rule hit already present in the baseline file is not
the candidate's doing. The groups and what belongs to each are `experiments/rule_groups.py`;
this module reads code against them.
"""

from __future__ import annotations

import ast
import re
from collections import Counter

from infra_agent.experiments.command_rules import PYTHON, Word, command_code, inline_code
from infra_agent.experiments.rule_groups import (
    ATTR_GROUPS,
    ATTRIBUTE_CALLS,
    DUNDER_ATTRS,
    DYNAMIC_CALLS,
    IMPORTERS,
    OS_CALLS,
    OS_PREFIXES,
    SYS_ATTRS,
    Violation,
    group_of_module,
    normalize_allow,
)
from infra_agent.experiments.rule_names import canonical, is_module
from infra_agent.experiments.state_rules import scan_state

_ABSOLUTE = re.compile(r"^(/|~|[A-Za-z]:\\)")


class _Visitor(ast.NodeVisitor):
    def __init__(self, path: str) -> None:
        self.path = path
        self.found: list[Violation] = []
        self.modules: dict[str, str] = {}
        """Local name -> imported module name."""

    def _add(self, group: str, node: ast.AST, what: str) -> None:
        self.found.append(Violation(group, self.path, getattr(node, "lineno", 0), what))

    def _module(self, node: ast.AST, name: str, local: str | None) -> None:
        if local is not None:
            self.modules[local] = name
        group = group_of_module(name)
        if group is not None:
            self._add(group, node, f"imports {name}")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._module(node, alias.name, alias.asname or alias.name.split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level > 0 and node.level > 1:
            self._add("harness", node, "imports from outside its package ('..' relative import)")
        base = node.module or ""
        for alias in node.names:
            full = canonical(f"{base}.{alias.name}") if base else alias.name
            local = alias.asname or alias.name
            owner = full.rpartition(".")[0]
            if owner in ("os", "posix"):
                self._os_attr(node, alias.name)
            elif owner == "sys" and alias.name in SYS_ATTRS:
                self._add(SYS_ATTRS[alias.name], node, f"imports sys.{alias.name}")
            named = node.level == 0 and (group_of_module(full) or is_module(full))
            self._module(node, full if named else base, local)

    def _os_attr(self, node: ast.AST, attr: str) -> None:
        group = OS_CALLS.get(attr)
        if group is None:
            group = next((g for p, g in OS_PREFIXES.items() if attr.startswith(p)), None)
        if group is not None:
            self._add(group, node, f"uses os.{attr}")

    # -- what a name refers to, through indirection ---------------------------------------------

    def _qual(self, node: ast.expr) -> str | None:
        """The canonical dotted name `node` refers to when it starts at a module: through
        attributes, constant-string getattr, __import__/importlib.import_module of a constant,
        names bound to such expressions, and modules reached as other modules' attributes."""
        if isinstance(node, ast.Name):
            return self.modules.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self._qual(node.value)
            return canonical(f"{base}.{node.attr}") if base else None
        if isinstance(node, ast.Subscript):  # sys.modules["m"], module.__dict__["name"]
            key, base = _const_str(node.slice), self._qual(node.value)
            if key is not None and base == "sys.modules":
                return canonical(key)
            if key is not None and base is not None and base.endswith(".__dict__"):
                return canonical(f"{base.removesuffix('.__dict__')}.{key}")
            return None
        if isinstance(node, ast.Call):
            callee = self._callee(node)
            if callee == "getattr" and len(node.args) >= 2:
                base, attr = self._qual(node.args[0]), _const_str(node.args[1])
                return canonical(f"{base}.{attr}") if base and attr else None
            if callee in IMPORTERS and node.args:
                name = _const_str(node.args[0])
                return canonical(name) if name else None
        return None

    def _callee(self, node: ast.Call) -> str | None:
        """The name a call's function refers to: a builtin's bare name (also reached as
        `builtins.X`), or a module function's canonical dotted name."""
        func = node.func
        if isinstance(func, ast.Name) and func.id not in self.modules:
            return func.id
        qual = self._qual(func)
        if qual is not None and qual.startswith("builtins."):
            return qual.removeprefix("builtins.")
        return qual

    def _check_attribute(self, node: ast.Attribute) -> None:
        """Rules on `value.attr` (also for `getattr(value, "attr")`)."""
        if node.attr in DUNDER_ATTRS:
            self._add("introspection", node, f"uses .{node.attr}")
        qual = self._qual(node)
        if qual is not None:
            self._check_reference(node, qual)
        elif isinstance(node.value, ast.Name):  # os/sys named without an import
            self._check_module_attr(node, node.value.id, node.attr)
        if node.attr in ATTR_GROUPS:
            group, what = ATTR_GROUPS[node.attr]
            self._add(group, node, what)
        if (
            node.attr == "fork"
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "jit"
        ):
            self._add("threads", node, "uses torch.jit.fork (asynchronous work)")

    def _check_module_attr(self, node: ast.AST, module: str, attr: str) -> None:
        if module in ("os", "posix"):
            self._os_attr(node, attr)
        elif module == "sys" and attr in SYS_ATTRS:
            self._add(SYS_ATTRS[attr], node, f"uses sys.{attr}")

    def _check_reference(self, node: ast.expr, qual: str) -> None:
        """Rules on what `node` refers to (`qual`, resolved through indirection): os and sys
        attributes, and a module of a rule group its import did not name (reached as another
        module's attribute, through sys.modules or __dict__, or a submodule)."""
        module, _, attr = qual.rpartition(".")
        self._check_module_attr(node, module, attr)
        group = group_of_module(qual)
        written = self._written(node)
        if group is not None and (
            written is None or group_of_module(written.split(".")[0]) != group
        ):
            how = f"uses {qual}" if written == qual else f"reaches {qual} as {ast.unparse(node)}"
            self._add(group, node, how)
        elif group == "processes" and not is_module(qual):
            self._add(group, node, f"uses {qual}")  # each use: more of a module already imported

    def _word(self, node: ast.expr) -> Word:
        """`node` as one word of a command: its text, 'python' for the interpreter, else None."""
        text = _const_str(node)
        if text is not None:
            return text
        if self._qual(node) == "sys.executable" or (
            isinstance(node, ast.Attribute) and node.attr == "executable"
        ):
            return PYTHON
        return None

    def _inline(self, node: ast.AST, codes: list[Word]) -> None:
        """Each `python -c CODE` starts a process; CODE, when written here, is read like the
        file's own code."""
        for code in codes:
            if code is None:
                self._add("processes", node, "runs Python from a string built at run time (python -c)")  # fmt: skip
                continue
            self._add("processes", node, "runs Python from a string (python -c)")
            for hit in scan_source(code, self.path):
                self._add(hit.group, node, f"in its python -c code: {hit.what}")

    def visit_List(self, node: ast.List) -> None:
        self._inline(node, inline_code([self._word(e) for e in node.elts]))
        self.generic_visit(node)

    def visit_Tuple(self, node: ast.Tuple) -> None:
        self._inline(node, inline_code([self._word(e) for e in node.elts]))
        self.generic_visit(node)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        """An f-string as a command: its fields are computed at run time (NUL here)."""
        parts = [
            str(v.value) if isinstance(v, ast.Constant) else self._word(v.value) or "\0"
            for v in node.values
            if isinstance(v, ast.Constant | ast.FormattedValue)
        ]
        self._inline(node, command_code("".join(parts)))
        for value in node.values:  # its constant parts were read as a whole
            if isinstance(value, ast.FormattedValue):
                self.visit(value)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.ctx, ast.Load):
            qual = self._qual(node)
            if qual is not None:
                self._check_reference(node, qual)
        self.generic_visit(node)

    def _written(self, node: ast.expr) -> str | None:
        """`node` as written, from its imported root module (no indirection followed)."""
        if isinstance(node, ast.Name):
            return self.modules.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self._written(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self._check_attribute(node)
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in ("__builtins__", "__loader__", "__spec__"):
            self._add("introspection", node, f"uses {node.id}")
        qual = self.modules.get(node.id)
        if isinstance(node.ctx, ast.Load) and qual is not None and "." in qual:
            if group_of_module(qual) == "processes" and not is_module(qual):
                self._add("processes", node, f"uses {qual}")  # `from psutil import Process`

    def _target_module(self, target: ast.expr) -> str | None:
        """If `target` is `module.attr[...]`, the module's name."""
        while isinstance(target, ast.Attribute | ast.Subscript):
            target = target.value
            if isinstance(target, ast.Name) and target.id in self.modules:
                return self.modules[target.id]
        return None

    def _check_store(self, node: ast.AST, targets: list[ast.expr]) -> None:
        for target in targets:
            if isinstance(target, ast.Attribute | ast.Subscript):
                module = self._target_module(target)
                if module is not None:
                    self._add("timers", node, f"assigns into module {module} (monkeypatching)")

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_store(node, [node.target])
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        self._check_store(node, node.targets)
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        self._check_store(node, node.targets)
        qual = self._qual(node.value)
        if qual is not None:  # a module (or a module's attribute) bound to a new name
            for target in node.targets:
                if isinstance(target, ast.Name):
                    self.modules[target.id] = qual
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        self._inline(node, inline_code([self._word(a) for a in node.args]))  # os.execl(...)
        name = self._callee(node)
        if name in DYNAMIC_CALLS:
            self._add("dynamic", node, f"calls {name}()")
        if name in IMPORTERS and node.args:
            module = _const_str(node.args[0])
            if module is not None:
                self._module(node, canonical(module), None)
        if name in ATTRIBUTE_CALLS and len(node.args) >= 2:
            attr = _const_str(node.args[1])
            if attr is None:
                self._add("dynamic", node, f"{name}() with a computed attribute name")
            else:  # getattr(x, "a") is x.a: the same rules read it
                synth = ast.Attribute(value=node.args[0], attr=attr, ctx=ast.Load())
                ast.copy_location(synth, node)
                self._check_attribute(synth)
            first = node.args[0]
            if name in ("setattr", "delattr"):
                module = self._target_module(first) or self._qual(first)
                if module is not None:
                    self._add("timers", node, f"{name}() on module {module}")
        if isinstance(node.func, ast.Attribute) and node.func.attr == "home":
            self._add("harness", node, "reads the home folder")
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str | bytes):
            text = (
                node.value.decode(errors="replace") if isinstance(node.value, bytes) else node.value
            )
            self._inline(node, command_code(text))
            if _ABSOLUTE.match(text) and len(text) > 1 and "\n" not in text:
                self._add("harness", node, f"names an absolute path {text[:60]!r}")
            elif re.search(r"(^|[/\\])\.\.([/\\]|$)", text):
                self._add("harness", node, f"names a path outside the workspace {text[:60]!r}")


def _const_str(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def scan_source(source: str, path: str) -> list[Violation]:
    """Rule hits in one Python file. A file that does not parse is itself a violation."""
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as exc:
        return [Violation("syntax", path, exc.lineno or 0, f"does not parse ({exc.msg})")]
    visitor = _Visitor(path)
    visitor.visit(tree)
    state = [Violation("state", path, hit.line, hit.what) for hit in scan_state(tree)]
    return visitor.found + state


def new_violations(
    before: dict[str, str | None], after: dict[str, str | None], allow: list[str]
) -> list[Violation]:
    """Violations in `after` (path -> source, None if deleted) not already in `before`, minus
    the groups the task allows. Only Python files are read; other files are not code here."""
    allowed = normalize_allow(allow)
    found: list[Violation] = []
    for path, source in sorted(after.items()):
        if source is None or not path.endswith(".py"):
            continue
        old = before.get(path)
        existing = Counter(
            (v.group, v.what) for v in (scan_source(old, path) if old is not None else [])
        )
        for violation in scan_source(source, path):
            key = (violation.group, violation.what)
            if existing[key] > 0:
                existing[key] -= 1
            elif violation.group not in allowed:
                found.append(violation)
    return found
