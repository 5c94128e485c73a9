"""Developer sessions: tests, lint, typecheck, bench, examples, docs, package."""

import pathlib
import shutil
import tempfile

import nox

nox.options.sessions = ["tests", "lint"]
nox.options.default_venv_backend = "venv"


@nox.session
def tests(session: nox.Session) -> None:
    session.install("-e", ".[test]")
    session.run("python", "-m", "pytest", "-q", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run(
        "ruff",
        "check",
        "partitioner",
        "_partitioner_pytest",
        "tests",
        "benchmarks",
        "examples",
        "docs/make_images.py",
        "docs/hooks.py",
    )
    session.run(
        "ruff",
        "format",
        "--check",
        "partitioner",
        "_partitioner_pytest",
        "tests",
        "benchmarks",
        "examples",
        "docs/make_images.py",
        "docs/hooks.py",
    )


@nox.session
def typecheck(session: nox.Session) -> None:
    session.install("-e", ".", "mypy")
    session.run("mypy", "partitioner", "_partitioner_pytest")


@nox.session
def bench(session: nox.Session) -> None:
    # cloudpickle: jax's colocated_python needs it; optax: bench_plan's AdamW steps.
    session.install("-e", ".", "matplotlib", "cloudpickle", "optax")
    session.run("python", "benchmarks/run_all.py", *session.posargs)


@nox.session
def docs(session: nox.Session) -> None:
    """The docs site (MkDocs + mkdocs-material, warnings as errors) into site/; pictures first."""
    session.install("-e", ".[docs]")
    session.run("python", "docs/make_images.py")
    session.run("mkdocs", "build", "--strict")


@nox.session
def examples(session: nox.Session) -> None:
    session.install("-e", ".[test]")  # the flax, optax and orbax the client examples use
    for script in (
        "quickstart.py",
        "flax_t5x_style.py",
        "flax_nnx.py",
        "tap_training.py",
        "checkpoint_reshard.py",
        "pmap_training.py",
    ):
        session.run("python", f"examples/{script}")
    # jobs of 2 processes
    for script in ("multiprocess_train.py", "colocated_loader.py", "pmap_multiprocess.py"):
        session.run(
            "python",
            "-m",
            "partitioner.launch",
            "-n",
            "2",
            "--devices-per-process",
            "4",
            "--",
            "python",
            f"examples/{script}",
        )


# What a user of a published release gets, checked inside the venv the wheel went into:
# the PEP 561 marker, the testing helpers, the pytest plugin's entry point, and a type
# checker that reads our annotations (a wrong call is an error, not Any).
INSTALLED_CHECK = """
import importlib.metadata as md, pathlib, partitioner, partitioner.testing
root = pathlib.Path(partitioner.__file__).parent
assert 'site-packages' in str(root), f'imported from the source tree: {root}'
assert (root / 'py.typed').is_file(), 'py.typed missing from the wheel'
assert (root / 'testing' / 'plugin.py').is_file(), 'partitioner/testing missing from the wheel'
import _partitioner_pytest  # the plugin's own package, beside partitioner
plugins = {e.name: e.value for e in md.entry_points(group='pytest11')}
assert plugins.get('partitioner') == '_partitioner_pytest', plugins
print('installed wheel:', root)
"""
TYPED_USER = """
import partitioner
def f(x: int) -> int:
    return x
wrapped: partitioner.PjitWrapped = partitioner.pjit(f)
n: int = partitioner.pjit(f, in_axis_resources=None).lower
"""


@nox.session
def package(session: nox.Session) -> None:
    """Build the sdist and wheel, install the wheel into a fresh venv, run the quick start.

    The quick start runs from a scratch folder, so ``import partitioner`` finds the
    installed wheel and not this checkout.
    """
    session.install("build", "mypy", "pytest")
    dist = pathlib.Path(tempfile.mkdtemp(prefix="partitioner-dist-"))
    session.run("python", "-m", "build", "--sdist", "--wheel", "--outdir", str(dist))
    (wheel,) = dist.glob("partitioner-*.whl")
    session.install(str(wheel))
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="partitioner-user-"))
    shutil.copy("examples/quickstart.py", scratch)
    (scratch / "typed_user.py").write_text(TYPED_USER)
    with session.chdir(scratch):
        session.run("python", "-c", INSTALLED_CHECK)
        session.run("python", "quickstart.py")
        out = session.run(
            "mypy", "--no-incremental", "typed_user.py", success_codes=[1], silent=True
        )
        # The one wrong line (a bound method assigned to an int) must be caught: a
        # package without py.typed would be treated as untyped and pass silently.
        assert out and "typed_user.py:6: error: Incompatible types" in out, out
        assert "Found 1 error" in out, out
        usage = session.run("python", "-m", "pytest", "--help", silent=True)
        assert usage and "--virtual-devices" in usage, "the pytest plugin did not load"
