"""`rofu import --dsjson`: the line parser, the rows it makes, and bad input refused with
its line numbers, nothing written, exit status 1."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from rofu import cli
from rofu.service import migrate
from rofu.service.db.engine import make_engine, session_factory
from rofu.service.db.tables import ArmRow, DecisionRow, RewardRow
from rofu.service.deciding import features
from rofu.service.log.imports.dsjson import DsjsonError, parse_line
from rofu.service.settings import get_settings

#: A Personalizer-style event: named context namespaces, three actions with `_tag` ids
#: and named features, `p` in `a`'s order (the chosen third action first).
EVENT: dict[str, Any] = {
    "_label_cost": -1.0,
    "_label_probability": 0.7,
    "_label_Action": 3,
    "_labelIndex": 2,
    "o": [{"v": 1.0, "EventId": "ev-1", "ActionTaken": False}],
    "Timestamp": "2024-03-01T10:00:00.1234567Z",
    "Version": "1",
    "EventId": "ev-1",
    "a": [3, 1, 2],
    "c": {
        "user": {"age": 31, "country": "fr"},
        "device": [{"mobile": True}, {"os": "android"}],
        "hour": 13,
        "_private": "left out",
        "_multi": [
            {"_tag": "pasta", "dish": {"cuisine": "italian"}, "price": 12},
            {"_tag": "sushi", "dish": {"cuisine": "japanese"}},
            {"_tag": "salad", "dish": {"cuisine": "any"}, "price": 7},
        ],
    },
    "p": [0.7, 0.2, 0.1],
    "VWState": {"m": "personalizer/model-1"},
}


def _line(**changes: Any) -> str:
    event = copy.deepcopy(EVENT)
    for key, value in changes.items():
        if value is None:
            event.pop(key, None)
        else:
            event[key] = value
    return json.dumps(event)


def test_dsjson_parse_maps_probabilities_back_to_the_actions_order() -> None:
    event = parse_line(_line())
    assert [action.arm for action in event.actions] == ["pasta", "sushi", "salad"]
    assert event.chosen == 2
    assert event.probabilities == [0.2, 0.1, 0.7]
    assert (event.propensity, event.reward) == (0.7, 1.0)
    assert event.created_at.isoformat() == "2024-03-01T10:00:00.123456+00:00"
    assert event.context == {
        "user": {"age": 31, "country": "fr"},
        "device": {"mobile": True, "os": "android"},
        "hour": 13,
    }
    assert event.actions[0].features == {"dish": {"cuisine": "italian"}, "price": 12}
    assert not event.deferred


def test_dsjson_parse_reads_activation_flags_and_unlabelled_events() -> None:
    taken = parse_line(_line(o=[{"EventId": "ev-1", "ActionTaken": True}]))
    assert (taken.deferred, taken.activated, taken.skip_learn) == (True, True, False)
    skipped = parse_line(_line(_skipLearn=True, _label_cost=None, o=None))
    assert (skipped.deferred, skipped.activated, skipped.reward) == (True, False, None)
    no_p = parse_line(_line(p=None))
    assert (no_p.probabilities, no_p.propensity) == (None, 0.7)
    from_p = parse_line(_line(_label_probability=None))
    assert from_p.propensity == 0.7


def test_dsjson_parse_reads_rofu_exports_dense_features() -> None:
    line = {
        **EVENT,
        "a": [2, 1],
        "p": [0.6, 0.4],
        "_label_probability": 0.6,
        "_label_Action": 2,
        "_labelIndex": 1,
        "c": {
            "x": {"0": 0.5, "1": -1.0},
            "_multi": [{"arm": {"id": "arm-0"}, "z": {"0": 1.0}}, {"arm": {"id": "arm-1"}}],
        },
        "rofu": {"explore": True, "named_context": None},
    }
    event = parse_line(json.dumps(line))
    assert event.context == [0.5, -1.0]
    assert [(a.arm, a.features) for a in event.actions] == [("arm-0", [1.0]), ("arm-1", None)]
    line["rofu"] = {"named_context": {"user": {"age": 3.0}}}
    assert parse_line(json.dumps(line)).context == {"user": {"age": 3.0}}


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        (_line().replace('"hour": 13', '"hour": NaN'), "NaN is not a number JSON allows"),
        (_line().replace('"hour": 13', '"hour": 1e999'), "1e999 is not a finite number"),
        (_line(EventId=None), "EventId: missing"),
        (_line(EventId="has space"), "EventId: 'has space' is not"),
        (_line(Timestamp="yesterday"), "Timestamp: 'yesterday' is not an ISO 8601 time"),
        (_line(_label_probability=0.0, p=None), "probability 0 is outside (0, 1]"),
        (_line(_label_probability=1.5, p=None), "probability 1.5 is outside (0, 1]"),
        (_line(p=[0.7, 0.3]), "p: 2 probabilities for 3 actions"),
        (_line(p=[0.7, 0.4, -0.1]), "p.2 = -0.1 outside [0, 1]"),
        (_line(p=[0.7, 0.2, 0.2]), "p sums to 1.1, not 1 (within 0.001)"),
        (_line(p=[0.6, 0.2, 0.2]), "p.0 = 0.6 is not _label_probability = 0.7"),
        (_line(a=[3, 1, 1]), "a: [3, 1, 1] is not a permutation of 1..3"),
        (_line(a=[4, 1, 2]), "is not a permutation of 1..3"),
        (_line(_label_Action=1), "_label_Action: 1 is not the chosen action a[0] = 3"),
        (_line(_label_probability=None, p=None), "no probability of the chosen action"),
        (_line(_label_cost="high"), "_label_cost: expected a number, got str"),
        (_line(_skipLearn="yes"), "_skipLearn: expected true or false"),
    ],
)
def test_dsjson_parse_refuses_bad_lines(text: str, reason: str) -> None:
    with pytest.raises(DsjsonError) as refused:
        parse_line(text)
    assert reason in str(refused.value)


def test_dsjson_parse_refuses_actions_without_usable_ids() -> None:
    event = copy.deepcopy(EVENT)
    del event["c"]["_multi"][1]["_tag"]
    with pytest.raises(DsjsonError, match=r"c._multi.1: the action has no id"):
        parse_line(json.dumps(event))
    event["c"]["_multi"][1]["_tag"] = "pasta"
    with pytest.raises(DsjsonError, match=r"c._multi.1: action 'pasta' repeats c._multi.0"):
        parse_line(json.dumps(event))
    event["c"]["_multi"][1]["_tag"] = "two words"
    with pytest.raises(DsjsonError, match=r"c._multi.1._tag: 'two words' is not"):
        parse_line(json.dumps(event))


@pytest.fixture
def shell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """ROFU_* settings of a migrated SQLite database, arm features hashed into 8."""
    for name in list(os.environ):
        if name.upper().startswith("ROFU_"):
            monkeypatch.delenv(name)
    url = f"sqlite:///{tmp_path}/rofu.sqlite"
    env = {"ROFU_DATABASE_URL": url, "ROFU_CONTEXT_DIM": "16", "ROFU_ARM_FEATURE_DIM": "8"}
    env["ROFU_ARMS"] = "[]"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    migrate.upgrade(url)
    get_settings.cache_clear()
    yield url
    get_settings.cache_clear()


def _counts(url: str) -> tuple[int, int, int]:
    engine = make_engine(url)
    try:
        with session_factory(engine)() as session:
            return tuple(  # type: ignore[return-value]
                session.scalar(select(func.count()).select_from(table))
                for table in (DecisionRow, RewardRow, ArmRow)
            )
    finally:
        engine.dispose()


def test_import_hashes_features_as_select_and_marks_rows(
    shell: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "log.dsjson"
    path.write_text(_line() + "\n\n" + _line(EventId="ev-2", _label_cost=None) + "\n")
    assert cli.main(["import", "--dsjson", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{path}: imported 2 events (1 with rewards), 3 arms created" in out
    engine = make_engine(shell)
    try:
        with session_factory(engine)() as session:
            row = session.get(DecisionRow, "ev-1")
            assert row is not None
            arms = {arm.id: arm.features for arm in session.scalars(select(ArmRow))}
            reward = session.scalar(select(RewardRow.value).where(RewardRow.event_id == "ev-1"))
    finally:
        engine.dispose()
    named = {"user": {"age": 31, "country": "fr"}, "device": {"mobile": True, "os": "android"}}
    expected = features.to_vector({**named, "hour": 13}, 16, 0, max_abs=1e6)
    assert row.context == expected
    assert (row.policy, row.model_version, row.arm_id, row.candidates[0]) == (
        "imported",
        0,
        "salad",
        "pasta",
    )
    assert row.probabilities == [0.2, 0.1, 0.7]
    pasta = features.to_vector({"dish": {"cuisine": "italian"}, "price": 12}, 8, 0, max_abs=1e6)
    assert row.arm_features is not None
    assert row.arm_features["pasta"] == pasta
    assert arms["pasta"] == pasta
    assert reward == 1.0
    assert _counts(shell) == (2, 1, 3)
    assert cli.main(["import", "--dsjson", str(path)]) == 1  # the ids are stored now
    err = capsys.readouterr().err
    assert f"{path}:1: EventId 'ev-1' is already in the database" in err
    assert f"{path}:3: EventId 'ev-2' is already in the database" in err
    assert _counts(shell) == (2, 1, 3)


def test_import_refuses_a_file_with_bad_lines_whole(
    shell: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "good.dsjson"
    good.write_text(_line(EventId="ok-1") + "\n")
    bad = tmp_path / "bad.dsjson"
    lines = [
        _line(EventId="b-1"),
        "{broken",
        _line(EventId="b-3", _label_probability=1.2, p=None),
        _line(EventId="b-4", p=[0.7, 0.3]),
        _line(EventId="b-1"),
        _line(EventId="b-6", a=[1, 2, 2]),
        _line(EventId="b-7", p=[0.7, 0.2, 0.05]),
    ]
    lines += [_line(EventId=f"n-{i}", p=[0.7, 0.3]) for i in range(25)]
    bad.write_text("\n".join(lines) + "\n")
    assert cli.main(["import", "--dsjson", str(bad), str(good)]) == 1
    captured = capsys.readouterr()
    assert f"{bad}:2: not JSON" in captured.err
    assert f"{bad}:3: the chosen action's probability 1.2 is outside (0, 1]" in captured.err
    assert f"{bad}:4: p: 2 probabilities for 3 actions" in captured.err
    assert f"{bad}:5: EventId 'b-1' repeats line 1" in captured.err
    assert f"{bad}:6: a: [1, 2, 2] is not a permutation of 1..3" in captured.err
    assert f"{bad}:7: p sums to 0.95, not 1 (within 0.001)" in captured.err
    assert f"{bad}: ... and 11 more problems" in captured.err
    assert f"{bad}: 31 problems; nothing imported from this file" in captured.err
    assert f"{good}: imported 1 events" in captured.out  # files are imported on their own
    assert _counts(shell) == (1, 1, 3)


def test_import_refuses_dense_vectors_of_another_dimension(
    shell: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    event = {**EVENT, "rofu": {}, "c": {"x": {"0": 1.0}, "_multi": [{"arm": {"id": "a"}}]}}
    event |= {"a": [1], "p": [1.0], "_label_probability": 1.0, "_label_Action": 1}
    event["_labelIndex"] = 0
    path = tmp_path / "dense.dsjson"
    path.write_text(json.dumps(event) + "\n")
    assert cli.main(["import", "--dsjson", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}:1: context: 1 dense values, but this deployment reads 16" in err
    assert "ROFU_CONTEXT_DIM=16" in err
    assert _counts(shell) == (0, 0, 0)
