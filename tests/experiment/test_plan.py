"""Plans: TOML validated, defaults made explicit, hashed; every bad key named."""

from __future__ import annotations

from pathlib import Path

import pytest

from paths import FIXTURES as FIXTURES_DIR
from tokrecord.client import Endpoint
from tokrecord.errors import ConfigError
from tokrecord.experiment.plan import SCHEMA_PLAN, Design, Plan, load_plan
from tokrecord.metrics import Convention

MINIMAL = """\
name = "qknorm-stack"

[server]
argv = ["python", "-m", "tokrecord.server.fake", "--port", "{port}", "--model", "{model}"]
model = "m"

[arms.control]
env = { FLAG = "0" }

[arms.candidate]
env = { FLAG = "1" }
"""


def write(tmp_path: Path, text: str, name: str = "plan.toml") -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_minimal_abba_plan(tmp_path: Path) -> None:
    plan = load_plan(write(tmp_path, MINIMAL))
    assert isinstance(plan, Plan)
    assert plan.name == "qknorm-stack"
    assert plan.design is Design.ABBA
    assert plan.legs == (("A1", "control"), ("B1", "candidate"), ("B2", "candidate"), ("A2", "control"))
    assert [n for n, _ in plan.legs] == ["A1", "B1", "B2", "A2"]
    assert [a for _, a in plan.legs] == ["control", "candidate", "candidate", "control"]
    assert plan.arms["control"].env == {"FLAG": "0"}
    assert plan.arms["candidate"].env == {"FLAG": "1"}
    assert plan.server.argv[-1] == "{model}"


def test_defaults_are_filled(tmp_path: Path) -> None:
    plan = load_plan(write(tmp_path, MINIMAL))
    assert plan.schema_id == SCHEMA_PLAN == "tokrecord.plan/v1"
    assert plan.suite is None and plan.suite_rows is None and plan.teacher is None
    assert plan.endpoint is Endpoint.COMPLETIONS
    assert plan.headline is Convention.CONVENTIONAL
    assert plan.metric == "median_tok_s_1_100_after_ttft"
    assert plan.idle_gap_s == 60.0
    assert plan.request_extra == {}
    assert plan.gate_kind == "strict-preregistered"
    assert plan.server.host == "127.0.0.1"
    assert plan.server.ready_timeout_s == 600.0 and plan.server.stop_grace_s == 15.0
    assert plan.server.metrics_path == "/metrics" and plan.server.served_model is None
    assert plan.arms["control"].extra_args == () and plan.arms["control"].log_rules == ()
    assert plan.prior.value_tok_s is None and plan.prior.id is None
    assert plan.criteria.headline_delta_pct_gt == 0.0
    assert plan.criteria.paired_median_delta_pct_gt == 0.0
    assert plan.criteria.row_wins_fraction_gt == 0.5
    assert plan.verdict.confidence == 0.95 and plan.verdict.bootstrap_samples == 10_000
    assert plan.verdict.seed == 0 and plan.verdict.equivalence_pct == 1.0
    assert plan.verdict.require_faster_for_record is True
    assert plan.gates.long_context_threshold == 800 and plan.gates.rollover_boundary is None
    # every default is explicit in what is hashed
    canonical = plan.canonical().decode()
    for key in ('"idle_gap_s":60', '"schema":"tokrecord.plan/v1"', '"bootstrap_samples":10000',
                '"row_wins_fraction_gt":0.5', '"headline":"conventional"'):
        assert key in canonical, key


def test_hash_is_stable_across_loads(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL)
    first, second = load_plan(path), load_plan(path)
    assert first.sha256 == second.sha256
    assert len(first.sha256) == 64 and int(first.sha256, 16) >= 0
    # the same plan written differently (key order, inline tables, comments) hashes the same
    reordered = write(tmp_path, """\
# a comment
[arms.candidate.env]
FLAG = "1"
[arms.control.env]
FLAG = "0"
[server]
model = "m"
argv = ["python", "-m", "tokrecord.server.fake", "--port", "{port}", "--model", "{model}"]
""".replace("[arms.candidate.env]", 'name = "qknorm-stack"\n[arms.candidate.env]'),
        "other/plan.toml")
    assert load_plan(reordered).sha256 == first.sha256
    # defaults written out explicitly: the same plan
    explicit = write(tmp_path, 'design = "abba"\nidle_gap_s = 60.0\n' + MINIMAL, "explicit.toml")
    assert load_plan(explicit).sha256 == first.sha256


