"""Where a new test goes, and how `make test` runs it.

`make test` runs the suite in two groups, one after the other:

1. **parallel** (`pytest -n 4 -m "not engine and not serial"`, pytest-xdist; four
   workers on two cores, since the fake-server experiments partly wait): the
   default. A test belongs here when it owns everything it touches: its files under
   `tmp_path`, servers on port 0, fake clocks. Most tests are this.
2. **serial** (`pytest -m "engine or serial"`), one test at a time, nothing else running:
   - `engine`: starts a real llama.cpp or vLLM CPU server. Put it in tests/real_engines/ (the
     directory marks it); share servers, teachers and experiments there through the
     session fixtures in tests/real_engines/conftest.py rather than starting new ones.
     (tests/engine_adapters/ is the other thing: each adapter's knowledge, checked against
     recorded outputs and argv, no server; it runs in the parallel group.)
   - `serial`: does not start a real engine but must still run alone: it needs a fixed
     port, reads the host's load, or measures real elapsed time that a busy neighbour
     would stretch. Mark it `@pytest.mark.serial` and say why in a comment.

Either way, no test sleeps for real time to pass: idle gaps, idle-gate snapshots and
readiness polls take a fake clock (probes_support.FakeClock) or wait on the event.
A command-line test runs the command in its own process (cli_support.cli_in_process)
unless it is about the process itself (a signal, a kill, a hang): each `python -m
tokrecord` costs about 1 s of CPU in imports.
`make test-fast` is both groups without `engine`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from git_support import refresh_git_index

# One BLAS thread in every test process and each process it starts, set before anything
# imports numpy (the xdist workers inherit it from the controller, which loads this file
# first). OpenBLAS's threads spin while they wait for work: with three workers on two
# cores they burned CPU the tests then lacked (the demo model's reference forward pass:
# 8.9 s of CPU at load 6, 1.5 s with one thread; issue 28). Real engines are unaffected:
# vLLM CPU's torch computes with OpenMP, llama.cpp with its own threads.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

FAKE = [sys.executable, "-m", "tokrecord.server.fake"]


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # once, in the controller, not in each xdist worker
        refresh_git_index(Path(__file__).parent.parent)


@pytest.fixture
def fake_argv() -> list[str]:
    """Server command template for the packaged fake server."""
    return [*FAKE, "--host", "{host}", "--port", "{port}", "--model", "{model}"]


@pytest.fixture
def run_root(tmp_path: Path) -> Path:
    return tmp_path / "runs"


@pytest.fixture(autouse=True, scope="session")
def _signing_key_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Seals in tests sign with a throwaway key, never the user's."""
    os.environ["TOKRECORD_CONFIG_DIR"] = str(tmp_path_factory.mktemp("tokrecord-config"))


@pytest.fixture(autouse=True, scope="session")
def _fake_servers_sleep() -> None:
    """Every fake server a test starts (they inherit this environment) sleeps to each due
    write instead of spinning its last millisecond: at the suite's 1000-3000 tok/s the
    spin was the whole stream, about a quarter of a fake experiment's CPU, on two cores
    shared by three workers. Writes stay never early, only a little late; how closely the
    server keeps its schedule is bench/fidelity's figure, with the spin. Their first token
    comes after 10 ms, not 50 (plan_support.SLEEPING_FAKE). A test given its own `env=`
    starts servers that spin unless that env carries SLEEPING_FAKE."""
    from plan_support import SLEEPING_FAKE

    for name, value in SLEEPING_FAKE.items():
        os.environ.setdefault(name, value)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test under tests/real_engines/ is an engine test whether or not its module says so."""
    engine_dir = Path(__file__).parent / "real_engines"
    for item in items:
        if engine_dir in item.path.parents:
            item.add_marker(pytest.mark.engine)
    slow_modules_first(items)


# The parallel group's longest modules (their fake-server experiments, wall seconds on a
# quiet machine), longest first. `--dist loadfile --no-loadscope-reorder` (the Makefile) hands
# modules to the workers in collection order, so a long module collected last would run alone
# at the end; started first, the short modules fill the other workers around it. Order only: a
# module missing here, or listed and gone, costs time, never a result.
SLOW_MODULES = (
    "submit/test_submit_lifecycle.py", "experiment/test_experiment_fake.py",
    "experiment/test_experiment_blocks.py", "experiment/test_sequential_fake.py",
    "submit/test_submit_flow.py", "experiment/test_crash_safety.py",
    # One unit of work with the two after it (SHARED_SCOPES).
    "record/test_verify.py", "record/test_hostile_evidence.py", "record/test_record_schema.py",
    "experiment/test_identity_per_leg.py", "experiment/test_sweep_fake.py", "cli/test_cli.py",
    "report/test_report_html.py", "experiment/test_sealed_evidence.py",
    "cli/test_reaccount_cli.py", "cli/test_first_experiment.py",
    "experiment/test_noise_record.py", "record/test_h200_example.py",
)


# Modules that share a session fixture's work, each sent to the same xdist worker as the first
# one named: --dist loadfile would otherwise build the fixture once in every worker that gets
# one of them. test_hostile_evidence and test_record_schema read test_verify's sealed fake ABBA
# (tests/sealed_support.py).
SHARED_SCOPES = {
    "tests/record/test_hostile_evidence.py": "tests/record/test_verify.py",
    "tests/record/test_record_schema.py": "tests/record/test_verify.py",
}


# Long tests that share nothing with their module (a fake experiment of their own under
# tmp_path, no module fixture), each handed out as a unit of its own: with loadfile, a long
# module ran all of them on one worker, and test_experiment_fake alone took some 110 s of
# the parallel group's wall time while the other workers had nothing left (issue 28). A
# test renamed here only goes back to its module's unit: order, never a result.
SPLIT_TESTS = {
    "tests/experiment/test_experiment_fake.py": (
        "test_resume_after_interruption_during_a_leg",
        "test_resume_after_interruption_between_legs", "test_a_a_experiment_makes_no_record"),
    "tests/experiment/test_sequential_fake.py": ("test_no_effect_with_no_band_runs_to_its_maximum",),
    "tests/experiment/test_experiment_blocks.py": (
        "test_aa_experiment_records_the_noise_and_claims_nothing",
        "test_an_interrupted_second_block_resumes_to_a_record_that_verifies"),
    "tests/experiment/test_crash_safety.py": (
        "test_a_full_disk_gives_one_message_then_resumes",
        "test_raw_log_recovers_a_row_cut_by_sigkill"),
    "tests/submit/test_submit_lifecycle.py": ("test_the_prior_is_rechecked_at_preregistration",),
}


@pytest.hookimpl(optionalhook=True)  # a hook of xdist's: unknown to a run without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """--dist loadfile, with the SHARED_SCOPES modules as one unit of work and each of the
    SPLIT_TESTS as one of its own."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedFileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope: str = super()._split_scope(nodeid)
            test = nodeid.partition("::")[2].partition("[")[0]
            if test in SPLIT_TESTS.get(scope, ()):
                return nodeid
            return SHARED_SCOPES.get(scope, scope)

    return SharedFileScheduling(config, log)


def slow_modules_first(items: list[pytest.Item]) -> None:
    """Reorders `items` in place: SLOW_MODULES' tests first, in that order; the rest keep
    theirs (the sort is stable, and a module's tests stay together and in order)."""
    tests_dir = Path(__file__).parent
    rank = {tests_dir / name: i for i, name in enumerate(SLOW_MODULES)}
    items.sort(key=lambda item: rank.get(item.path, len(rank)))
