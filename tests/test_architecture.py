"""The package's imports go one way, down the pipeline.

Reads every module of ``partitioner`` as source, builds the graph of imports
between them, and fails on a cycle, on an import that points up the pipeline, on an
import hidden inside a function, and on a module reaching into another module's
private names. docs/architecture.md draws the same layers.

The gateway to private jax is checked too: ``jax_private`` (a package, imported for
this) exports names, not modules, and no module outside it imports ``jax._src`` or one
of its modules, reads through a jax module or reads a private attribute of a jax object.
"""

from __future__ import annotations

import ast
import functools
import types
from pathlib import Path

import pytest

from partitioner._src import jax_private

PACKAGE = Path(__file__).resolve().parent.parent / "partitioner"

#: The pipeline, bottom to top; a module may import only from its own layer's
#: package or from layers below (docs/architecture.md).
LAYERS: list[tuple[str, ...]] = [
    ("_src.jax_private",),  # the one gateway to private jax (a package): imports none of ours
    ("_src.events", "_src.options", "_src.warn", "_src.window", "_src.lazy", "_src.cpu_devices"),
    ("_src.sharding",),
    ("_src.trace",),
    ("_src.primitives",),  # one module per primitive: definition, params, abstract eval, rules
    ("_src.lower",),
    ("_src.compiler",),  # lower -> compile -> executable -> cache
    ("_src.dispatch",),
    (
        "_src.inspect.tables",
        "_src.inspect.collectives",
        "_src.inspect.visualize",
        "_src.inspect.pipelines",
    ),  # fmt: skip  # report tables
    ("_src.stages", "_src.residuals"),
    # AUTO in three rooms, one way (NOTE in _src/auto/__init__.py): the cost model, the
    # search (compiles finalists through the cache, reads reports), rematerialization;
    # resolve.py ties them together, whole_plan.py weighs pipeline decisions, searched.py
    # keeps what the searches found.
    ("_src.auto.cost",),
    ("_src.auto.search",),
    ("_src.auto.remat",),
    ("_src.auto",),
    ("_src.registry", "_src.pmap_registry", "_src.host_callback", "_src.distributed"),
    ("_src.planner",),  # options records, and free functions: a call -> CallPlan
    ("_src.wrapped",),  # the callable every front door returns
    ("_src.jit", "_src.pjit", "_src.pmap"),  # the front doors: siblings, none imports another
    # report(f, *args) with the residuals, both partitioners; the inspect package's own
    # __init__ (a docstring) sits here, so its modules below are placed by their names.
    ("_src.colocated", "_src.pipeline", "_src.inspect.api", "_src.inspect"),
    (
        "options",
        "inspect",
        "sharding_spec",
        "testing",  # the public test-support package (strategies, round trips, plugin)
        "_testing",  # the internals partitioner's own tests reach
        "host_callback",
        "distributed",
        "launch",
    ),  # public modules
    ("__init__",),  # the public surface
]


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = rel.parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


@functools.cache
def _modules() -> dict[str, Path]:
    """Every module of the package by name (read once: the checks below ask per import)."""
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _relative_target(node: ast.ImportFrom, here: str) -> str:
    """The partitioner module a relative ``from ... import`` in package ``here`` names."""
    base = here.split(".") if here and here != "__init__" else []
    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
    return ".".join([*base, *(node.module.split(".") if node.module else [])])


@functools.cache
def _imports(name: str, path: Path) -> list[tuple[str, ast.AST, bool]]:
    """``(imported partitioner module, node, at module level)`` for every import."""
    tree = ast.parse(path.read_text())
    top_level = {id(n) for n in tree.body}
    here = _package_of(name, path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                target = _relative_target(node, here)
            elif node.module and node.module.startswith("partitioner"):
                target = node.module.removeprefix("partitioner").lstrip(".")
            else:
                continue
            for alias in node.names:  # `from . import x` imports the module x
                sub = f"{target}.{alias.name}" if target else alias.name
                found.append((sub if sub in _modules() else target, node, id(node) in top_level))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("partitioner."):
                    found.append(
                        (alias.name.removeprefix("partitioner."), node, id(node) in top_level)
                    )
    found += _deferred_imports(name, tree)
    return [(t or "__init__", n, top) for t, n, top in found if (t or "__init__") in _modules()]


#: The helpers of ``_src/lazy.py`` that declare a deferred import.
DEFERRED = ("lazy.module", "lazy.attach")


def _deferred_imports(name: str, tree: ast.Module) -> list[tuple[str, ast.AST, bool]]:
    """``(module, node, declared at module level)`` for each module that a
    ``lazy.module("partitioner.x")`` or ``lazy.attach(__name__, {name: "partitioner.x"},
    submodules=(...))`` declaration in module ``name`` loads on first use: imports,
    only later."""
    in_function = {
        id(n)
        for f in ast.walk(tree)
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef))
        for n in ast.walk(f)
    }
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and ast.unparse(node.func) in DEFERRED):
            continue
        if ast.unparse(node.func) == "lazy.module":
            targets = [ast.literal_eval(node.args[0])]
        else:
            targets = list(ast.literal_eval(node.args[1]).values())
            for keyword in node.keywords:  # submodules=(...) of this package
                package = "" if name == "__init__" else f".{name}"
                targets += [f"partitioner{package}.{s}" for s in ast.literal_eval(keyword.value)]
        for target in targets:
            if not target.startswith("partitioner."):
                raise AssertionError(f"{name}: {target!r}: name a deferred module in full")
            found.append((target.removeprefix("partitioner."), node, id(node) not in in_function))
    return found