@pytest.mark.parametrize(
    "change",
    [
        ('name = "qknorm-stack"', 'name = "qknorm-stack2"'),
        ('FLAG = "1"', 'FLAG = "2"'),
        ('env = { FLAG = "0" }', 'env = { FLAG = "0", OTHER = "0" }'),
        ('"{model}"]', '"{model}", "--tok-s", "1000"]'),
        ('model = "m"', 'model = "n"'),
        ('model = "m"', 'model = "m"\nready_timeout_s = 30'),
        ('name = "qknorm-stack"', 'name = "qknorm-stack"\nidle_gap_s = 59.5'),
        ('name = "qknorm-stack"', 'name = "qknorm-stack"\nsuite_rows = 3'),
        ('name = "qknorm-stack"', 'name = "qknorm-stack"\nteacher = "capture"'),
        ('name = "qknorm-stack"', 'name = "qknorm-stack"\nheadline = "legacy-inclusive-events"'),
        ('name = "qknorm-stack"', 'name = "qknorm-stack"\nnotes = "why"'),
        ('name = "qknorm-stack"', 'name = "qknorm-stack"\n[prior]\nvalue_tok_s = 33.4'),
        ('name = "qknorm-stack"', 'name = "qknorm-stack"\n[criteria]\nrow_wins_fraction_gt = 0.6'),
        ('name = "qknorm-stack"', 'name = "qknorm-stack"\n[verdict]\nseed = 1'),
        ('name = "qknorm-stack"', 'name = "qknorm-stack"\n[verdict]\nequivalence_pct = 0.5'),
        ('name = "qknorm-stack"', 'name = "qknorm-stack"\n[request_extra]\ntemperature = 0'),
        ('[arms.candidate]', '[arms.candidate]\nextra_args = ["--fast"]'),
    ],
)
def test_hash_changes_when_any_value_changes(tmp_path: Path, change: tuple[str, str]) -> None:
    old, new = change
    assert old in MINIMAL
    base = load_plan(write(tmp_path, MINIMAL, "a.toml"))
    changed = load_plan(write(tmp_path, MINIMAL.replace(old, new, 1), "b.toml"))
    assert changed.sha256 != base.sha256
    assert changed.canonical() != base.canonical()


def _error(tmp_path: Path, text: str) -> tuple[Path, str]:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_plan(path)
    return path, str(info.value)


@pytest.mark.parametrize(
    "old, new, key",
    [
        ('name = "qknorm-stack"', 'name = "qknorm-stack"\nidle_gap = 5', "idle_gap"),
        ('[arms.control]\nenv = { FLAG = "0" }', '[arms.control]\nevn = {}', "arms.control.evn"),
        ('model = "m"', 'model = "m"\nready_timout_s = 3', "server.ready_timout_s"),
        ('name = "qknorm-stack"', 'name = "qknorm-stack"\n[verdict]\nsamples = 100',
         "verdict.samples"),
        ('name = "qknorm-stack"', 'name = "qknorm-stack"\n[prior]\nvalue = 33.4', "prior.value"),
    ],
)
def test_typo_key_is_named(tmp_path: Path, old: str, new: str, key: str) -> None:
    assert old in MINIMAL
    path, message = _error(tmp_path, MINIMAL.replace(old, new, 1))
    assert f"{path}: key '{key}': unknown key" in message


@pytest.mark.parametrize(
    "old, new, key",
    [
        ('name = "qknorm-stack"', 'name = "qknorm-stack"\nidle_gap_s = "soon"', "idle_gap_s"),
        ('name = "qknorm-stack"', 'name = "qknorm-stack"\nsuite_rows = 0', "suite_rows"),
        ('name = "qknorm-stack"', 'name = "qknorm-stack"\ndesign = "abab"', "design"),
        ('FLAG = "1"', "FLAG = 1", "arms.candidate.env.FLAG"),
        ('argv = ["python"', 'argv = 7\nunused = ["python"', "server.argv"),
        ('name = "qknorm-stack"', 'name = "qknorm-stack"\n[verdict]\nconfidence = 1.5',
         "verdict.confidence"),
    ],
)
def test_wrong_type_or_value_names_the_key(tmp_path: Path, old: str, new: str, key: str) -> None:
    assert old in MINIMAL
    path, message = _error(tmp_path, MINIMAL.replace(old, new, 1))
    assert f"{path}: key '{key}'" in message
    assert "unknown key" not in message.split(f"key '{key}'")[1].splitlines()[0]


