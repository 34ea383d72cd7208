"""docs/refusals.md explains every refusal kind the analysis can give, and its
examples are true: each refused cell is refused with its section's kind (a warning
for ``undefined-input``), and each rewrite is accepted."""

from __future__ import annotations

import ast
import builtins
import re
import textwrap
from pathlib import Path

import pytest

from gpucell.core.analysis import analyse
from gpucell.core.analysis.refusals import REFUSALS
from gpucell.errors import NotParallelizable

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "refusals.md"
KIND = re.compile(r"[a-z]+(?:-[a-z]+)*")

# -- the kinds the code can give ------------------------------------------------


def _kind_args(call: ast.Call) -> ast.expr | None:
    """The kind argument of a call that records a diagnostic, if it is one:
    ``sink.add(line, col, name, kind, text)``, ``self.forbid(node, name, kind,
    text)`` or ``Diagnostic(line, col, name, kind, text)``."""
    f = call.func
    name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
    if name in ("add", "Diagnostic") and len(call.args) == 5:
        return call.args[3]
    if name == "forbid" and len(call.args) == 4:
        return call.args[2]
    return None


def _constants(e: ast.AST) -> set[str]:
    return {
        n.value
        for n in ast.walk(e)
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def kinds_in_code() -> dict[str, str]:
    """kind -> where it is recorded, for every kind under gpucell/ (a kind held
    in a local is resolved through that local's assignments in its function)."""
    found: dict[str, str] = {}
    unresolved: list[str] = []
    for path in sorted((ROOT / "gpucell").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            params = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
            for call in ast.walk(fn):
                if not isinstance(call, ast.Call):
                    continue
                kind = _kind_args(call)
                if kind is None:
                    continue
                where = f"{path.relative_to(ROOT)}:{call.lineno}"
                if isinstance(kind, ast.Constant):
                    values = {kind.value}
                elif isinstance(kind, ast.Name) and kind.id in params:
                    continue  # passed through (forbid, DiagnosticSink.add)
                elif isinstance(kind, ast.Attribute) and kind.attr == "kind":
                    continue  # a recorded Diagnostic recorded again (extend)
                elif isinstance(kind, ast.Name):
                    values = set().union(
                        *(
                            _constants(a.value)
                            for a in ast.walk(fn)
                            if isinstance(a, ast.Assign)
                            and any(
                                isinstance(t, ast.Name) and t.id == kind.id
                                for t in a.targets
                            )
                        )
                    )
                else:
                    values = set()
                values = {v for v in values if KIND.fullmatch(v)}
                if not values:
                    unresolved.append(f"{where}: {ast.unparse(kind)}")
                for v in values:
                    found.setdefault(v, where)
    assert not unresolved, (
        "a diagnostic whose kind this test cannot read; give it a literal kind: "
        f"{unresolved}"
    )
    # the analysis's refusals are made as instances of a class per kind
    by_class = {cls.__name__: kind for kind, cls in REFUSALS.items()}
    for path in sorted((ROOT / "gpucell").rglob("*.py")):
        if path.name == "refusals.py":
            continue
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.Name) and n.id in by_class:
                found.setdefault(by_class[n.id], f"{path.relative_to(ROOT)}:{n.lineno}")
    return found


# -- the page ---------------------------------------------------------------------


def sections() -> dict[str, str]:
    """kind -> its section's text, for every '## `kind`' heading."""
    text = DOC.read_text()
    parts = re.split(r"^## ", text, flags=re.M)[1:]
    out = {}
    for part in parts:
        head, _, body = part.partition("\n")
        m = re.fullmatch(r"`([a-z-]+)`", head.strip())
        if m:
            out[m.group(1)] = body
    return out


def examples(body: str) -> dict[str, str]:
    """The section's code blocks by the word of the paragraph before each:
    'refused' (or 'warned') and 'rewrite' (the first of each)."""
    found: dict[str, str] = {}
    label = None
    lines = body.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```python"):
            j = lines.index("```", i + 1)
            if label and label not in found:
                found[label] = "\n".join(lines[i + 1 : j]) + "\n"
            label, i = None, j + 1
            continue
        if line.strip():
            word = line.split(":")[0].strip().lower()
            if word in ("refused", "warned", "rewrite"):
                label = word
        i += 1
    return found


def known_names(src: str) -> set[str]:
    """The notebook's names an example reads: a first line '# defined before the
    cell: a, b', or else every name it reads or deletes and never binds."""
    first = src.splitlines()[0]
    if first.startswith("# defined before the cell:"):
        return {n.strip() for n in first.split(":", 1)[1].split(",")}
    flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    tree = compile(src, "<example>", "exec", flags)
    used, bound = set(), set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            (bound if isinstance(n.ctx, ast.Store) else used).add(n.id)
        elif isinstance(n, ast.alias):
            bound.add((n.asname or n.name).split(".")[0])
    return used - bound - set(dir(builtins))


def test_every_kind_in_the_code_has_a_section_and_no_section_is_stale():
    code = kinds_in_code()
    assert {"loop-carried", "break", "outer-mutation"} <= code.keys()  # it reads
    page = sections()
    missing = {k: where for k, where in code.items() if k not in page}
    assert not missing, f"docs/refusals.md lacks a section for: {missing}"
    stale = sorted(page.keys() - code.keys())
    assert not stale, f"docs/refusals.md explains kinds the code no longer has: {stale}"


@pytest.mark.parametrize("kind", sorted(sections()))
def test_section_example_is_refused_with_its_kind_and_its_rewrite_runs(kind):
    ex = examples(sections()[kind])
    assert "rewrite" in ex, f"`{kind}`: no 'Rewrite' example"
    if "warned" in ex:
        src = ex["warned"]
        plan = analyse(textwrap.dedent(src), known_names=known_names(src))
        assert kind in {w.kind for w in plan.warnings}, plan.warnings
    else:
        assert "refused" in ex, f"`{kind}`: no 'Refused' example"
        src = ex["refused"]
        with pytest.raises(NotParallelizable) as info:
            analyse(src, known_names=known_names(src))
        kinds = {d.kind for d in info.value.diagnostics}  # type: ignore[attr-defined]
        assert kind in kinds, (kind, kinds, str(info.value))
    src = ex["rewrite"]
    plan = analyse(src, known_names=known_names(src))
    assert not plan.diagnostics
    assert kind not in {w.kind for w in plan.warnings}