def _layer(name: str) -> int:
    if name == "_src":  # the private package's own __init__: a docstring, no imports
        return 0
    for i, prefixes in enumerate(LAYERS):
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            return i
    raise AssertionError(f"module {name} has no layer in LAYERS: place it in the pipeline")


def _graph() -> dict[str, set[str]]:
    return {
        name: {t for t, _, _ in _imports(name, path) if t != name}
        for name, path in _modules().items()
    }


def test_every_module_has_a_layer() -> None:
    for name in _modules():
        _layer(name)


@pytest.mark.slow
def test_no_import_cycle() -> None:
    graph = _graph()
    state: dict[str, str] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycle = stack[stack.index(nxt) :] + [nxt] if nxt in stack else [node, nxt]
                pytest.fail(f"import cycle: {' -> '.join(cycle)}")
            if nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


@pytest.mark.slow
def test_imports_point_down_the_pipeline() -> None:
    wrong = []
    for name, path in _modules().items():
        for target, node, _ in _imports(name, path):
            same_package = _package_of(name, path) == _package_of(target, _modules()[target])
            if _layer(target) > _layer(name) or (
                _layer(target) == _layer(name) and not same_package and target != name
            ):
                wrong.append(f"{name}:{node.lineno} imports {target}")
    assert not wrong, "imports up (or across) the pipeline:\n" + "\n".join(wrong)


def test_deferred_imports_are_read_as_imports() -> None:
    """``lazy.module`` / ``lazy.attach`` declarations are edges of the graph above (so
    layers and cycles are checked for them) and name modules that exist."""
    source = (
        "from .. import lazy\n"
        "tables = lazy.module('partitioner._src.inspect.tables')\n"
        "__getattr__, __dir__ = lazy.attach(__name__, {'pmap': 'partitioner._src.pmap'},"
        " submodules=('inspect',))\n"
        "def f():\n    return lazy.module('partitioner._src.auto.resolve')\n"
    )
    found = {(t, top) for t, _, top in _deferred_imports("__init__", ast.parse(source))}
    assert found == {
        ("_src.inspect.tables", True),
        ("_src.pmap", True),
        ("inspect", True),
        ("_src.auto.resolve", False),
    }, found
    declared = [
        (name, target)
        for name, path in _modules().items()
        for target, _, _ in _deferred_imports(name, ast.parse(path.read_text()))
    ]
    assert ("__init__", "_src.pmap") in declared
    assert ("_src.wrapped", "_src.auto.searched") in declared
    missing = [f"{n} defers {t}" for n, t in declared if t not in _modules()]
    assert not missing, missing


#: Modules that import by name: the lazy loader, and the shell's ``module:function``
#: (the user's module, never one of ours).
IMPORTS_BY_NAME = {"_src.lazy", "inspect.__main__"}


def test_only_the_lazy_loader_imports_by_name() -> None:
    """``importlib.import_module`` / ``__import__`` would be an import the checks above
    cannot see: only ``_src/lazy.py`` calls them, for the declarations they read."""
    bad = [
        f"{name}:{node.lineno} {ast.unparse(node.func)}"
        for name, path in _modules().items()
        if name not in IMPORTS_BY_NAME
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and ast.unparse(node.func).split(".")[-1] in ("import_module", "__import__")
    ]
    assert not bad, "imports by name outside _src/lazy.py:\n" + "\n".join(bad)