def test_unknown_arm_is_refused(tmp_path: Path) -> None:
    path, message = _error(tmp_path, MINIMAL + '\n[arms.treatment]\nenv = { FLAG = "2" }\n')
    assert f"{path}: key 'arms.treatment" in message


def test_missing_required_key(tmp_path: Path) -> None:
    path, message = _error(tmp_path, MINIMAL.replace('model = "m"\n', ""))
    assert f"{path}: key 'server.model'" in message and "required" in message.lower()


def test_single_design_needs_a_candidate(tmp_path: Path) -> None:
    text = 'design = "single"\n' + MINIMAL.split("[arms.candidate]")[0]
    path, message = _error(tmp_path, text)
    assert str(path) in message
    assert "design 'single' needs arms ['candidate']; missing ['candidate']" in message


def test_single_design_with_candidate_only(tmp_path: Path) -> None:
    text = 'design = "single"\n' + MINIMAL.replace('[arms.control]\nenv = { FLAG = "0" }\n', "")
    plan = load_plan(write(tmp_path, text))
    assert plan.design is Design.SINGLE
    assert plan.legs == (("B1", "candidate"),)


def test_abba_design_needs_a_control(tmp_path: Path) -> None:
    text = MINIMAL.replace('[arms.control]\nenv = { FLAG = "0" }\n', "")
    path, message = _error(tmp_path, text)
    assert str(path) in message
    assert "design 'abba' needs arms ['candidate', 'control']; missing ['control']" in message


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    path, message = _error(tmp_path, MINIMAL + "idle_gap_s = = 3\n")
    assert message.startswith(f"{path}: invalid TOML")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read plan .*nope\.toml"):
        load_plan(tmp_path / "nope.toml")


