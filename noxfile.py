"""Developer sessions: tests, lint, typecheck, bench, examples."""

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
    session.run("ruff", "check", "partitioner", "tests", "benchmarks", "examples", "docs/make_images.py", "docs/hooks.py")
    session.run("ruff", "format", "--check", "partitioner", "tests", "benchmarks", "examples", "docs/make_images.py", "docs/hooks.py")


@nox.session
def typecheck(session: nox.Session) -> None:
    session.install("-e", ".", "mypy")
    session.run("mypy", "partitioner")


@nox.session
def bench(session: nox.Session) -> None:
    session.install("-e", ".", "matplotlib", "cloudpickle")  # jax's colocated_python needs it
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
