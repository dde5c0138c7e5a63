"""``inorder validate --jobs``: a whole number of at least 1; one process by default."""

from __future__ import annotations

import pytest

from inorder.cli import build_parser


def test_jobs_is_parsed_and_checked(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    assert parser.parse_args(["validate", "p.toml", "--jobs", "3"]).jobs == 3
    assert parser.parse_args(["validate", "p.toml"]).jobs == 1  # memory first
    for bad in ("0", "-1", "two"):
        with pytest.raises(SystemExit) as exited:
            parser.parse_args(["validate", "p.toml", "--jobs", bad])
        assert exited.value.code == 2
        assert "--jobs" in capsys.readouterr().err


class _HereWorker:
    """This process's share of the tasks: answers at once."""

    def __init__(self) -> None:
        self.ran: list[object] = []

    def run(self, task: object, progress: object = None) -> tuple[str]:
        self.ran.append(task)
        return ("checked",)


def test_a_worker_process_that_dies_is_a_named_error_not_a_trace() -> None:
    # The worker is killed before it answers (as the out-of-memory killer would): the pool
    # breaks, and validate says which task was lost and what to do, as one error line.
    from tests.fixtures.dying_loader import load_and_die

    from inorder.errors import InorderError
    from inorder.ops.validate_pool import Options, _in_pool
    from inorder.records import TopicPartition

    here = _HereWorker()
    options = Options(reference="p.toml", overrides={}, load=load_and_die)
    tps = [TopicPartition("site-a", 0), TopicPartition("site-a", 1), TopicPartition("site-b", 0)]
    with pytest.raises(InorderError) as raised:
        _in_pool(here, None, options, list(tps), 2, None)  # type: ignore[arg-type]
    message = str(raised.value)
    assert message.startswith("validate --jobs 2: the worker process checking topic 'site-a' ")
    assert "ended abruptly" in message and "fewer --jobs" in message
    assert "Traceback" not in message