@pytest.mark.slow
def test_no_import_hidden_in_a_function() -> None:
    lazy = [
        f"{name}:{node.lineno} imports {target}"
        for name, path in _modules().items()
        for target, node, top in _imports(name, path)
        if not top and not _under_type_checking(path, node)
    ]
    assert not lazy, "lazy imports hide cycles:\n" + "\n".join(lazy)


def _under_type_checking(path: Path, node: ast.AST) -> bool:
    tree = ast.parse(path.read_text())
    for block in ast.walk(tree):
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test):
            if any(
                getattr(n, "lineno", None) == getattr(node, "lineno", -1) for n in ast.walk(block)
            ):
                return True
    return False


#: Standard-library names that start with "_" yet are public and documented.
PUBLIC_UNDERSCORED = {"os._exit"}


def test_no_module_reads_another_modules_private_names() -> None:
    bad = []
    for name, path in _modules().items():
        if _in_gateway(name):
            continue  # the one gateway to jax's private API, by design
        tree = ast.parse(path.read_text())
        aliases = {
            alias.asname or alias.name
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for alias in node.names
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                if ast.unparse(node) in PUBLIC_UNDERSCORED:
                    continue
                owner = node.value
                # mod._x for an imported module of ours, or a._b._c: another
                # object's internals reached through one's own.
                if isinstance(owner, ast.Name) and owner.id in aliases:
                    bad.append(f"{name}:{node.lineno} reads {ast.unparse(node)}")
                elif isinstance(owner, ast.Attribute) and _private(owner.attr):
                    bad.append(f"{name}:{node.lineno} reads {ast.unparse(node)}")
    assert not bad, "private names read from outside their module:\n" + "\n".join(bad)


def _private(attr: str) -> bool:
    return attr.startswith("_") and not attr.startswith("__")


# --- sibling front doors, one binder, one registry ---

FRONT_DOORS_MODULES = ("_src.jit", "_src.pjit", "_src.pmap")


def test_front_doors_are_siblings_on_one_layer() -> None:
    """jit, pjit and pmap share a layer and none imports another (they share
    ``wrapped.py`` and ``planner/`` below them instead)."""
    assert len({_layer(m) for m in FRONT_DOORS_MODULES}) == 1
    modules = _modules()
    crossing = [
        f"{name} imports {target}"
        for name in FRONT_DOORS_MODULES
        for target, _, _ in _imports(name, modules[name])
        if target in FRONT_DOORS_MODULES and target != name
    ]
    assert not crossing, crossing


BINDER = "_src.trace.arguments"


def _binder_violations(name: str, source: str) -> list[str]:
    """Calls that split or flatten a call's ``(args, kwargs)``, or bind a signature,
    outside the one binder."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = ast.unparse(node.func)
        first = node.args[0] if node.args else None
        if (
            func.split(".")[-1] in ("tree_flatten", "tree_flatten_with_path", "tree_structure")
            and isinstance(first, ast.Tuple)
            and len(first.elts) == 2
        ):
            bad.append(f"{name}:{node.lineno} flattens a call's arguments: {ast.unparse(node)}")
        if func.endswith(".bind") and "signature" in func.lower():
            bad.append(f"{name}:{node.lineno} binds a signature: {ast.unparse(node)}")
        if func.split(".")[-1] in ("split_arguments", "flatten_dynamic", "rebuilder"):
            bad.append(f"{name}:{node.lineno} re-implements the binder: {ast.unparse(node)}")
    return bad


def test_one_binder_reads_every_call() -> None:
    """Every front door, the dispatcher, the stages and colocated functions read a
    call's arguments through ``trace/arguments.py`` (``bind_call`` and its fast
    ``call_leaves`` / ``flat_arguments`` views), never by splitting or flattening
    ``(args, kwargs)`` themselves."""
    bad = [
        line
        for name, path in _modules().items()
        if name != BINDER
        for line in _binder_violations(name, path.read_text())
    ]
    assert not bad, "calls read around the binder:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    "source",
    [
        "leaves, tree = jax.tree_util.tree_flatten((args, kwargs))",
        "paths = tree_flatten_with_path((split.dynamic_args, split.dynamic_kwargs))",
        "bound = self._signature.bind(*args, **kwargs)",
        "bound = inspect.signature(fun).bind(*args)",
    ],
)
def test_binder_check_catches(source: str) -> None:
    assert _binder_violations("_src.example", source)


REGISTRIES = ("_src.registry", "_src.pmap_registry", "_src.host_callback.registry")


def _registrations(source: str) -> list[int]:
    """Lines that register something of a primitive with jax."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Subscript)
            and ast.unparse(t.value).startswith("jp.")  # a registry of jax's, via the gateway
            for t in node.targets
        ):
            found.append(node.lineno)
        elif isinstance(node, ast.Call):
            func = ast.unparse(node.func).split(".")[-1]
            if func in (
                "def_impl",
                "def_abstract_eval",
                "def_effectful_abstract_eval",
                "register_lowering",
                "requires_devices_during_lowering",
                "add_type",  # an effect type into one of jax's effect sets
                "report_intermediate_shardings",
            ):
                found.append(node.lineno)
    return found