def test_relative_paths_resolve_against_the_plan_file(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    text = 'suite = "suites/s.jsonl"\nteacher = "../teachers/t.json"\n' + MINIMAL
    path = write(tmp_path, text, "plans/deep/plan.toml")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    plan = load_plan(path)
    assert plan.suite == str((tmp_path / "plans" / "deep" / "suites" / "s.jsonl").resolve())
    assert plan.teacher == str((tmp_path / "plans" / "teachers" / "t.json").resolve())
    # and the same when loaded through a relative path from another directory
    monkeypatch.chdir(tmp_path / "plans")
    again = load_plan(Path("deep/plan.toml"))
    assert again.suite == plan.suite and again.teacher == plan.teacher
    assert again.sha256 == plan.sha256


def test_absolute_paths_and_capture_are_kept(tmp_path: Path) -> None:
    suite = tmp_path / "abs" / "suite.jsonl"
    text = f'suite = "{suite}"\nteacher = "capture"\n' + MINIMAL
    plan = load_plan(write(tmp_path, text, "p/plan.toml"))
    assert plan.suite == str(suite)
    assert plan.teacher == "capture"


def test_plan_sealed_before_idle_gates_keeps_its_hash() -> None:
    """A demo plan preregistered by tokrecord before [idle] and [telemetry] existed:
    its hash (in every leg and the record) must not change, or it stops verifying."""
    import json

    from tokrecord.probes.idle import IdleCriteria

    fixture = FIXTURES_DIR / "legacy-plan"
    plan = Plan.model_validate(json.loads((fixture / "plan.json").read_text()))
    registered = (fixture / "plan.sha256").read_text().split()[0]
    assert plan.sha256 == registered
    assert b'"idle"' not in plan.canonical() and b'"telemetry"' not in plan.canonical()
    # A declared, non-default [idle] is part of the hash.
    strict = plan.model_copy(update={"idle": IdleCriteria(consecutive=13)})
    assert strict.sha256 != registered and b'"consecutive":13' in strict.canonical()


# --------------------------------------------------------------------------- k blocks, A/A, power


def test_blocks_name_and_counterbalance_the_legs(tmp_path: Path) -> None:
    plan = load_plan(write(tmp_path, "blocks = 3\n" + MINIMAL))
    assert [n for n, _ in plan.legs] == ["A1", "B1", "B2", "A2", "B3", "A3", "A4", "B4",
                                         "A5", "B5", "B6", "A6"]
    assert [a for n, a in plan.legs] == [
        "control" if n.startswith("A") else "candidate" for n, _ in plan.legs]
    assert plan.pairs == (("B1", "A1"), ("B2", "A2"), ("B3", "A3"), ("B4", "A4"), ("B5", "A5"),
                          ("B6", "A6"))
    assert [leg.block for leg in plan.design_legs] == [1] * 4 + [2] * 4 + [3] * 4


def test_one_block_keeps_the_hash_of_a_plan_without_blocks(tmp_path: Path) -> None:
    plain = load_plan(write(tmp_path, MINIMAL, "a.toml"))
    explicit = load_plan(write(tmp_path, "blocks = 1\nrecord_confidence = 0.98\n" + MINIMAL,
                               "b.toml"))
    assert plain.sha256 == explicit.sha256
    assert b'"blocks"' not in plain.canonical()
    two = load_plan(write(tmp_path, "blocks = 2\n" + MINIMAL, "c.toml"))
    assert two.sha256 != plain.sha256 and b'"blocks":2' in two.canonical()


@pytest.mark.parametrize("value", ["0", "-1"])
def test_blocks_below_one_names_file_and_key(tmp_path: Path, value: str) -> None:
    path = write(tmp_path, f"blocks = {value}\n" + MINIMAL)
    with pytest.raises(ConfigError, match=rf"{path}: key 'blocks': Input should be greater"):
        load_plan(path)


def test_single_design_has_one_block(tmp_path: Path) -> None:
    path = write(tmp_path, 'design = "single"\nblocks = 2\n' + MINIMAL)
    with pytest.raises(ConfigError, match="design 'single' has one leg: blocks must be 1"):
        load_plan(path)


def test_aa_runs_its_one_arm_in_every_position(tmp_path: Path) -> None:
    text = MINIMAL.split("[arms.candidate]")[0]
    plan = load_plan(write(tmp_path, 'design = "aa"\nblocks = 2\n' + text))
    assert plan.design is Design.AA
    assert [n for n, _ in plan.legs] == ["A1", "B1", "B2", "A2", "B3", "A3", "A4", "B4"]
    assert {a for _, a in plan.legs} == {"control"}
    assert plan.pairs[0] == ("B1", "A1") and len(plan.pairs) == 4


def test_aa_with_two_arms_names_file_and_arms(tmp_path: Path) -> None:
    path = write(tmp_path, 'design = "aa"\n' + MINIMAL)
    with pytest.raises(ConfigError, match=rf"{path}: .*design 'aa' runs one arm in every leg; "
                       r"this plan has 2 \(candidate, control\)"):
        load_plan(path)


def test_min_effect_without_noise_names_file_and_key(tmp_path: Path) -> None:
    path = write(tmp_path, "min_effect_pct = 3\n" + MINIMAL)
    with pytest.raises(ConfigError, match=rf"{path}: key 'min_effect_pct': its power cannot be "
                       "computed: no noise given"):
        load_plan(path)


def test_noise_needs_both_figures(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "\n[noise]\nsd_leg_pct = 1\n")
    with pytest.raises(ConfigError, match=r"key 'noise': Value error, give both sd_leg_pct and "
                       "sd_row_pct"):
        load_plan(path)


def test_noise_records_resolve_against_the_plan_file(tmp_path: Path) -> None:
    path = write(tmp_path, "min_effect_pct = 2\n" + MINIMAL
                 + '\n[noise]\nfrom_records = ["runs/aa/record.json"]\n', "sub/plan.toml")
    plan = load_plan(path)
    assert plan.noise is not None
    assert plan.noise.from_records == (str(tmp_path / "sub" / "runs" / "aa" / "record.json"),)