def test_registrations_live_in_the_registry() -> None:
    """Every registration of partitioner's primitives is in a registry, read top to
    bottom: the core's in ``_src/registry.py``, the pmap region's in
    ``_src/pmap_registry.py`` (loaded with pmap), the host callbacks' in
    ``_src/host_callback/registry.py`` (docs/architecture.md says why not beside each
    rule)."""
    bad = [
        f"{name}:{line}"
        for name, path in _modules().items()
        if name not in REGISTRIES and not _in_gateway(name)  # the gateway's documented helpers
        for line in _registrations(path.read_text())
    ]
    assert not bad, "registrations outside the registry:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    "source",
    [
        "jp.primitive_jvps[pjit_p] = jvp",
        "jp.fancy_primitive_batchers[p] = rule",
        "pjit_p.def_impl(impl)",
        "jp.register_lowering(pjit_p, lowering)",
        "p.def_effectful_abstract_eval(f)",
        "jp.requires_devices_during_lowering(id_tap_p)",
        "jp.ordered_effects.add_type(TapEffect)",
    ],
)
def test_registration_check_catches(source: str) -> None:
    assert _registrations(source)


# --- the gateway to private jax ---

GATEWAY = "_src.jax_private"


def _in_gateway(name: str) -> bool:
    """Whether module ``name`` is the gateway package or one of its modules."""
    return name == GATEWAY or name.startswith(GATEWAY + ".")


def test_gateway_exports_names_not_modules() -> None:
    """Every public name of jax_private is a jax object, never a module: a module
    would let any caller reach every private attribute of it unseen.

    The package's own modules (``jax_private.mesh``) are attributes of it, as every
    imported submodule is of its package; they are not exports, and reading through
    one fails the check below. Names that are not identifiers are not exports either:
    pytest's assertion rewriting binds ``@py_builtins`` and ``@pytest_ar`` in every
    module of a distribution that has a pytest plugin, as partitioner does
    (``_partitioner_pytest``).
    """
    modules = sorted(
        name
        for name, value in vars(jax_private).items()
        if name.isidentifier()
        and not name.startswith("_")
        and isinstance(value, types.ModuleType)
        and not value.__name__.startswith(jax_private.__name__ + ".")
    )
    assert not modules, f"jax_private exports modules {modules}: export their names instead"


def _jax_bindings(name: str, path: Path, tree: ast.Module) -> dict[str, str]:
    """Names of a module bound to private jax: ``"gateway"`` (jax_private itself),
    ``"gw:X"`` (jax_private's X, or an alias of it) and ``"jax"`` (jax/jaxlib)."""
    bound: dict[str, str] = {}
    here = _package_of(name, path)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = _relative_target(node, here) if node.level else node.module or ""
            for alias in node.names:
                local = alias.asname or alias.name
                if f"{target}.{alias.name}" == GATEWAY:
                    bound[local] = "gateway"
                elif target == GATEWAY:
                    bound[local] = f"gw:{alias.name}"
                elif target.split(".")[0] in ("jax", "jaxlib"):
                    bound[local] = "jax"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in ("jax", "jaxlib"):
                    bound[alias.asname or alias.name.split(".")[0]] = "jax"
    for node in ast.walk(tree):  # aliases: `pe = jp.pe`, `xc = jax_private.X`, tuples
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            pairs = (
                zip(target.elts, value.elts, strict=False)
                if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple)
                else [(target, value)]
            )
            for t, v in pairs:
                if isinstance(t, ast.Name) and (kind := _jax_kind(v, bound)) is not None:
                    bound[t.id] = kind
    return bound


def _jax_kind(node: ast.expr, bound: dict[str, str]) -> str | None:
    """What ``node`` reads: ``"gw:X"`` for ``jp.X``, else its root's kind (or None)."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        if bound.get(node.value.id) == "gateway":
            return f"gw:{node.attr}"
    root = node
    while isinstance(root, (ast.Attribute, ast.Call, ast.Subscript)):
        root = root.func if isinstance(root, ast.Call) else root.value
    if isinstance(root, ast.Name) and root.id in bound:
        return "jax" if bound[root.id] == "gateway" else bound[root.id]
    return None


def _gateway_violations(name: str, path: Path, source: str) -> list[str]:
    """Imports of ``jax._src`` or of a module inside jax_private, reads through a module
    of jax_private, and private attributes of jax objects."""
    tree = ast.parse(source)
    bound = _jax_bindings(name, path, tree)
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bad += _import_violations(name, _package_of(name, path), node)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        kind = _jax_kind(node.value, bound)
        if kind is None:
            continue
        if kind.startswith("gw:"):
            export = getattr(jax_private, kind[3:], None)
            if export is None or isinstance(export, types.ModuleType):
                bad.append(
                    f"{name}:{node.lineno} reads {ast.unparse(node)} through jax_private."
                    f"{kind[3:]}, which is not a named export: add `{node.attr} = "
                    f"_module.{node.attr}` to jax_private's block of names and read jp.{node.attr}"
                )
        if _private(node.attr):
            bad.append(
                f"{name}:{node.lineno} reads jax's private {ast.unparse(node)}: give it a "
                "documented name or function in jax_private"
            )
    return bad


def _import_violations(name: str, here: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """An import of ``jax._src`` (only the gateway imports it), or of a module inside
    the gateway (its names are read as ``jp.Name``)."""
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    else:
        module = _relative_target(node, here) if node.level else node.module or ""
        targets = [module, *(f"{module}.{alias.name}" for alias in node.names)]
    for target in targets:
        if target == "jax._src" or target.startswith("jax._src."):
            return [
                f"{name}:{node.lineno} imports {target}: only jax_private imports jax._src; "
                "add the name there and read jp.<name>"
            ]
        ours = target.removeprefix("partitioner.") if target.startswith("partitioner.") else target
        if ours.startswith(GATEWAY + ".") and ours in _modules():
            return [
                f"{name}:{node.lineno} imports {ours}, inside the gateway: import jax_private "
                "and read jp.<name>"
            ]
    return []


def test_private_jax_is_read_through_named_exports_only() -> None:
    bad = [
        line
        for name, path in _modules().items()
        if not _in_gateway(name)
        for line in _gateway_violations(name, path, path.read_text())
    ]
    assert not bad, "private jax read around the gateway:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    "source, complaint",
    [
        ("from .. import jax_private as jp\npe = jp.pe\npe.dce_jaxpr(j)", "not a named export"),
        ("from .. import jax_private as jp\njp.core.Tracer", "not a named export"),
        ("from ..jax_private import core\ncore.Tracer", "not a named export"),
        ("from .. import jax_private as jp\npe = jp.pe\npe._jaxpr_forwarding(j)", "private"),
        ("from .. import jax_private as jp\njp.Tracer._trace", "private"),
        ("from .. import jax_private as jp\nf = jp.ClosedJaxpr\nf(j)._consts", "private"),
        (
            "from jax.sharding import NamedSharding\nNamedSharding(m, p)._to_xla_hlo_sharding(2)",
            "private",
        ),
        ("import jax\njax._src.core", "private"),
        ("from jax._src import core\ncore.Tracer", "only jax_private imports jax._src"),
        ("from jax._src.core import Tracer", "only jax_private imports jax._src"),
        ("import jax._src.dispatch", "only jax_private imports jax._src"),
        ("from jax import _src", "only jax_private imports jax._src"),
        ("from ..jax_private.mesh import push_mesh", "inside the gateway"),
        ("from partitioner._src.jax_private import tracing", "inside the gateway"),
        ("from ..jax_private import mesh\nmesh.push_mesh()", "not a named export"),
    ],
)
def test_gateway_check_catches(source: str, complaint: str) -> None:
    """The check above fails on each way around the gateway (so it can fail at all)."""
    path = PACKAGE / "_src" / "rules" / "example.py"
    found = _gateway_violations("_src.rules.example", path, source)
    assert any(complaint in line for line in found), found


def test_gateway_check_accepts_named_exports() -> None:
    source = (
        "from .. import jax_private as jp\n"
        "jp.primitive_jvps[p] = rule\n"
        "isinstance(x, jp.Tracer)\n"
        "jp.jaxpr_forwarding(j)\n"
        "self._cache = jp.Zero(aval)\n"
        "jp.push_mesh(m)\n"
        "from .. import jax_private\n"
        "from ..jax_private import ClosedJaxpr\n"
        "from jax.sharding import NamedSharding\n"
    )
    path = PACKAGE / "_src" / "rules" / "example.py"
    assert _gateway_violations("_src.rules.example", path, source) == []
